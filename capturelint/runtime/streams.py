"""Stream and event stand-ins with the capture bookkeeping CUDA keeps.

Work is sequential on a CPU; what is emulated is what a capture sees of streams and
events (``runtime.emulated``'s docstring, **Streams and events, as a capture sees
them**): which capture a stream takes part in, the forks and joins, and the waits
CUDA refuses across a capture boundary (``StreamCaptureError``). ``stream_stack`` is
the current stream of the block (its last entry); ``ticks`` orders the work of the
streams that take part in captures.

The module sits below the graph it serves (``runtime.cudagraph``): a capture here is
an ``EmulatedCUDAGraph``, typed ``Any``, known by what it exposes.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from typing import Any, Iterator

import torch

from capturelint.runtime import frames, protocol


# ------------------------------------------------------------ streams and events


ticks = itertools.count(1)  # orders the work of streams taking part in captures


class EmulatedStream:
    """A stream stand-in. Work is sequential on a CPU, so waits only keep the capture
    bookkeeping CUDA keeps (``runtime.emulated``'s docstring, **Streams and events**): which capture
    the stream takes part in (``_capture``), when it last did work there (``_tick``),
    and up to when it has waited on each other stream (``_seen``). The bookkeeping is
    private: break arguments that hold a stream compare its public attributes only."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any):
        self.device = torch.device("cpu")
        self.priority = priority
        self._capture: Any = None
        self._tick = 0
        self._seen: dict[EmulatedStream, int] = {}
        self._made_at = frames.user_frame(2)
        self._label: str | None = None

    def describe(self) -> str:
        return self._label or f"the stream made at {self._made_at.location}"

    def wait_stream(self, stream: Any) -> None:
        stream.record_event()._waited(self, frames.user_frame(2), "Stream.wait_stream")

    def wait_event(self, event: Any) -> None:
        event._waited(self, frames.user_frame(2), "Stream.wait_event")

    def record_event(self, event: Any = None) -> "EmulatedEvent":
        event = event if event is not None else EmulatedEvent()
        event.record(self)
        return event

    def synchronize(self) -> None: ...

    def query(self) -> bool:
        return True

    def __enter__(self) -> "EmulatedStream":
        stream_stack.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        stream_stack.pop()

    @property
    def cuda_stream(self) -> int:
        return id(self)


class EmulatedEvent:
    """An event stand-in that remembers where it was recorded: on which stream, in
    which capture (``capture``: a captured record, which replays do not record again;
    until the event is recorded outside a capture), at which line. Waiting on it across a capture boundary raises
    ``StreamCaptureError`` as CUDA refuses it (``runtime.emulated``'s docstring)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 external: bool = False):
        self._external = external  # captured as event record/wait nodes (cudaEventWaitExternal)
        self._recorded = False
        self._capture: Any = None  # a weak reference to the capture that recorded it
        self._stream: EmulatedStream | None = None
        self._tick = 0
        self._seen: dict[EmulatedStream, int] = {}
        self._frame = protocol.UNKNOWN_FRAME

    @property
    def capture(self) -> Any:
        return self._capture() if self._capture is not None else None

    @capture.setter
    def capture(self, graph: Any) -> None:
        self._capture = weakref.ref(graph) if graph is not None else None

    def record(self, stream: Any = None) -> None:
        stream = stream if stream is not None else stream_stack[-1]
        self._recorded, self._stream, self.capture = True, stream, None if self._external else stream._capture
        self._frame = frames.user_frame(2)
        if stream._capture is not None:
            stream._tick = self._tick = next(ticks)
        else:
            self._tick = stream._tick
        self._seen = {**stream._seen, stream: self._tick}

    def wait(self, stream: Any = None) -> None:
        self._waited(stream if stream is not None else stream_stack[-1], frames.user_frame(2), "Event.wait")

    def _waited(self, stream: EmulatedStream, frame: protocol.Frame, op: str) -> None:
        """``stream`` waits on this event at ``frame``: a dependency inside one capture
        (a fork when ``stream`` was not capturing yet), or one CUDA refuses."""
        if not self._recorded:
            return  # waiting on an event never recorded is a no-op
        mine, theirs = self.capture, stream._capture
        if mine is None and theirs is not None and not self._external:
            self._refused(protocol.StreamHazard.WAIT_INTO, frame, op, stream, theirs)
        if mine is not None and (not mine.capturing or (theirs is not None and theirs is not mine)):
            self._refused(protocol.StreamHazard.WAIT_OUTSIDE, frame, op, stream, theirs)
        if mine is not None and theirs is None:  # a fork: the stream joins the capture
            stream._capture, stream._seen, stream._tick = mine, {}, next(ticks)
            mine._forks.setdefault(stream, frame)
        for s, tick in self._seen.items():
            if stream._seen.get(s, -1) < tick:
                stream._seen[s] = tick

    def _refused(self, kind: protocol.StreamHazard, frame: protocol.Frame, op: str, stream: EmulatedStream,
                 theirs: Any) -> None:
        recorder = self.capture if self.capture is not None else theirs
        info, segment = recorder.where if recorder is not None else (None, 0)
        other, other_segment = theirs.where if theirs is not None and theirs is not recorder else (None, 0)
        raise protocol.StreamCaptureError(protocol.StreamCaptureEvent(
            kind, self._frame, frame, info, segment, other, other_segment, op, stream.describe()))

    def _host_wait(self, op: str) -> None:
        if self._recorded and self.capture is not None:
            info, segment = self.capture.where
            raise protocol.StreamCaptureError(protocol.StreamCaptureEvent(
                protocol.StreamHazard.HOST_WAIT, self._frame, frames.user_frame(3), info, segment, op=op,
                stream=self._stream.describe()))

    def synchronize(self) -> None:
        self._host_wait("Event.synchronize")

    def query(self) -> bool:
        self._host_wait("Event.query")
        return True

    def elapsed_time(self, end: "EmulatedEvent") -> float:
        self._host_wait("Event.elapsed_time")
        return 0.0


_default_stream = EmulatedStream()
_default_stream._label = "the default stream"
stream_stack: list[EmulatedStream] = [_default_stream]


def current_stream(device: Any = None) -> EmulatedStream:
    return stream_stack[-1]


def default_stream(device: Any = None) -> EmulatedStream:
    return _default_stream


def set_stream(stream: Any) -> None:
    stream_stack[-1] = stream


@contextlib.contextmanager
def stream(s: Any) -> Iterator[Any]:
    stream_stack.append(s if s is not None else stream_stack[-1])
    try:
        yield s
    finally:
        stream_stack.pop()


def synchronize(device: Any = None) -> None: ...

