"""Breakable CUDA-graph capture: captured segments with eager breaks between them.

**Idea.** A model forward is captured once per batch descriptor and replayed on later
steps. Code that cannot be replayed (it reads the forward context, or launches kernels
whose arguments change per step) is marked with ``@eager_break_during_capture``: at
capture it ends the current captured segment, runs, is recorded as a callable, and a
new captured segment begins. Replay runs the segments in order: captured segments
re-issue their recorded ops verbatim (same op, same arguments, same shapes, same
storages, no Python), eager segments call the break function again with the
*capture-time* arguments; its Python re-runs and reads the current forward context.

**What is built.** ``BreakableGraph`` (one capture and its segments), two backends
(``emulated``: dispatcher calls recorded under a ``TorchDispatchMode`` and re-issued on
the capture-time tensors, CPU; ``cuda``: ``torch.cuda.CUDAGraph`` per captured segment),
``CUDAGraphWrapper`` (captures on first sight of a batch descriptor, replays after), and
an observer API through which the runtime announces segment boundaries, break calls and
would-be breaks that run inline. The runtime never imports an analyzer.

**Invariants users must keep.**

**Captured code must not depend on host state.** Anything a captured segment computes
from Python values (the forward context, a tensor's value read on the host, a list
length) is frozen at capture. Put such code inside an eager break.

**Break outputs reach the graph through static buffers.** With
``copy_break_outputs=True`` (the default, as vLLM's newer runtime does) tensors returned
by a break are copied back on replay into the tensors the break returned at capture, so
downstream captured ops read fresh values. Anything else a break allocates (``self.x =
torch.empty(...)``) escapes: at replay the break allocates a new tensor and the graph
still reads the old one. With ``copy_break_outputs=False`` (vLLM's older runtime) return
values are discarded as well: write results in place into a pre-existing buffer.

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
import os
import sys
import threading
from typing import Any, Callable, Iterable, Sequence

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from capturelint.engine.forward_context import (
    BatchDescriptor,
    CUDAGraphMode,
    get_forward_context,
    has_forward_context,
)


class SegmentKind(enum.Enum):
    CAPTURED = "captured"
    EAGER = "eager"

    def __str__(self) -> str:
        return self.value


class Phase(enum.Enum):
    """When the runtime is running code: recording a graph, replaying it, or eagerly."""

    CAPTURE = "capture"
    REPLAY = "replay"
    EAGER = "eager"

    def __str__(self) -> str:
        return self.value


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


@dataclasses.dataclass(frozen=True)
class SegmentInfo:
    """A segment as announced to observers. ``name`` is the break's qualified name for
    eager segments and ``None`` for captured ones."""

    graph_id: int
    index: int
    kind: SegmentKind
    name: str | None
    phase: Phase


@dataclasses.dataclass(frozen=True)
class BreakCall:
    """A call of an ``@eager_break_during_capture`` function.

    ``inline`` is true when it ran as plain Python (outside capture, in a FULL graph, or
    nested inside another break); then ``depth`` counts the enclosing inline breaks.
    """

    name: str
    args: tuple
    kwargs: dict
    phase: Phase
    inline: bool
    depth: int


class HostSyncInCaptureError(RuntimeError):
    """A captured segment asked for a value on the host."""

    def __init__(self, op: str, frame: str, segment: int, graph: str = "", runtime_mode: str = ""):
        self.op = op
        self.frame = frame
        self.segment = segment
        self.graph = graph
        self.runtime_mode = runtime_mode
        super().__init__(
            f"host synchronisation {op} inside captured segment {segment} at {frame}: "
            "a CUDA-graph capture fails here. Move the code into an eager break or out "
            "of the captured region."
        )


class CaptureObserver:
    """Receives the runtime's announcements. Subclass and override what you need."""

    def on_graph_begin(self, graph: "BreakableGraph", phase: Phase) -> None: ...

    def on_graph_end(self, graph: "BreakableGraph", phase: Phase, output: Any) -> None: ...

    def on_segment_begin(self, segment: SegmentInfo) -> None: ...

    def on_segment_end(self, segment: SegmentInfo) -> None: ...

    def on_break_enter(self, call: BreakCall) -> None: ...

    def on_break_exit(self, call: BreakCall, result: Any) -> None: ...

    def before_replay(self, graph: "BreakableGraph", shadow: Callable[[], Any]) -> None:
        """Called before each replay. ``shadow()`` runs the same step eagerly (breaks
        inline and announced) and returns its output; an observer may call it once."""


