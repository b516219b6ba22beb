"""CL111 pool-memory-shared (R4)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from capturelint.findings import Condition, Finding, Site
from capturelint.rules.base import Rule, where
from capturelint.runtime.protocol import OverwrittenRead

if TYPE_CHECKING:
    from capturelint.analyzer import HazardView
    from capturelint.records import OpRecord, Stream


class PoolMemoryShared(Rule):
    code = "CL111"
    name = "pool-memory-shared"
    condition = Condition.R4
    summary = "Graphs captured into one memory pool overwrite memory that another graph's output still lives in."
    message = (
        "{tensor} (allocated by {op} at {at} in graph {graph}) lives in a block of the memory pool it shares with graph "
        "{writer}, whose capture had freed that block ({freed}) and whose replays still write it: the replay at "
        "{replay_at} overwrote {nbytes} bytes of it, and {read} read them. Replay graphs that share a pool in the "
        "order they were captured and consume each output (clone it) before another graph of the pool replays, or "
        "capture the graphs into separate pools."
    )
    read_note = "{op} at {at}"
    replay_read_note = "the replay of graph {graph} at {at} ({op})"
    freed_note = "{op} at {at}"
    doc = """
    ## What it does
    Models the caching allocator's private pool of every `graph_pool_handle()` (the
    emulated primitive's pool model: 512-byte rounding, small and large pools, best
    fit, blocks freed during a capture reusable by later captures into the same pool
    while live tensors keep theirs). When a graph's replay rewrites a block that a
    later capture placed a live tensor of another graph in, the emulation overwrites
    that tensor as a GPU would; a read of it before its own graph replays again is
    reported, with the tensor, both graphs, the replay line and the read.

    ## Why is this bad?
    Graphs captured with `pool=` (`g1.pool()`, `graph_pool_handle()`, a tuple given
    to `make_graphed_callables`) share memory: a block one capture freed (an
    intermediate, or an output the program dropped) is handed to the next capture,
    but the first graph's replays still write it. PyTorch's documentation: sharing is
    safe only if the graphs "will always be replayed in the same order they were
    captured". Replayed out of order, or with an output kept past another graph's
    replay, the program reads the other graph's values.

    ## Example
    ```python
    with torch.cuda.graph(g1):
        out1 = f1(x1)                       # f1's intermediates are freed here
    with torch.cuda.graph(g2, pool=g1.pool()):
        out2 = f2(x2)                       # out2 may get an intermediate's block
    g2.replay(); g1.replay()                # g1 rewrites out2's memory
    use(out2.clone())
    ```

    ## Use instead
    Replay the graphs of a pool in capture order and consume (clone) each output
    before another graph of the pool replays; or capture graphs whose order varies
    into separate pools (no `pool=`, separate `make_graphed_callables` calls).

    ## Limitations
    Plain `torch.cuda.CUDAGraph` programs only: graphs a breakable runtime owns
    (capturelint's, vLLM's) are not modelled. The model keeps no expandable segments,
    no `max_split_size` and no `roundup_power2_divisions`, and sees a tensor freed
    only when nothing references it (Python garbage in reference cycles lives until
    collected). A read is an op that reads the memory; returning the tensor from
    `run()` without reading it is not one.
    """

    def check_hazard(self, view: HazardView) -> Iterator[Finding]:
        read = view.event
        if not isinstance(read, OverwrittenRead):
            return
        event = read.overwrite
        victim, writer = view.captures.get(event.graph.id), view.captures.get(event.writer.id)
        if victim is None:
            return
        producer = _producer(victim, event.storage)
        tensor = victim.name_of(event.storage, producer.scope if producer else "") or (
            f"output of {producer.op}" if producer else "a graph-pool tensor")
        freed = _producer(writer, event.writer_storage) if writer is not None else None
        if read.reader is not None:
            observed = self.replay_read_note.format(graph=read.reader.label, at=where(read.frame), op=read.op)
        else:
            observed = self.read_note.format(op=read.op, at=where(read.frame))
        message = self.message.format(
            tensor=tensor, op=producer.op if producer else "the capture", at=where(producer.frame if producer else None),
            graph=event.graph.label, writer=event.writer.label,
            freed=self.freed_note.format(op=freed.op, at=where(freed.frame)) if freed else "a block of its capture",
            replay_at=where(event.replay_frame), nbytes=event.nbytes, read=observed,
        )
        site = Site.captured(view.label.runner, view.label.mode, event.graph.label, event.graph.mode, 0)
        yield Finding.of(self, site, op=producer.op if producer else "", scope=producer.scope if producer else None,
                         tensor=tensor, capture_frame=producer.frame if producer else None,
                         shadow_frame=event.replay_frame, message=message,
                         capture_stack=producer.stack if producer else ())


def _producer(capture: Stream, storage: int) -> OpRecord | None:
    origin = capture.origins.get(storage)
    return capture.ops[origin.producer] if origin is not None and origin.producer is not None else None
