"""CL110 capture-output-consumed (R7, bare graphs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from capturelint.findings import Condition, Finding, Site
from capturelint.rules.base import Rule, where

if TYPE_CHECKING:
    from capturelint.analyzer import BareView


class CaptureOutputConsumed(Rule):
    code = "CL110"
    name = "capture-output-consumed"
    condition = Condition.R7
    summary = "Code uses what a capture call returned as a result: a capture records kernels without running them."
    message = (
        "{op} at {at} reads {tensor} of graph {graph} before any replay wrote it: a capture records kernels without "
        "running them, so what the capture call returned is uninitialised memory on a GPU (NaN here). Replay the "
        "graph after capturing (graph.replay()) and read the output then, or run the first step eagerly."
    )
    doc = """
    ## What it does
    For a graph used directly (`torch.cuda.CUDAGraph`, `torch.cuda.graph`), marks the
    memory its capture allocated (its outputs and intermediates) as unwritten, and
    clears the mark when a replay of the graph, or an eager op, writes it. An eager op
    outside every capture that reads the values of marked memory is reported, with the
    captured op that produced it and the line that read it. On a breakable graph
    (capturelint's runtime, vLLM's) the same holds for the outputs its captured segments
    computed, until its first replay: the call that captures returns them. Engines read
    a capture pass's discarded outputs knowingly (vLLM's dummy runs index them), so on a
    breakable graph such a read is reported only where the run's result diverged from
    its eager twin by a non-finite error: the emulator fills a capture's float memory
    with poison (NaN), so that error is the poison in the result (a finite divergence
    has another cause; without a twin it is not reported). On a bare graph it is
    reported unless an eager twin was compared and agreed, which shows the value read
    never reached the result (vLLM V1's FULL capture loop indexes the captured output
    and discards it).

    ## Why is this bad?
    On a GPU a capture records kernels into the graph without running them: the
    tensors the captured code returns hold whatever the allocator's memory held.
    Code that captures lazily on the first real step and returns that step's
    "result" (no warm-up, no replay) hands garbage downstream, and only on the
    first step, so it looks like a flaky warm-up glitch.

    ## Example
    ```python
    def step(self, x):
        if self.graph is None:
            self.static_x.copy_(x)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.static_y = self.model(self.static_x)
            return self.static_y.clone()          # never computed
        ...
    ```

    ## Use instead
    Replay right after capturing (`self.graph.replay()`) and read the output then,
    or compute the first step eagerly and capture on a warm-up batch.

    ## Limitations
    Any eager write to a storage counts as rewriting all of it, and an op that writes
    a storage in place (`y.add_(1)`) is not counted as reading it. The twin decides
    whether a read reached the result, not a trace of the value read: a read whose value
    reaches only what the twin does not compare, or a poisoned integer (0) that equals
    the real one, is not reported where the twin agrees. Reads inside
    another capture are not reported (they run at that graph's replays). A device-to-
    host copy the emulator cannot see as an op (none on a CPU) is not reported.
    """

    def check_bare(self, view: BareView) -> Iterator[Finding]:
        from capturelint.records import GraphMemoryRead, ReadKind

        event = view.event
        if not isinstance(event, GraphMemoryRead) or event.kind is not ReadKind.UNREPLAYED:
            return
        capture, tensor, producer = view.capture, view.tensor_name(), view.producer
        message = self.message.format(op=event.op, at=where(event.frame), tensor=tensor, graph=capture.graph)
        site = Site.captured(view.label.runner, view.label.mode, capture.graph, capture.runtime_mode, 0)
        yield Finding.of(self, site, op=event.op, scope=producer.scope if producer else None, tensor=tensor,
                         capture_frame=producer.frame if producer else None, shadow_frame=event.frame, message=message)