_observers: list[CaptureObserver] = []
_state = threading.local()


def add_observer(observer: CaptureObserver) -> None:
    _observers.append(observer)


def remove_observer(observer: CaptureObserver) -> None:
    _observers.remove(observer)


class observing:
    """``with observing(obs): ...`` registers an observer for the block."""

    def __init__(self, observer: CaptureObserver):
        self.observer = observer

    def __enter__(self) -> CaptureObserver:
        add_observer(self.observer)
        return self.observer

    def __exit__(self, *exc: object) -> None:
        remove_observer(self.observer)


def _announce(method: str, *args: Any) -> None:
    for obs in tuple(_observers):
        getattr(obs, method)(*args)


def _active_capture() -> "BreakableGraph | None":
    return getattr(_state, "capture", None)


def _inline_depth() -> int:
    return getattr(_state, "inline_depth", 0)


def current_phase() -> Phase:
    """The phase of the innermost graph activity on this thread."""
    return getattr(_state, "phase", Phase.EAGER)


def eager_break_during_capture(fn: Callable) -> Callable:
    """Mark ``fn`` as an eager break of a breakable graph.

    Outside a capture, in a FULL capture, or while already inside a break, ``fn`` runs
    inline and the call is announced as a would-be break; during a PIECEWISE capture
    it becomes an eager segment (``BreakableGraph.add_eager``).
    """
    name = fn.__qualname__

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        cap = _active_capture()
        if cap is None or cap.runtime_mode is CUDAGraphMode.FULL or not cap.capturing:
            return _run_inline(name, fn, args, kwargs)
        return cap.add_eager(name, fn, args, kwargs)

    wrapper.__capturelint_break__ = name  # type: ignore[attr-defined]
    return wrapper


def _run_inline(name: str, fn: Callable, args: tuple, kwargs: dict) -> Any:
    depth = _inline_depth()
    call = BreakCall(name, args, kwargs, current_phase(), True, depth)
    _announce("on_break_enter", call)
    _state.inline_depth = depth + 1
    try:
        result = fn(*args, **kwargs)
    finally:
        _state.inline_depth = depth
    _announce("on_break_exit", call, result)
    return result


# ----------------------------------------------------------------------------- frames

_SKIP_PREFIXES: tuple[str, ...] = ()
_frame_cache: dict[Any, bool] = {}


def _skip_dirs() -> tuple[str, ...]:
    global _SKIP_PREFIXES
    if not _SKIP_PREFIXES:
        torch_dir = os.path.dirname(torch.__file__)
        here = os.path.abspath(__file__)
        _SKIP_PREFIXES = (torch_dir, os.path.dirname(os.__file__), here)
    return _SKIP_PREFIXES


def register_runtime_file(path: str) -> None:
    """Treat ``path`` as runtime machinery: source frames skip it (tracer, harness)."""
    global _SKIP_PREFIXES
    _SKIP_PREFIXES = _skip_dirs() + (os.path.abspath(path),)
    _frame_cache.clear()


def hidden_code(code: Any) -> bool:
    """Whether frames of ``code`` are runtime machinery (torch, stdlib, this runtime,
    registered runtime files) rather than engine or model code."""
    hidden = _frame_cache.get(code)
    if hidden is None:
        fn = os.path.abspath(code.co_filename)
        hidden = fn.startswith(_skip_dirs()) or code.co_filename.startswith("<")
        _frame_cache[code] = hidden
    return hidden


def user_frame(skip: int = 1) -> tuple[str, int, str]:
    """The innermost frame outside torch, the standard library and the runtime:
    ``(file, line, function)``; the file is relative to the working directory when
    it lies below it."""
    f = sys._getframe(skip)
    prefixes = _skip_dirs()
    while f is not None:
        code = f.f_code
        hidden = _frame_cache.get(code)
        if hidden is None:
            fn = os.path.abspath(code.co_filename)
            hidden = fn.startswith(prefixes) or code.co_filename.startswith("<")
            _frame_cache[code] = hidden
        if not hidden:
            return _display_path(code.co_filename), f.f_lineno, code.co_name
        f = f.f_back
    return "<unknown>", 0, "<unknown>"


_display_cache: dict[str, str] = {}


