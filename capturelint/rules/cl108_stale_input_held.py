"""CL108 stale-input-held (R4, bare graphs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from capturelint.findings import Condition, EditLine, Finding, LineRole, Site
from capturelint.rules.base import Rule, cut, where

if TYPE_CHECKING:
    from capturelint.analyzer import BareView


class StaleInputHeld(Rule):
    code = "CL108"
    name = "stale-input-held"
    condition = Condition.R4
    summary = "A bare graph reads the tensor a name held at capture; the program re-bound the name, and the old tensor lives on."
    message = (
        "{op} in graph {graph} at {at} reads {holder} as captured ({geometry}), but before replay {replay} (at "
        "{replay_at}) the program re-bound {holder} to another tensor{rebound} while the captured one stays alive "
        "({held}) and unwritten since the previous replay: every replay reads the old tensor, never the new one. "
        "Refresh the captured tensor in place (.copy_(new)) instead of re-binding the name, or capture again."
    )
    rebound_note = " at {at}"
    held_note = "held by {holders}"
    held_elsewhere = "held by an object the capture did not find, e.g. make_graphed_callables' static inputs"
    doc = """
    ## What it does
    For a graph used directly (`torch.cuda.CUDAGraph`, `torch.cuda.graph`,
    `make_graphed_callables`), finds at capture end every name that holds one of the
    graph's inputs (instance attributes, module parameters and buffers, list and dict
    slots, globals, locals and closure variables, found from the program's running
    frames without roots) and checks them at each replay: a name that now holds
    another tensor of the same shape and dtype, while the captured tensor is still
    alive and was not written since the previous replay, was re-bound.

    ## Why is this bad?
    The graph reads the memory it captured, not a name. Re-binding the name
    (`self.static_x = batch`) feeds the new tensor to nobody: every replay computes on
    the captured tensor, which something else (a list of past inputs, a closure,
    `make_graphed_callables`' static inputs, an optimizer holding an old parameter)
    keeps alive, so no memory is freed and no error is raised (CL104 reports the case
    where nothing holds it any more).

    ## Example
    ```python
    self.history.append(self.static_x)      # keeps the captured input alive
    self.static_x = batch.clone()           # the graph still reads the old one
    self.graph.replay()
    ```

    ## Use instead
    Refresh the captured tensor in place, `self.static_x.copy_(batch)`, or capture
    the graph again after replacing the tensor (a module's parameter included).

    ## Limitations
    Holders are found from the frames running at capture end, through the program's
    own classes, `nn.Module`s, lists, tuples, dicts and closures (20000 objects at
    most); a holder reachable only through other library objects is not watched. The
    re-binding line is found in the source of the functions running at the replay (or
    the one assignment to the attribute in the holder's class); a list or dict slot is
    named by the line that allocated the new tensor only. A captured tensor written
    through another tensor object over the same memory (not a view of it) counts as
    unwritten.
    """

    def check_bare(self, view: BareView) -> Iterator[Finding]:
        from capturelint.runtime.protocol import HeldInputEvent

        event = view.event
        if not isinstance(event, HeldInputEvent) or not view.readers:
            return
        first, capture = view.readers[0], view.capture
        allocated = capture.allocated_at(event.replacement)
        # the line to change: the re-binding, else the allocation of the new tensor
        edit = (EditLine(event.rebound_at, LineRole.REBINDING) if event.rebound_at is not None
                else EditLine(allocated, LineRole.ALLOCATION) if allocated is not None else None)
        geometry = f"{event.dtype}{list(event.shape)}"
        rebound = self.rebound_note.format(at=where(event.rebound_at)) if event.rebound_at else ""
        held = self.held_note.format(holders=cut(list(event.held_by))) if event.held_by else self.held_elsewhere
        message = self.message.format(
            op=first.op, graph=capture.graph, at=where(first.frame), holder=event.holder, geometry=geometry,
            replay=event.replay, replay_at=where(event.replay_frame), rebound=rebound, held=held,
        )
        site = Site.captured(view.label.runner, view.label.mode, capture.graph, capture.runtime_mode, event.segment)
        yield Finding.of(self, site, op=first.op, scope=first.scope, tensor=event.holder, capture_frame=first.frame,
                         shadow_frame=event.rebound_at, message=message, steps=(event.replay,),
                         allocation_frame=allocated, edit=edit)
