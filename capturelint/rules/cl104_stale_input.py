"""CL104 stale-input (R4)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Iterator

from capturelint.findings import Condition, EditLine, Finding, LineRole, Site
from capturelint.rules.base import Rule, where

if TYPE_CHECKING:
    from capturelint.analyzer import Mismatch, RunLabel, StepView
    from capturelint.runtime.protocol import StaleInputEvent
    from capturelint.records import Stream


class StaleInput(Rule):
    code = "CL104"
    name = "stale-input"
    condition = Condition.R4
    summary = "A captured op reads a storage that the step no longer uses: the tensor was re-allocated after capture."
    message = (
        "{op} in captured segment {segment} at {at} {access} {captured} ({arg}) as captured{also}, but replay step "
        "{step} uses {used}: {reason}{allocated}. Replay {access} the stale tensor. Allocate it once and refresh it in "
        "place each step."
    )
    freed_message = (  # a graph without a shadow (a bare CUDA graph)
        "{op} in graph {graph} at {at} reads {name} ({arg}) as captured{also}, but the program dropped that tensor "
        "before a replay{moved}: the graph reads freed memory, which a GPU's allocator hands to other tensors. "
        "Allocate the input once and refresh it in place (static.copy_(new)) before each replay."
    )
    readers_note = " (and {others} more captured op{s} read it)"
    allocated_note = " (the step's tensor is allocated at {at}, in {function})"
    moved_note = "; {name} now holds a new tensor{allocated}"
    freed_allocated_note = ", allocated at {at} ({function})"
    rebound_note = ", re-bound at {at}"
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
    a replay, that the program no longer holds a storage the graph reads. When
    something still holds it (a list, a closure), re-binding the name frees nothing:
    that is CL108.

    ## Limitations
    A tensor that is refreshed in place but with the wrong values is not detected here;
    the numerical oracle catches it (and CL901 reports that no rule did). The line that
    re-allocated the step's tensor is named when the allocation ran between steps,
    where the tracer watches allocations; for a bare graph, the assignment that re-bound
    the name that held the captured tensor is named as CL108 finds it (the source of
    the functions running at the replay), and is the finding's location, else the
    allocation line is.
    """

    def check(self, view: StepView) -> Iterator[Finding]:
        # One finding per stale storage (its first reader), however many ops read it:
        # a re-allocated metadata tensor is one cause, not one per kernel and layer.
        first: dict[int, Mismatch] = {}
        readers: dict[int, int] = {}
        for m in view.locations:
            if m.problem.escaped or m.followon:
                continue
            readers[m.capture_use.storage] = readers.get(m.capture_use.storage, 0) + 1
            first.setdefault(m.capture_use.storage, m)
        for storage, m in first.items():
            c, cu, problem = m.capture_op, m.capture_use, m.problem
            access = "writes" if cu.write else "reads"
            allocated = view.shadow.allocated_at(m.shadow_use.storage)
            note = "" if allocated is None else self.allocated_note.format(at=where(allocated), function=allocated.function)
            message = self.message.format(
                op=c.op, segment=view.segment_label(m.alignment.index), at=where(c.frame), access=access,
                captured=problem.capture_name, arg=cu.arg, also=self._also(readers[storage] - 1), step=view.shadow.step,
                used=problem.shadow_name, reason=problem.reason, allocated=note,
            )
            yield dataclasses.replace(self.finding(view, m.alignment.index, c, m.shadow_op, problem.shadow_name, message),
                                      allocation_frame=allocated,
                                      edit=EditLine(allocated, LineRole.ALLOCATION) if allocated is not None else None)

    def check_stale(self, label: RunLabel, capture: Stream, event: StaleInputEvent) -> Iterator[Finding]:
        readers = [op for op in capture.ops if any(u.storage == event.storage for u in op.inputs)]
        if not readers:
            return
        first = readers[0]
        use = next(u for u in first.inputs if u.storage == event.storage)
        name = event.holder or capture.name_of(event.storage, first.scope) or f"tensor {use.arg} of {first.op}"
        # The name that held the storage at capture holds its replacement now: the
        # runtime's holders say which and where it was re-bound; else the tracer's roots.
        replacement = event.replacement
        if replacement is None:
            replacement = capture.names_now.get(name)
        allocated = capture.allocated_at(replacement) if replacement is not None else None
        at = self.freed_allocated_note.format(at=where(allocated), function=allocated.function) if allocated else ""
        if event.rebound_at is not None and where(event.rebound_at) != where(allocated):  # one line says both
            at += self.rebound_note.format(at=where(event.rebound_at))
        moved = self.moved_note.format(name=name, allocated=at) if replacement is not None else ""
        message = self.freed_message.format(
            op=first.op, graph=capture.graph, at=where(first.frame), name=name, arg=use.arg,
            also=self._also(len(readers) - 1), moved=moved,
        )
        edit = (EditLine(event.rebound_at, LineRole.REBINDING) if event.rebound_at is not None
                else EditLine(allocated, LineRole.ALLOCATION) if allocated is not None else None)
        site = Site.captured(label.runner, label.mode, capture.graph, capture.runtime_mode, event.segment)
        yield Finding.of(self, site, op=first.op, scope=first.scope, tensor=name, capture_frame=first.frame,
                         shadow_frame=None, message=message, allocation_frame=allocated, edit=edit)

    def _also(self, others: int) -> str:
        return self.readers_note.format(others=others, s="s" * (others != 1)) if others else ""