def _display_path(filename: str) -> str:
    shown = _display_cache.get(filename)
    if shown is None:
        absolute = os.path.abspath(filename)
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        cwd = os.getcwd()
        if absolute.startswith(package_root + os.sep):
            shown = os.path.relpath(absolute, package_root)
        elif absolute.startswith(cwd + os.sep):
            shown = os.path.relpath(absolute, cwd)
        else:
            shown = absolute
        _display_cache[filename] = shown
    return shown


def format_frame(frame: tuple[str, int, str]) -> str:
    return f"{frame[0]}:{frame[1]} in {frame[2]}"


# ------------------------------------------------------------------ emulated backend

_HOST_SYNC_OPS = {
    "aten::_local_scalar_dense",
    "aten::nonzero",
    "aten::nonzero_static",
    "aten::masked_select",
    "aten::unique",
    "aten::_unique",
    "aten::_unique2",
    "aten::unique_consecutive",
    "aten::unique_dim",
    "aten::bincount",
    "aten::equal",
    "aten::is_nonzero",
    "aten::allclose",
}
_ALLOC_OPS = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty", "aten::new_empty_strided"}


def _host_sync_reason(func: Any, args: tuple, kwargs: dict) -> str | None:
    name = func._schema.name
    if name in _HOST_SYNC_OPS:
        return str(func)
    if name in ("aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        for t in indices or ():
            if isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8):
                return f"{func} with a boolean mask"
    if name in ("aten::_to_copy", "aten::copy_"):
        src = args[0] if name == "aten::_to_copy" else args[1]
        dst_dev = kwargs.get("device") if name == "aten::_to_copy" else args[0].device
        if (
            isinstance(src, torch.Tensor)
            and src.device.type != "cpu"
            and dst_dev is not None
            and torch.device(dst_dev).type == "cpu"
        ):
            return f"{func} device-to-host copy"
    return None


class ReplayKind(enum.Enum):
    SKIP = "skip"  # views and allocations: their outputs alias recorded storages
    REISSUE = "reissue"  # in-place and out= ops: re-run on the recorded tensors
    COPY_OUT = "copy_out"  # functional ops: re-run, copy results into recorded outputs


@dataclasses.dataclass
class RecordedCall:
    func: Any
    args: tuple
    kwargs: dict
    outputs: list[torch.Tensor]  # fresh (non-aliasing) tensor outputs to refresh on replay
    kind: ReplayKind


_replay_kind_cache: dict[Any, tuple[ReplayKind, tuple[bool, ...]]] = {}


def _replay_kind(func: Any) -> tuple[ReplayKind, tuple[bool, ...]]:
    """How to replay ``func`` and which of its returns are fresh allocations."""
    cached = _replay_kind_cache.get(func)
    if cached is not None:
        return cached
    schema = func._schema
    mutates = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    fresh = tuple(r.alias_info is None for r in schema.returns)
    if schema.name in _ALLOC_OPS:
        kind = ReplayKind.SKIP
    elif mutates:
        kind = ReplayKind.COPY_OUT if any(fresh) else ReplayKind.REISSUE
    elif schema.returns and not any(fresh):
        kind = ReplayKind.SKIP
    else:
        kind = ReplayKind.COPY_OUT
    _replay_kind_cache[func] = (kind, fresh)
    return kind, fresh


def _fresh_outputs(out: Any, fresh: tuple[bool, ...]) -> list[torch.Tensor]:
    """The freshly allocated tensors among an op's returns, in order. A ``Tensor[]``
    return (``_foreach_mul``, ``split_with_sizes_copy``) is one schema return whose
    elements are all fresh or all not."""
    returns = out if len(fresh) > 1 else (out,)
    tensors: list[torch.Tensor] = []
    for value, is_fresh in zip(returns, fresh):
        if is_fresh:
            items = value if isinstance(value, (tuple, list)) else (value,)
            tensors.extend(t for t in items if isinstance(t, torch.Tensor))
    return tensors


class _HostReadGuard(TorchFunctionMode):
    """Catches host reads that never reach the dispatcher (``tolist``, ``numpy``)."""

    def __init__(self, graph: "BreakableGraph"):
        super().__init__()
        self.graph = graph

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("tolist", "numpy", "__array__"):
            raise HostSyncInCaptureError(
                f"Tensor.{name}()", format_frame(user_frame(2)), self.graph.segment_index,
                self.graph.label, str(self.graph.runtime_mode),
            )
        return func(*args, **(kwargs or {}))


