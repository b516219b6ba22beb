"""Breakable CUDA-graph capture: captured segments with eager breaks between them.

**Idea.** A model forward is captured once per batch descriptor and replayed on later
steps. Code that cannot be replayed (it reads the forward context, or launches kernels
whose arguments change per step) is marked with ``@eager_break_during_capture``: at
capture it ends the current captured segment, runs, is recorded as a callable, and a
new captured segment begins. Replay runs the segments in order: captured segments
replay their graph (same op, same arguments, same shapes, same storages, no Python),
eager segments call the break function again with the *capture-time* arguments; its
Python re-runs and reads the current forward context. When an observer shadows the
step, the break's Python has already run once in the shadow, and the replay reuses that
call (``protocol.run_or_reuse``) rather than running it a second time: host state a break keeps
advances once per step, as without the observer.

**What is built.** ``BreakableGraph`` (one capture and its segments, each captured
segment one CUDA-graph primitive: ``torch.cuda.CUDAGraph`` with the ``cuda`` backend,
``EmulatedCUDAGraph`` with the ``emulated`` one, which has a GPU's capture semantics on
a CPU: see ``capturelint.runtime.emulated``), ``CUDAGraphWrapper`` (captures on first
sight of a batch descriptor, replays after), and the announcements of
``capturelint.runtime.protocol`` through which observers hear segment boundaries,
break calls and would-be breaks that run inline. The runtime never imports an analyzer.

**Invariants users must keep.**

**Captured code must not depend on host state.** Anything a captured segment computes
from Python values (the forward context, a tensor's value read on the host, a list
length) is frozen at capture. Put such code inside an eager break.

**Break outputs reach the graph through static buffers.** With
``break_outputs=BreakOutputs.COPY`` (the default, as vLLM's newer runtime does) tensors returned by
a break are copied back on replay into the tensors the break returned at capture, so
downstream captured ops read fresh values. Anything else a break allocates (``self.x =
torch.empty(...)``) escapes: at replay the break allocates a new tensor and the graph
still reads the old one. With ``BreakOutputs.DISCARD`` (vLLM 0.33.0's ``add_eager``)
return values are discarded as well: write results in place into a pre-existing buffer.

**Break arguments are frozen.** On replay a break receives the capture-time arguments.
A tensor that the caller rebuilds per step must be read from the forward context or a
persistent buffer inside the break, not passed in.

**No host synchronisation inside a captured segment.** ``.item()``, ``.tolist()``,
``nonzero`` and boolean-mask indexing need the value on the host; a GPU capture fails on
them, and so does the emulated backend, with the op and the source line.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import threading
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_map

from capturelint.runtime import frames, protocol
from capturelint.runtime.cudagraph import EmulatedCUDAGraph
from capturelint.runtime.forward_context import (
    BatchDescriptor,
    CUDAGraphMode,
    get_forward_context,
    has_forward_context,
)
from capturelint.runtime.lifetimes import BorrowedTensors, poison_freed
from capturelint.runtime.pool import graph_pool_handle
from capturelint.runtime.protocol import (  # noqa: F401  (re-exported: the runtime's vocabulary)
    BreakCall,
    BreakOutputs,
    CaptureObserver,
    Frame,
    GraphInfo,
    HostSyncEvent,
    HostSyncInCaptureError,
    Phase,
    SegmentInfo,
    SegmentKind,
    add_observer,
    flatten_tensors,
    observing,
    remove_observer,
)


class GraphBackend(enum.Enum):
    EMULATED = "emulated"
    CUDA = "cuda"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, text: str) -> "GraphBackend":
        try:
            return cls(text.lower())
        except ValueError:
            raise ValueError(f"unknown graph backend {text!r}; use emulated or cuda") from None


_state = threading.local()


def _active_capture() -> "BreakableGraph | None":
    return getattr(_state, "capture", None)


def _inline_depth() -> int:
    return getattr(_state, "inline_depth", 0)


def current_phase() -> Phase:
    """The phase of the innermost graph activity on this thread."""
    return getattr(_state, "phase", Phase.EAGER)


def positional_params(fn: Callable) -> tuple[str, ...]:
    """The names of ``fn``'s positional parameters (``()`` where it has no signature)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return ()
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return tuple(p.name for p in sig.parameters.values() if p.kind in kinds)


