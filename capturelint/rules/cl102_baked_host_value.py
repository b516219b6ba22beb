"""CL102 baked-host-value (R2)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from capturelint.records import scalar_repr
from capturelint.findings import Condition, Finding
from capturelint.rules.base import Rule, where

if TYPE_CHECKING:
    from capturelint.analyzer import StepView


class BakedHostValue(Rule):
    code = "CL102"
    name = "baked-host-value"
    condition = Condition.R2
    summary = "A captured op was recorded with a non-tensor argument that differs in the step."
    message = (
        "{op} in captured segment {segment} at {at} was recorded with {name}={captured}, but replay step {step} "
        "passes {name}={passed}: replay computes with the capture's value. Keep the value in a persistent tensor "
        "refreshed in place each step, or compute it inside an eager break."
    )
    doc = """
    ## What it does
    For every captured op aligned with the step's op, compares the non-tensor arguments
    (ints, floats, bools, lists, dtypes, devices) and reports the first that differs.

    ## Why is this bad?
    A graph freezes launch arguments. A Python number read from the forward context, a
    sequence length taken on the host or a scale computed in Python is the capture
    step's value forever: replay computes with it on every later step (flashinfer
    #4647, SGLang #21987).

    ## Example
    ```python
    scale = get_forward_context().attn_metadata["scale"]   # a Python float
    out = x * scale                                         # captured: scale is baked
    ```

    ## Use instead
    Keep per-step values in tensors that live in persistent buffers and are refreshed in
    place before each step (`buf.fill_(scale)`; `out = x * buf`), or compute with them
    inside an eager break.

    ## Limitations
    Floats are compared exactly (a replay re-issues the same bits). Arguments are compared only on ops
    that align; after a control-flow divergence (CL101) the rest of the segment is not
    compared.
    """

    def check(self, view: StepView) -> Iterator[Finding]:
        for m in view.host_values:
            al, c, s = m.alignment, m.capture_op, m.shadow_op
            diffs = [(a, b) for a, b in zip(c.scalars, s.scalars) if a != b]
            if not diffs:
                diffs = [(("arguments", str(len(c.scalars))), ("arguments", str(len(s.scalars))))]
            (name, cv), (_, sv) = diffs[0]
            message = self.message.format(
                op=c.op, segment=view.segment_label(al.index), at=where(c.frame), name=name, captured=scalar_repr(cv),
                step=view.shadow.step, passed=scalar_repr(sv),
            )
            yield self.finding(view, al.index, c, s, f"argument {name}", message)