class _RecordingMode(TorchDispatchMode):
    """Records the dispatcher calls of one captured segment (emulated backend)."""

    def __init__(self, graph: "BreakableGraph", calls: list[RecordedCall]):
        super().__init__()
        self.graph = graph
        self.calls = calls

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Without this torch wraps __torch_dispatch__ in a disable-dynamo guard costing
        # ~20 us per recorded op; captures never run under torch.compile.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        reason = _host_sync_reason(func, args, kwargs)
        if reason is not None:
            raise HostSyncInCaptureError(reason, format_frame(user_frame(2)), self.graph.segment_index,
                                          self.graph.label, str(self.graph.runtime_mode))
        out = func(*args, **kwargs)
        kind, fresh = _replay_kind(func)
        if kind is not ReplayKind.SKIP:
            refresh = _fresh_outputs(out, fresh) if kind is ReplayKind.COPY_OUT else []
            self.calls.append(RecordedCall(func, args, kwargs, refresh, kind))
        return out


def _replay_calls(calls: Sequence[RecordedCall]) -> None:
    with torch.no_grad():
        for c in calls:
            out = c.func(*c.args, **c.kwargs)
            if c.outputs:
                fresh = _fresh_outputs(out, _replay_kind(c.func)[1])
                for dst, src in zip(c.outputs, fresh):
                    dst.copy_(src)


# --------------------------------------------------------------------------- segments


@dataclasses.dataclass
class CapturedSegment:
    index: int
    calls: list[RecordedCall] = dataclasses.field(default_factory=list)
    cuda_graph: Any = None
    kind: SegmentKind = SegmentKind.CAPTURED
    name: str | None = None


@dataclasses.dataclass
class EagerSegment:
    index: int
    name: str
    fn: Callable
    args: tuple
    kwargs: dict
    outputs: list[torch.Tensor] = dataclasses.field(default_factory=list)
    kind: SegmentKind = SegmentKind.EAGER


_graph_ids = iter(range(1, 1 << 62))


