"""CL109 output-overwritten (R7, bare graphs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from capturelint.findings import Condition, EditLine, Finding, LineRole, Site
from capturelint.rules.base import Rule, where

if TYPE_CHECKING:
    from capturelint.analyzer import BareView


class OutputOverwritten(Rule):
    code = "CL109"
    name = "output-overwritten"
    condition = Condition.R7
    summary = "Code reads a graph's output through a reference taken before a later replay rewrote it."
    message = (
        "{op} at {at} reads {tensor} of graph {graph} through a view taken at {taken_at} after replay {taken}, but "
        "replay {next} (at {replay_at}) has rewritten that memory since: it reads a later step's values. Copy the "
        "output when you take it (.clone() right after the replay), or read it before the next replay."
    )
    repeated_message = (
        "{op} at {at} reads {tensor} of graph {graph} {count} times through one list argument: the list holds the "
        "graph's output tensor itself once per step, and each entry reads what the latest replay (replay {replay}, at "
        "{replay_at}) wrote. Append a copy (.clone()) after each replay."
    )
    doc = """
    ## What it does
    For a graph used directly (`torch.cuda.CUDAGraph`), follows the graph's memory
    between steps: every view of it that the program makes after a replay (a slice,
    a reshape, an `unbind`) is marked with that replay. An eager op that reads the
    values of such a view after the graph has replayed again, when the view was not
    read after the previous replay, is reported, with the line that took the view and
    the replay that overwrote it; so is an op whose list argument holds the graph's
    output tensor itself more than once (`torch.stack` of a list that collected it
    after each replay).

    ## Why is this bad?
    A graph's outputs live in graph memory, and each replay rewrites it. A reference
    kept across a replay (collected in a list and stacked later, returned by `run()`
    and used after the next call) reads the later step's values, silently.

    ## Example
    ```python
    for batch in batches:
        static_x.copy_(batch)
        graph.replay()
        outs.append(static_y[:n])          # a view of graph memory
    torch.stack(outs)                      # every entry holds the last step
    ```

    ## Use instead
    Copy the output right after the replay (`outs.append(static_y[:n].clone())`), or
    finish reading it before the next replay.

    ## Limitations
    References are followed by tensor object: the graph's output tensor itself, a view
    made before the first replay and a view read after every replay are handles, read
    for the latest replay (the usual idiom, `replay(); y.clone()`). So keeping the
    output tensor across a replay and reading it alone is not reported (a list holding
    it several times is), nor is a view read once before the next replay and again
    after it. A view made before the replay it is meant to read (`v = y[:n];
    g.replay(); v.clone()`) is reported: make it after the replay. Memory that another
    graph's replay overwrites (a pool shared between graphs) is not this rule's.
    """

    def check_bare(self, view: BareView) -> Iterator[Finding]:
        from capturelint.records import GraphMemoryRead, ReadKind

        event = view.event
        if not isinstance(event, GraphMemoryRead) or event.kind is ReadKind.UNREPLAYED:
            return
        capture, tensor = view.capture, view.tensor_name()
        if event.kind is ReadKind.OVERWRITTEN:
            message = self.message.format(
                op=event.op, at=where(event.frame), tensor=tensor, graph=capture.graph, taken_at=where(event.taken_frame),
                taken=event.taken, next=event.taken + 1, replay_at=where(event.replay_frame),
            )
        else:
            message = self.repeated_message.format(
                op=event.op, at=where(event.frame), tensor=tensor, graph=capture.graph, count=event.count,
                replay=event.replay, replay_at=where(event.replay_frame),
            )
        producer = view.producer
        # the line to change: where the stale view was taken (clone it there); a list
        # that holds the output several times was filled elsewhere: the read stays
        edit = (EditLine(event.taken_frame, LineRole.VIEW)
                if event.kind is ReadKind.OVERWRITTEN and event.taken_frame is not None else None)
        site = Site.captured(view.label.runner, view.label.mode, capture.graph, capture.runtime_mode, 0)
        yield Finding.of(self, site, op=event.op, scope=producer.scope if producer else None, tensor=tensor,
                         capture_frame=producer.frame if producer else None, shadow_frame=event.frame, message=message,
                         steps=(event.replay,), edit=edit)