def eager_break_during_capture(fn: Callable) -> Callable:
    """Mark ``fn`` as an eager break of a breakable graph.

    Outside a capture, in a FULL capture, or while already inside a break, ``fn`` runs
    inline and the call is announced as a would-be break; during a PIECEWISE capture
    it becomes an eager segment (``BreakableGraph.add_eager``).
    """
    name = fn.__qualname__
    params = positional_params(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        cap = _active_capture()
        frame = frames.user_frame(2) if protocol.has_observers() else protocol.UNKNOWN_FRAME
        if cap is None or not cap.info.breaks_eager or not cap.capturing:
            return _run_inline(name, params, frame, fn, args, kwargs)
        return cap.add_eager(name, fn, args, kwargs, params, frame)

    wrapper.__capturelint_break__ = name  # type: ignore[attr-defined]
    return wrapper


def _run_inline(name: str, params: tuple[str, ...], frame: Frame, fn: Callable, args: tuple, kwargs: dict) -> Any:
    depth = _inline_depth()
    call = BreakCall(name, args, kwargs, current_phase(), True, depth, params, frame)
    protocol.announce("on_break_enter", call)
    _state.inline_depth = depth + 1
    shadow = getattr(_state, "shadow", None)
    # In the shadow of a piecewise graph an outermost break is an eager segment: on a
    # GPU no stream is capturing while it runs.
    outside = shadow is not None and shadow.breaks_eager and depth == 0
    try:
        if outside:
            with protocol.suspended_capture():
                result = fn(*args, **kwargs)
        else:
            result = fn(*args, **kwargs)
    finally:
        _state.inline_depth = depth
    protocol.announce("on_break_exit", call, result)
    return result


def _new_primitive(backend: GraphBackend) -> Any:
    return EmulatedCUDAGraph() if backend is GraphBackend.EMULATED else torch.cuda.CUDAGraph()


# --------------------------------------------------------------------------- segments


@dataclasses.dataclass
class CapturedSegment:
    index: int
    graph: Any = None  # the CUDA-graph primitive
    kind: SegmentKind = SegmentKind.CAPTURED
    name: str | None = None

    @property
    def num_calls(self) -> int:
        return getattr(self.graph, "num_calls", 0)


@dataclasses.dataclass
class EagerSegment:
    index: int
    name: str
    fn: Callable
    args: tuple
    kwargs: dict
    outputs: list[torch.Tensor] = dataclasses.field(default_factory=list)
    kind: SegmentKind = SegmentKind.EAGER
    params: tuple[str, ...] = ()
    frame: Frame = protocol.UNKNOWN_FRAME
    borrowed: BorrowedTensors | None = None  # emulated: the arguments, held as a GPU runtime holds them
    poisoned: set = dataclasses.field(default_factory=set)


_graph_ids = iter(range(1, 1 << 62))


class BreakableGraph:
    """One captured forward: an alternating list of captured and eager segments."""

    def __init__(
        self,
        runtime_mode: CUDAGraphMode,
        descriptor: BatchDescriptor | None = None,
        backend: GraphBackend = GraphBackend.EMULATED,
        break_outputs: BreakOutputs = BreakOutputs.COPY,
        pool: Any = None,
    ):
        if runtime_mode not in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL):
            raise ValueError(f"a graph is captured in PIECEWISE or FULL mode, not {runtime_mode}")
        self.id = next(_graph_ids)
        self.runtime_mode = runtime_mode
        self.descriptor = descriptor
        self.backend = backend
        self.break_outputs = break_outputs
        self.pool = pool
        self.segments: list[CapturedSegment | EagerSegment] = []
        self.capturing = False
        self.output: Any = None
        self._current: CapturedSegment | None = None
        self._stream: Any = None
        label = str(descriptor) if descriptor is not None else f"graph{self.id}"
        self.info = GraphInfo(self.id, label, str(runtime_mode), runtime_mode is CUDAGraphMode.PIECEWISE, self.break_outputs)

    # -- capture
    @property
    def label(self) -> str:
        return self.info.label

    @property
    def segment_index(self) -> int:
        return len(self.segments)

    @property
    def num_eager_breaks(self) -> int:
        return sum(1 for s in self.segments if s.kind is SegmentKind.EAGER)

    def capture(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        if _active_capture() is not None:
            raise RuntimeError("nested graph captures are not supported")
        _state.capture, _state.phase = self, Phase.CAPTURE
        protocol.announce("on_graph_begin", self.info, Phase.CAPTURE)
        try:
            self._begin_segment()
            try:
                out = fn(*args, **kwargs)
            except HostSyncInCaptureError as e:
                if e.event.graph is not None:
                    raise
                index = self._current.index if self._current is not None else self.segment_index
                raise HostSyncInCaptureError(dataclasses.replace(e.event, graph=self.info, segment=index)) from None
            finally:
                self._end_segment()
        finally:
            _state.capture, _state.phase = None, Phase.EAGER
        self.output = out
        protocol.announce("on_graph_end", self.info, Phase.CAPTURE, out)
        return out

    def _begin_segment(self) -> None:
        seg = CapturedSegment(len(self.segments), _new_primitive(self.backend))
        if isinstance(seg.graph, EmulatedCUDAGraph):
            seg.graph.owner = (self.info, seg.index)
        self._current = seg
        self.capturing = True
        protocol.announce("on_segment_begin", SegmentInfo(self.id, seg.index, SegmentKind.CAPTURED, None, Phase.CAPTURE))
        if self.backend is GraphBackend.CUDA:
            if self._stream is None:
                self._stream = torch.cuda.Stream()
            self._stream.wait_stream(torch.cuda.current_stream())
            torch.cuda.set_stream(self._stream)
        if self.pool is None:
            self.pool = graph_pool_handle() if self.backend is GraphBackend.EMULATED else torch.cuda.graph_pool_handle()
        seg.graph.capture_begin(pool=self.pool)

    def _end_segment(self) -> None:
        seg = self._current
        if seg is None:
            return
        self.capturing = False
        self._current = None
        try:
            seg.graph.capture_end()
        finally:
            if self.backend is GraphBackend.CUDA:
                torch.cuda.set_stream(torch.cuda.default_stream())
                torch.cuda.current_stream().wait_stream(self._stream)
        self.segments.append(seg)
        protocol.announce("on_segment_end", SegmentInfo(self.id, seg.index, SegmentKind.CAPTURED, None, Phase.CAPTURE))

    def add_eager(self, name: str, fn: Callable, args: tuple, kwargs: dict,
                  params: tuple[str, ...] = (), frame: Frame = protocol.UNKNOWN_FRAME) -> Any:
        """End the current captured segment, run ``fn`` as an eager segment, begin anew."""
        self._end_segment()
        seg = EagerSegment(len(self.segments), name, fn, args, kwargs, params=params, frame=frame)
        info = SegmentInfo(self.id, seg.index, SegmentKind.EAGER, name, Phase.CAPTURE)
        protocol.announce("on_segment_begin", info)
        call = BreakCall(name, args, kwargs, Phase.CAPTURE, False, 0, params, frame)
        protocol.announce("on_break_enter", call)
        result = fn(*args, **kwargs)
        protocol.announce("on_break_exit", call, result)
        if self.break_outputs is BreakOutputs.COPY:
            seg.outputs = list(flatten_tensors(result))
        if self.backend is GraphBackend.EMULATED:
            # Replay calls the break with its capture-time arguments, which the runtime
            # does not own (vLLM weak-references them): borrowed, poisoned once freed.
            seg.borrowed = BorrowedTensors()
            seg.args = tree_map(seg.borrowed.borrow, seg.args)
            seg.kwargs = tree_map(seg.borrowed.borrow, seg.kwargs)
            seg.borrowed.done()
        self.segments.append(seg)
        protocol.announce("on_segment_end", info)
        self._begin_segment()
        return result

    # -- replay
    def replay(self) -> Any:
        protocol.announce("on_graph_begin", self.info, Phase.REPLAY)
        previous = current_phase()
        _state.phase = Phase.REPLAY
        try:
            for seg in self.segments:
                info = SegmentInfo(self.id, seg.index, seg.kind, seg.name, Phase.REPLAY)
                protocol.announce("on_segment_begin", info)
                if isinstance(seg, EagerSegment):
                    self._replay_eager(seg)
                else:
                    seg.graph.replay()
                protocol.announce("on_segment_end", info)
        finally:
            _state.phase = previous
        protocol.announce("on_graph_end", self.info, Phase.REPLAY, self.output)
        return self.output

    def _replay_eager(self, seg: EagerSegment) -> None:
        if seg.borrowed is not None:
            poison_freed(seg.borrowed, self.info, seg.index, seg.poisoned)
        call = BreakCall(seg.name, seg.args, seg.kwargs, Phase.REPLAY, False, 0, seg.params, seg.frame)
        protocol.announce("on_break_enter", call)
        result = protocol.run_or_reuse(call, seg.fn, seg.args, seg.kwargs)
        protocol.announce("on_break_exit", call, result)
        if seg.outputs:
            fresh = list(flatten_tensors(result))
            if len(fresh) != len(seg.outputs):
                raise RuntimeError(
                    f"eager break {seg.name} returned {len(fresh)} tensors on replay but "
                    f"{len(seg.outputs)} at capture; a break must return the same structure every step"
                )
            with torch.no_grad():
                for dst, src in zip(seg.outputs, fresh):
                    if dst is not src:
                        dst.copy_(src)

    def summary(self) -> str:
        parts = []
        for s in self.segments:
            if isinstance(s, EagerSegment):
                parts.append(f"eager({s.name})")
            else:
                parts.append(f"captured({s.num_calls} calls)")
        return " -> ".join(parts)


def run_shadow(graph: GraphInfo, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Run ``fn`` eagerly as a would-be replay of ``graph``: breaks inline and announced,
    and ``torch.cuda.is_current_stream_capturing()`` answering what the replay's
    segments saw at capture (True in captured code, False in outermost eager breaks)."""
    previous = current_phase()
    previous_shadow = getattr(_state, "shadow", None)
    _state.phase = Phase.EAGER
    _state.shadow = graph
    try:
        with protocol.capturing_as_on_gpu(True):
            return fn(*args, **kwargs)
    finally:
        _state.phase = previous
        _state.shadow = previous_shadow


class CUDAGraphWrapper:
    """Wraps a runnable; per forward, reads the runtime mode and batch descriptor from
    the forward context, captures a ``BreakableGraph`` on first sight of a descriptor
    and replays it afterwards. Mode NONE runs the runnable eagerly.

    Replay uses the capture-time arguments: callers pass the same persistent buffers
    every step (vLLM's contract), and the checker verifies that they do.
    """

    def __init__(
        self,
        runnable: Callable,
        backend: GraphBackend = GraphBackend.EMULATED,
        break_outputs: BreakOutputs = BreakOutputs.COPY,
    ):
        self.runnable = runnable
        self.backend = backend
        self.break_outputs = break_outputs
        self.graphs: dict[tuple[CUDAGraphMode, BatchDescriptor], BreakableGraph] = {}
        self._pool: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ctx = get_forward_context() if has_forward_context() else None
        mode = ctx.cudagraph_runtime_mode if ctx is not None else CUDAGraphMode.NONE
        if mode is CUDAGraphMode.NONE or ctx is None or ctx.batch_descriptor is None:
            return self.runnable(*args, **kwargs)
        key = (mode, ctx.batch_descriptor)
        graph = self.graphs.get(key)
        if graph is None:
            graph = BreakableGraph(mode, ctx.batch_descriptor, self.backend, self.break_outputs, self._pool)
            out = graph.capture(self.runnable, *args, **kwargs)
            self._pool = graph.pool
            self.graphs[key] = graph
            return out
        if protocol.has_observers():
            protocol.announce("before_replay", graph.info,
                              functools.partial(run_shadow, graph.info, self.runnable, *args, **kwargs))
        return graph.replay()

    @property
    def num_graphs(self) -> int:
        return len(self.graphs)

    @property
    def num_eager_breaks(self) -> int:
        return sum(g.num_eager_breaks for g in self.graphs.values())