class BreakableGraph:
    """One captured forward: an alternating list of captured and eager segments."""

    def __init__(
        self,
        runtime_mode: CUDAGraphMode,
        descriptor: BatchDescriptor | None = None,
        backend: GraphBackend = GraphBackend.EMULATED,
        copy_break_outputs: bool = True,
        pool: Any = None,
    ):
        if runtime_mode not in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL):
            raise ValueError(f"a graph is captured in PIECEWISE or FULL mode, not {runtime_mode}")
        self.id = next(_graph_ids)
        self.runtime_mode = runtime_mode
        self.descriptor = descriptor
        self.backend = backend
        self.copy_break_outputs = copy_break_outputs
        self.pool = pool
        self.segments: list[CapturedSegment | EagerSegment] = []
        self.capturing = False
        self.output: Any = None
        self.args: tuple = ()
        self.kwargs: dict = {}
        self._current: CapturedSegment | None = None
        self._modes: list[Any] = []
        self._stream: Any = None

    # -- capture
    @property
    def label(self) -> str:
        return str(self.descriptor) if self.descriptor is not None else f"graph{self.id}"

    @property
    def segment_index(self) -> int:
        return len(self.segments)

    @property
    def num_eager_breaks(self) -> int:
        return sum(1 for s in self.segments if s.kind is SegmentKind.EAGER)

    def capture(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        if _active_capture() is not None:
            raise RuntimeError("nested graph captures are not supported")
        self.args, self.kwargs = args, kwargs
        _state.capture, _state.phase = self, Phase.CAPTURE
        _announce("on_graph_begin", self, Phase.CAPTURE)
        try:
            self._begin_segment()
            try:
                out = fn(*args, **kwargs)
            finally:
                self._end_segment()
        finally:
            _state.capture, _state.phase = None, Phase.EAGER
        self.output = out
        _announce("on_graph_end", self, Phase.CAPTURE, out)
        return out

    def _begin_segment(self) -> None:
        seg = CapturedSegment(len(self.segments))
        self._current = seg
        self.capturing = True
        _announce("on_segment_begin", SegmentInfo(self.id, seg.index, SegmentKind.CAPTURED, None, Phase.CAPTURE))
        if self.backend is GraphBackend.EMULATED:
            modes = [_HostReadGuard(self), _RecordingMode(self, seg.calls)]
        else:
            seg.cuda_graph = torch.cuda.CUDAGraph()
            if self._stream is None:
                self._stream = torch.cuda.Stream()
            self._stream.wait_stream(torch.cuda.current_stream())
            torch.cuda.set_stream(self._stream)
            seg.cuda_graph.capture_begin(pool=self.pool)
            if self.pool is None:
                self.pool = seg.cuda_graph.pool()
            modes = [_HostReadGuard(self)]
        for m in modes:
            m.__enter__()
        self._modes = modes

    def _end_segment(self) -> None:
        seg = self._current
        if seg is None:
            return
        for m in reversed(self._modes):
            m.__exit__(None, None, None)
        self._modes = []
        if self.backend is GraphBackend.CUDA:
            seg.cuda_graph.capture_end()
            torch.cuda.set_stream(torch.cuda.default_stream())
            torch.cuda.current_stream().wait_stream(self._stream)
        self.capturing = False
        self._current = None
        self.segments.append(seg)
        _announce("on_segment_end", SegmentInfo(self.id, seg.index, SegmentKind.CAPTURED, None, Phase.CAPTURE))

    def add_eager(self, name: str, fn: Callable, args: tuple, kwargs: dict) -> Any:
        """End the current captured segment, run ``fn`` as an eager segment, begin anew."""
        self._end_segment()
        seg = EagerSegment(len(self.segments), name, fn, args, kwargs)
        info = SegmentInfo(self.id, seg.index, SegmentKind.EAGER, name, Phase.CAPTURE)
        _announce("on_segment_begin", info)
        call = BreakCall(name, args, kwargs, Phase.CAPTURE, False, 0)
        _announce("on_break_enter", call)
        result = fn(*args, **kwargs)
        _announce("on_break_exit", call, result)
        if self.copy_break_outputs:
            seg.outputs = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
        self.segments.append(seg)
        _announce("on_segment_end", info)
        self._begin_segment()
        return result

    # -- replay
    def replay(self) -> Any:
        _announce("on_graph_begin", self, Phase.REPLAY)
        previous = current_phase()
        _state.phase = Phase.REPLAY
        try:
            for seg in self.segments:
                info = SegmentInfo(self.id, seg.index, seg.kind, seg.name, Phase.REPLAY)
                _announce("on_segment_begin", info)
                if isinstance(seg, EagerSegment):
                    self._replay_eager(seg)
                elif self.backend is GraphBackend.EMULATED:
                    _replay_calls(seg.calls)
                else:
                    seg.cuda_graph.replay()
                _announce("on_segment_end", info)
        finally:
            _state.phase = previous
        _announce("on_graph_end", self, Phase.REPLAY, self.output)
        return self.output

    def _replay_eager(self, seg: EagerSegment) -> None:
        call = BreakCall(seg.name, seg.args, seg.kwargs, Phase.REPLAY, False, 0)
        _announce("on_break_enter", call)
        result = seg.fn(*seg.args, **seg.kwargs)
        _announce("on_break_exit", call, result)
        if seg.outputs:
            fresh = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
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
                parts.append(f"captured({len(s.calls)} calls)")
        return " -> ".join(parts)


def run_shadow(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """Run ``fn`` eagerly as a would-be replay: breaks inline and announced."""
    previous = current_phase()
    _state.phase = Phase.EAGER
    try:
        return fn(*args, **kwargs)
    finally:
        _state.phase = previous


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
        copy_break_outputs: bool = True,
    ):
        self.runnable = runnable
        self.backend = backend
        self.copy_break_outputs = copy_break_outputs
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
            graph = BreakableGraph(mode, ctx.batch_descriptor, self.backend, self.copy_break_outputs, self._pool)
            out = graph.capture(self.runnable, *args, **kwargs)
            self._pool = graph.pool
            self.graphs[key] = graph
            return out
        if _observers:
            _announce("before_replay", graph, functools.partial(run_shadow, self.runnable, *args, **kwargs))
        return graph.replay()

    @property
    def num_graphs(self) -> int:
        return len(self.graphs)

    @property
    def num_eager_breaks(self) -> int:
        return sum(g.num_eager_breaks for g in self.graphs.values())


def flatten_tensors(obj: Any) -> Iterable[torch.Tensor]:
    return (t for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor))
