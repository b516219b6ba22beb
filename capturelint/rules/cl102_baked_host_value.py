"""CL102 baked-host-value (R2)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from capturelint.findings import Condition, Finding
from capturelint.rules.base import Rule, where

if TYPE_CHECKING:
    from capturelint.analyzer import StepView


class BakedHostValue(Rule):
    code = "CL102"
    name = "baked-host-value"
    condition = Condition.R2
    summary = "A captured op was recorded with a non-tensor argument that differs in the step."
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
        from capturelint.analyzer import iter_pairs
        from capturelint.tracer import scalar_repr

        for al, c, s in iter_pairs(view):
            if c.scalars == s.scalars:
                continue
            diffs = [(a, b) for a, b in zip(c.scalars, s.scalars) if a != b]
            if not diffs:
                diffs = [(("arguments", str(len(c.scalars))), ("arguments", str(len(s.scalars))))]
            (name, cv), (_, sv) = diffs[0]
            cv, sv = scalar_repr(cv), scalar_repr(sv)
            view.tainted.add(c.index)
            message = (
                f"{c.op} in captured segment {view.segment_label(al.index)} at {where(c.frame)} was recorded with "
                f"{name}={cv}, but replay step {view.shadow.step} passes {name}={sv}: replay computes with the capture's "
                f"value. Keep the value in a persistent tensor refreshed in place each step, or compute it inside "
                f"an eager break."
            )
            yield self.finding(view, al.index, c, s, f"argument {name}", message)
