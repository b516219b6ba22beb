"""CL103 baked-shape (R3)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from capturelint.findings import Condition, Finding
from capturelint.rules.base import Rule, where

if TYPE_CHECKING:
    from capturelint.analyzer import StepView


class BakedShape(Rule):
    code = "CL103"
    name = "baked-shape"
    condition = Condition.R3
    summary = "A captured op reads a tensor whose shape, stride, offset or dtype differs in the step."
    message = (
        "{op} in captured segment {segment} at {at} reads {tensor} ({arg}) as {captured} at capture, but replay "
        "step {step} passes {passed}: replay computes over the capture's extent. Pad the tensor to the captured "
        "size, or move the op into an eager break."
    )
    doc = """
    ## What it does
    For every captured op aligned with the step's op, compares the view geometry (shape,
    stride, storage offset, dtype) of each tensor argument, and reports the first tensor
    that differs. Mismatches that follow from an op already reported are not repeated.

    ## Why is this bad?
    Replay launches kernels with the capture's shapes. A step whose tensors are
    shaped differently (an unpadded batch, a view sliced to the real token count, a
    metadata tensor sized by the batch) computes over the wrong extent: rows are
    dropped or stale rows are read (vLLM #23789, SGLang #1789, nano-vllm #190).

    ## Example
    ```python
    hidden = wrapper(runner.input_ids[:num_tokens])   # captured for the padded size
    ```

    ## Use instead
    Pad every graph input to the captured batch size (`input_ids[:padded]`), and size
    metadata tensors by the padded size.

    ## Limitations
    Only aligned ops are compared; a shape that changes which ops run is reported as
    CL101. The geometry of tensors inside eager breaks is not checked (they re-run live).
    """

    def check(self, view: StepView) -> Iterator[Finding]:
        for m in view.geometries:
            if m.followon:
                continue
            al, c, cu, su = m.alignment, m.capture_op, m.capture_use, m.shadow_use
            tensor = view.tensor_name(view.shadow, su, m.shadow_op.scope)
            message = self.message.format(
                op=c.op, segment=view.segment_label(al.index), at=where(c.frame), tensor=tensor, arg=cu.arg,
                captured=cu.describe_geometry(), step=view.shadow.step, passed=su.describe_geometry(),
            )
            yield self.finding(view, al.index, c, m.shadow_op, tensor, message)
