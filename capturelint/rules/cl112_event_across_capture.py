"""CL112 event-across-capture (R5)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from capturelint.findings import Condition, Finding, Site
from capturelint.rules.base import Rule, where
from capturelint.runtime.protocol import StreamCaptureEvent, StreamHazard

if TYPE_CHECKING:
    from capturelint.analyzer import HazardView


class EventAcrossCapture(Rule):
    code = "CL112"
    name = "event-across-capture"
    condition = Condition.R5
    summary = ("An event or a side stream crosses a capture boundary: a wait across it, a fork not joined, work on "
               "a stream outside the capture, or a side stream's tensor freed without record_stream.")
    message = (  # one per StreamHazard
        "{op} at {second} waits on an event recorded in captured segment {segment} at {first}, from {outside}: "
        "CUDA refuses a wait across a capture boundary (the capture fails with an invalid-argument or "
        "stream-capture-isolation error, vLLM #56785). Record the event and wait on it inside one captured segment, "
        "or do both in the eager code."
    )
    into_message = (
        "{op} at {second} makes {stream}, capturing segment {segment}, wait on an event recorded outside the capture "
        "at {first}: CUDA refuses a dependency from outside a capture into it (cudaErrorStreamCaptureIsolation). "
        "Fork side streams from the capture stream inside the capture, and synchronize with earlier work before "
        "the capture begins."
    )
    host_message = (
        "{op} at {second} makes the host wait on an event recorded in captured segment {segment} at {first}: a "
        "captured event does not run at capture, and CUDA refuses to synchronize with or query it. Wait on it from a "
        "stream inside the same capture, or after the graph has replayed."
    )
    unjoined_message = (
        "{stream} was forked into captured segment {segment} at {first} and not joined back before the capture ended "
        "at {second}: cudaStreamEndCapture fails (cudaErrorStreamCaptureUnjoined). Make the capture stream wait on "
        "it (torch.cuda.current_stream().wait_stream(side)) before the segment ends."
    )
    freed_message = (
        "{op} at {first} reads {tensor} on {stream} in captured segment {segment}, and the tensor is freed "
        "without record_stream: the allocator hands its memory to the allocation at {second}, on a stream that has "
        "not waited on {stream}, so on replay the side stream's read races the new writes. Call "
        "tensor.record_stream(side) after the side stream uses it, or join the side stream before the tensor is freed."
    )
    uncaptured_message = (
        "{op} at {first} runs on {stream}, which takes no part in captured segment {segment} (begun at {second}): on a "
        "GPU the kernel runs once, eagerly, and is not in the graph, so replays skip it (on the legacy default stream "
        "CUDA refuses it). Fork the stream from the capture stream (side.wait_stream(torch.cuda.current_stream())) "
        "and join it back before the capture ends."
    )
    other_capture_note = "captured segment {other} (another capture)"
    no_capture_note = "outside any capture (an eager break, or after the graph)"
    doc = """
    ## What it does
    Follows streams and events through captures as CUDA does: which capture recorded
    an event, which streams a capture forked (a stream joins a capture by waiting on
    one of its events) and whether they were joined back, which graph-pool tensors a
    side stream read. The emulated primitive refuses what CUDA refuses at capture,
    naming both lines: a wait on an event across a capture boundary (recorded in a
    captured segment and waited on in an eager break, after the graph or in another
    segment; recorded outside and waited on by a capturing stream; synchronized or
    queried by the host), and a capture that ends with a forked stream not joined
    back. It also reports, without stopping the run, work issued during a capture on
    a stream that was never forked into it, and a tensor a side stream read in a
    capture that is freed without `record_stream` and whose memory the allocator hands
    to a stream that has not waited on the side stream.

    ## Why is this bad?
    A capture records work without running it: an event recorded in a capture stands
    for a graph node, not for completed work, and replaying the graph does not record
    it again (unless it was made with `torch.cuda.Event(external=True)`), so CUDA
    refuses waits on it from outside the capture, before or after a replay (vLLM #56785: an indexer's event recorded in a piecewise segment and
    waited on after an eager break, `cudaErrorInvalidValue` at capture), and
    `cudaStreamEndCapture` fails with `cudaErrorStreamCaptureUnjoined` while a forked
    stream is not joined. Work on a stream that never branched out from the capture
    stream is not captured at all (PyTorch's "Usage with multiple streams": "does not
    branch out from or rejoin initial stream"): it runs once and replays skip it.
    Without `record_stream`, the caching allocator reuses a freed block at once on its
    stream; in a capture the later kernel and the side stream's read become a race in
    every replay.

    ## Example
    ```python
    self.ready.record()                     # inside a captured segment
    ...
    @eager_break_during_capture
    def convert(self, x):
        self.side.wait_event(self.ready)     # in the eager break: refused
    ```

    ## Use instead
    Record and wait inside the same captured segment (or both in the eager break);
    fork a side stream inside the capture with `side.wait_stream(current)` and join it
    with `current.wait_stream(side)` before the segment ends; call
    `t.record_stream(side)` for tensors a side stream reads.

    ## Limitations
    Streams run one after another on a CPU: a missing wait between two streams that
    CUDA would not refuse is seen only where it frees memory (`record_stream`).
    Work on a stream outside the capture is reported but still replayed by the
    emulation, so only the rule, not the numerical oracle, sees it.
    The capture stops at the first wait or fork CUDA refuses, so only the first is
    reported per run; fix it and run again.
    """

    def check_hazard(self, view: HazardView) -> Iterator[Finding]:
        e = view.event
        if not isinstance(e, StreamCaptureEvent):
            return
        graph = e.graph.label if e.graph is not None else ""
        segment = f"{graph} #{e.segment} captured" if e.graph is not None else ""
        tensor = self._tensor(view, e)
        fields = {"op": e.op, "first": where(e.first), "second": where(e.second), "segment": segment or "of a capture",
                  "stream": e.stream, "tensor": tensor}
        if e.kind is StreamHazard.WAIT_OUTSIDE:
            outside = (self.other_capture_note.format(other=f"{e.other.label} #{e.other_segment} captured")
                       if e.other is not None else self.no_capture_note)
            message = self.message.format(outside=outside, **fields)
        elif e.kind is StreamHazard.WAIT_INTO:
            message = self.into_message.format(**fields)
        elif e.kind is StreamHazard.HOST_WAIT:
            message = self.host_message.format(**fields)
        elif e.kind is StreamHazard.UNJOINED:
            message = self.unjoined_message.format(**fields)
        elif e.kind is StreamHazard.UNCAPTURED:
            message = self.uncaptured_message.format(**fields)
        else:
            message = self.freed_message.format(**fields)
        site = Site(view.label.runner, view.label.mode, graph, e.graph.mode if e.graph is not None else "", segment,
                    e.segment)
        yield Finding.of(self, site, op=e.op, scope=None, tensor=tensor, capture_frame=e.first, shadow_frame=e.second,
                         message=message)

    @staticmethod
    def _tensor(view: HazardView, e: StreamCaptureEvent) -> str | None:
        """The tensor a side stream read (``FREED_IN_USE``): its name, or the op that made it."""
        capture = view.captures.get(e.graph.id) if e.storage is not None and e.graph is not None else None
        if capture is None:
            return None if e.storage is None else "a graph-pool tensor"
        origin = capture.origins.get(e.storage)
        producer = capture.ops[origin.producer] if origin is not None and origin.producer is not None else None
        return capture.name_of(e.storage) or (
            f"the output of {producer.op} at {where(producer.frame)}" if producer else "a graph-pool tensor")
