"""CL105 escaped-eager-output (R4)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from capturelint.findings import Condition, Finding
from capturelint.rules.base import Rule, where

if TYPE_CHECKING:
    from capturelint.analyzer import StepView


class EscapedEagerOutput(Rule):
    code = "CL105"
    name = "escaped-eager-output"
    condition = Condition.R4
    summary = "A captured op reads a tensor that an eager break allocated and the runtime does not copy back."
    message = (
        "{op} in captured segment {segment} at {at} reads {tensor}: {reason}. On replay the break allocates a new "
        "tensor and the graph reads the capture's. Return it from the break, or write it in place into a "
        "pre-existing buffer."
    )
    doc = """
    ## What it does
    Finds captured ops that read a storage allocated inside an eager break, where that
    storage is not a return value of the break that the capture runtime copies back into
    its capture-time tensor.

    ## Why is this bad?
    On replay the break runs again and allocates a *new* tensor; the graph still reads
    the one allocated at capture, so downstream captured segments read stale memory
    (PyTorch #114844 `self.x = res`, SGLang #27746, TensorRT-LLM #13354). With a runtime
    that discards break return values (vLLM's older breakable graph), even returned
    tensors escape.

    ## Example
    ```python
    @eager_break_during_capture
    def route(self, x):
        self.weights = torch.softmax(self.gate(x), -1)   # fresh tensor each call
    ...
    y = x * self.weights                                  # captured: reads the capture's
    ```

    ## Use instead
    Return the tensor from the break (with a runtime that copies returns back), or write
    the result in place into a pre-existing buffer (`self.weights.copy_(...)`).

    ## Limitations
    Tensors stored outside the traced forward (a host-side cache the break fills
    without a torch op) are invisible to the tracer.
    """

    def check(self, view: StepView) -> Iterator[Finding]:
        for m in view.locations:
            if m.problem.escaped:
                c, problem = m.capture_op, m.problem
                message = self.message.format(op=c.op, segment=view.segment_label(m.alignment.index), at=where(c.frame),
                                              tensor=problem.capture_name, reason=problem.reason)
                yield self.finding(view, m.alignment.index, c, m.shadow_op, problem.capture_name, message)
