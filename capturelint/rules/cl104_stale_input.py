"""CL104 stale-input (R4)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Iterator

from capturelint.findings import Condition, Finding
from capturelint.rules.base import Rule, where

if TYPE_CHECKING:
    from capturelint.analyzer import RunLabel, StepView
    from capturelint.runtime.protocol import StaleInputEvent
    from capturelint.tracer import Stream


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

    For a bare CUDA graph (``torch.cuda.CUDAGraph`` used directly, with no eager
    shadow of its steps) the emulated graph reports the same hazard when it finds, at
    a replay, that the program no longer holds a storage the graph reads.

    ## Limitations
    A tensor that is refreshed in place but with the wrong values is not detected here;
    the numerical oracle catches it (and CL901 reports that no rule did). The line that
    re-allocated the step's tensor is named when the allocation ran between steps,
    where the tracer watches allocations.
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
            first.setdefault(cu.storage, (al, c, s, cu, su, problem))
        for storage, (al, c, s, cu, su, problem) in first.items():
            access = "writes" if cu.write else "reads"
            others = readers[storage] - 1
            also = f" (and {others} more captured op{'s' * (others != 1)} read it)" if others else ""
            message = (
                f"{c.op} in captured segment {view.segment_label(al.index)} at {where(c.frame)} {access} "
                f"{problem.capture_name} ({cu.arg}) as captured{also}, but replay step {view.shadow.step} uses "
                f"{problem.shadow_name}: {problem.reason}. Replay {access} the stale tensor. Allocate it once "
                f"and refresh it in place each step."
            )
            allocated = view.shadow.allocated_at(su.storage)
            if allocated is not None:
                message += f" The step's tensor is allocated at {where(allocated)} ({allocated.function})."
            yield dataclasses.replace(self.finding(view, al.index, c, s, problem.shadow_name, message),
                                      allocation_frame=allocated)

    def check_stale(self, label: RunLabel, capture: Stream, event: StaleInputEvent) -> Iterator[Finding]:
        readers = [op for op in capture.ops if any(u.storage == event.storage for u in op.inputs)]
        if not readers:
            return
        first = readers[0]
        use = next(u for u in first.inputs if u.storage == event.storage)
        name = capture.name_of(event.storage, first.scope) or f"tensor {use.arg} of {first.op}"
        # The attribute that held the storage at capture holds its replacement now.
        holder = name if name in capture.names_now else None
        replacement = capture.names_now.get(holder) if holder else None
        allocated = capture.allocated_at(replacement) if replacement is not None else None
        others = len(readers) - 1
        also = f" (and {others} more captured op{'s' * (others != 1)} read it)" if others else ""
        moved = f"; {name} now holds a new tensor" + (f", allocated at {where(allocated)} ({allocated.function})" if allocated else "")
        message = (
            f"{first.op} in graph {capture.graph} at {where(first.frame)} reads {name} ({use.arg}) as captured{also}, "
            f"but the program dropped that tensor before a replay{moved}: the graph reads freed "
            f"memory, which a GPU's allocator hands to other tensors. Allocate the input once and refresh it in "
            f"place (static.copy_(new)) before each replay."
        )
        seg = f"{capture.graph} #{event.segment} captured"
        yield Finding(self.code, self.name, self.condition, label.runner, label.mode, capture.graph, capture.runtime_mode,
                      seg, event.segment, first.op, first.scope or "<top>", name, first.frame, None, message,
                      allocation_frame=allocated)

