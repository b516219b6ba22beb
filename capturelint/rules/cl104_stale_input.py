"""CL104 stale-input (R4)."""

from __future__ import annotations

from typing import Iterator

from capturelint.analyzer import StepView
from capturelint.findings import Condition, Finding
from capturelint.rules.base import Rule, where


class StaleInput(Rule):
    code = "CL104"
    name = "stale-input"
    condition = Condition.R4
    summary = "A captured op reads a storage that the step no longer uses: the tensor was re-allocated after capture."
    doc = """
    ## What it does
    For every captured op aligned with the step's op, checks that each tensor argument
    resolves to the same location: a pre-existing tensor (parameter, runner buffer,
    cache, metadata field) must be the *same storage object* at capture and in the
    step; a tensor computed during the forward must come from the aligned producer.
    Storage identity is compared, never raw addresses, so an allocator that hands an
    address back to another tensor cannot hide a moved buffer.

    ## Why is this bad?
    A graph reads frozen pointers. If the runner or a metadata builder allocates a new
    tensor each step, the graph keeps reading the capture step's tensor: stale slot
    mappings, block tables or sequence lengths, with no error (vLLM #37363, #44868;
    TensorRT-LLM #16290; PyTorch #70444).

    ## Example
    ```python
    def build(self, seq_lens):
        return Metadata(slot_mapping=torch.tensor(slots))   # new storage every step
    ```

    ## Use instead
    Allocate persistent buffers once and refresh them in place each step
    (`self.slot_mapping[:n].copy_(slots)`), and hand the graph views of them.

    ## Limitations
    A tensor that is refreshed in place but with the wrong values is not detected here;
    the numerical oracle catches it (and CL901 reports that no rule did).
    """

    def check(self, view: StepView) -> Iterator[Finding]:
        # One finding per stale storage (its first reader), however many ops read it:
        # a re-allocated metadata tensor is one cause, not one per kernel and layer.
        first: dict[int, tuple] = {}
        readers: dict[int, int] = {}
        for al, c, s, cu, su, problem in view.location_problems():
            if problem.escaped:
                continue
            view.tainted.add(c.index)
            if view.is_followon(view.capture, cu):
                continue
            readers[cu.storage] = readers.get(cu.storage, 0) + 1
            first.setdefault(cu.storage, (al, c, s, cu, problem))
        for storage, (al, c, s, cu, problem) in first.items():
            access = "writes" if cu.write else "reads"
            others = readers[storage] - 1
            also = f" (and {others} more captured op{'s' * (others != 1)} read it)" if others else ""
            message = (
                f"{c.op} in captured segment {view.segment_label(al.index)} at {where(c.frame)} {access} "
                f"{problem.capture_name} ({cu.arg}) as captured{also}, but replay step {view.shadow.step} uses "
                f"{problem.shadow_name}: {problem.reason}. Replay {access} the stale tensor. Allocate it once "
                f"and refresh it in place each step."
            )
            yield self.finding(view, al.index, c, s, problem.shadow_name, message)
