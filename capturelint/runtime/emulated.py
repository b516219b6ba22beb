"""An emulated ``torch.cuda.CUDAGraph`` with a GPU's capture semantics, on a CPU.

**Idea.** A CUDA graph records kernels with frozen pointers and frozen arguments and
replays them without Python. On a CPU the emulated primitive records the dispatcher
calls of a capture under a ``TorchDispatchMode`` and re-issues them on the capture-time
tensors at replay, so a stale read or a baked branch corrupts outputs on a CPU exactly
as it would on a GPU.

**What is built.** ``EmulatedCUDAGraph`` (``capture_begin(pool=...)``,
``capture_end``, ``replay``, ``reset``, ``pool``), ``graph`` (the
``torch.cuda.graph`` context manager), ``graph_pool_handle``, stream and event
stand-ins, ``make_graphed_callables`` (inference only), and ``emulate_cuda()``, which
installs all of them in ``torch.cuda`` on a machine without CUDA, with the emulated
CUDA device of ``runtime.device`` (``.cuda()``, ``device="cuda"`` and the
``torch.cuda`` queries on the CPU), so that unmodified code written for a GPU runs.

**Who announces what.** A bare graph announces its own capture and replays to the
observers of ``protocol`` as an unsegmented graph: it keeps no Python, so its replays
get no shadow. A graphed callable (``make_graphed_callables``) keeps the callable, so
it announces a graph of one captured segment whose every replay offers a shadow, as a
breakable runtime's graph does (``_Graphed``).

**Capture semantics, as on a GPU.**

**Captured kernels do not take effect at capture.** Ops run during the capture (their
output shapes and the Python that follows need them), but at ``capture_end`` every
storage that existed before the capture and that a captured op wrote is restored from
a copy taken before its first write, so a buffer keeps its pre-capture value.

**Capture-time values are garbage.** Every storage first produced during the capture
(graph-pool memory) is *poisoned* at ``capture_end``: floating and complex dtypes hold
NaN, integer dtypes 0, booleans ``True``. Code that consumes a capture run's values,
rather than a replay's, computes with the poison and is caught by the numerical oracle.
Integers are poisoned with 0 rather than an out-of-range value so that an index read
from poisoned memory stays in bounds: on a GPU such a read is garbage (or an illegal
address), here it is a wrong but valid index, whose effect the numerical oracle sees
instead of the engine crashing in a replay.

**Freed inputs are reused memory.** The graph keeps its own aliases of the tensors it
reads but does not own them, as a GPU graph keeps raw pointers. Before each replay it
checks every storage it reads that it did not allocate: if nothing outside the graphs
holds it any more (the engine dropped its last reference, e.g. by re-allocating the
tensor), the storage is poisoned, as the caching allocator would hand the memory to
someone else. A tensor re-allocated with the same values therefore diverges. Memory
allocated during any capture is graph-pool memory: it lives as long as its graph (a
private pool is not returned to the allocator), so it is never taken for freed.

**Re-bound holders are watched.** A program that re-binds the name it feeds the graph
(``self.static_x = batch``) while the captured tensor stays alive elsewhere frees
nothing; the graph keeps reading the old tensor. When someone observes a bare graph,
its capture end finds who holds each of its inputs and outputs (``runtime.holders``,
no roots needed) and announces their names (``on_graph_names``); each replay announces
a holder of an input that now holds another tensor of the same shape and dtype while
the captured one is alive and unwritten (``HeldInputEvent``).

**No host synchronisation in a capture.** ``.item()``, ``.tolist()``, ``nonzero``,
boolean masks and device-to-host copies raise ``HostSyncInCaptureError``.

**Replay** re-issues the recorded calls: in-place and ``out=`` ops on the recorded
tensors, functional ops with their results copied into the capture-time outputs; views
and allocations are not re-issued (their outputs alias recorded storages). Which calls
write, allocate or alias, and so how each replays, comes from the op schema
(``runtime.schema``, shared with the tracer).

``torch.cuda.is_current_stream_capturing()`` answers True between ``capture_begin``
and ``capture_end`` (see ``protocol.stream_capturing``).

Limitations: streams and events are sequential stand-ins (no concurrency is emulated);
Python garbage held in reference cycles counts as a live reference until collected.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import inspect
import itertools
import threading
from typing import Any, Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from capturelint.runtime import device as emulated_device
from capturelint.runtime import frames, holders, protocol
from capturelint.runtime.protocol import HostSyncEvent, HostSyncInCaptureError
from capturelint.runtime.schema import ReplayKind, op_info

StorageId = int


# ------------------------------------------------------------------------ poison


def poison_value(dtype: torch.dtype) -> Any:
    """The value a poisoned storage holds for ``dtype`` (see the module docstring)."""
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype is torch.bool:
        return True
    return 0


def poison_storage(storage: torch.UntypedStorage, dtype: torch.dtype) -> None:
    """Fill the whole of ``storage``, read as ``dtype``, with the poison value."""
    with _disable_current_modes(), torch.no_grad():
        _poison(storage, dtype)


def _poison(storage: torch.UntypedStorage, dtype: torch.dtype) -> None:
    """``poison_storage`` where no mode is active and grad is off (a capture's end)."""
    n = storage.nbytes() // dtype.itemsize
    if n:
        torch.empty(0, dtype=dtype, device=storage.device).set_(storage, 0, (n,), (1,)).fill_(poison_value(dtype))


def _map_tensors(fn: Callable[[torch.Tensor], Any], obj: Any) -> Any:
    """``tree_map(fn, obj)`` for an op's arguments (tuples, lists, dicts of tensors and
    scalars), without pytree's per-leaf overhead; containers without a tensor are
    returned as they are."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (tuple, list)):
        mapped = [_map_tensors(fn, x) for x in obj]
        if all(a is b for a, b in zip(mapped, obj)):
            return obj
        return type(obj)(mapped) if type(obj) in (tuple, list) else tree_map(fn, obj)
    if isinstance(obj, dict):
        if not obj:
            return obj
        return {k: _map_tensors(fn, v) for k, v in obj.items()}
    return obj


def _alias(t: torch.Tensor) -> torch.Tensor:
    """A new tensor over ``t``'s memory that holds no reference to ``t`` itself."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), t.storage_offset(), t.size(), t.stride())


# A storage is referenced by every tensor over it and by its one Python object. The
# graphs' aliases are counted here so that "nothing else holds it" can be told.
_graph_aliases: dict[StorageId, int] = {}
# Storages allocated during a capture: graph-pool memory, alive as long as its graph.
_graph_owned: dict[StorageId, int] = {}


def _outside_references(sid: StorageId) -> int:
    return torch._C._storage_Use_Count(sid) - 1 - _graph_aliases.get(sid, 0)


def _alive(sid: StorageId) -> bool:
    """Whether something outside the graphs holds borrowed storage ``sid``."""
    return _outside_references(sid) > 0


class BorrowedTensors:
    """Tensors a graph reads but does not own, held as aliases over their memory, as a
    GPU graph holds raw pointers (and vLLM's runtime weak references to break
    arguments): ``freed()`` tells which of them nothing outside the graphs holds."""

    def __init__(self) -> None:
        self._aliases: dict[StorageId, int] = {}
        self._storages: dict[StorageId, tuple[torch.UntypedStorage, torch.dtype]] = {}
        self._memo: dict[int, torch.Tensor] = {}

    def borrow(self, t: Any) -> Any:
        """An alias of ``t`` (any other value is returned as it is)."""
        if not isinstance(t, torch.Tensor):
            return t
        alias = self._memo.get(id(t))
        if alias is None:
            st = t.untyped_storage()
            sid = st._cdata
            with _disable_current_modes(), torch.no_grad():
                alias = _alias(t)
            self._memo[id(t)] = alias
            self._aliases[sid] = self._aliases.get(sid, 0) + 1
            _graph_aliases[sid] = _graph_aliases.get(sid, 0) + 1
            self._storages.setdefault(sid, (st, t.dtype))
        return alias

    def done(self) -> None:
        """Borrowing is over: the original tensors are no longer referenced here."""
        self._memo.clear()

    def storages(self) -> list[StorageId]:
        """The storages borrowed, in the order first borrowed."""
        return list(self._storages)

    def freed(self) -> list[tuple[StorageId, torch.UntypedStorage, torch.dtype]]:
        return [
            (sid, st, dt) for sid, (st, dt) in self._storages.items()
            if sid not in _graph_owned and _outside_references(sid) <= 0
        ]

    def release(self) -> None:
        for sid, n in self._aliases.items():
            left = _graph_aliases.get(sid, 0) - n
            if left > 0:
                _graph_aliases[sid] = left
            else:
                _graph_aliases.pop(sid, None)
        self._aliases, self._storages, self._memo = {}, {}, {}

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:
            pass


# ---------------------------------------------------------------- recorded calls


@dataclasses.dataclass
class RecordedCall:
    func: Any
    args: tuple
    kwargs: dict
    outputs: list[torch.Tensor]  # fresh (non-aliasing) tensor outputs to refresh on replay
    kind: ReplayKind


class _HostReadGuard(TorchFunctionMode):
    """Catches host reads that never reach the dispatcher (``tolist``, ``numpy``)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in protocol.HOST_READ_METHODS:
            raise HostSyncInCaptureError(HostSyncEvent(f"Tensor.{name}()", frames.user_frame(2),
                                                        stack=frames.user_stack(2)))
        return func(*args, **(kwargs or {}))


class _RecordingMode(TorchDispatchMode):
    """Records the dispatcher calls of one capture and what they allocate and write."""

    def __init__(self, graph: "EmulatedCUDAGraph"):
        super().__init__()
        self.graph = graph

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Without this torch wraps __torch_dispatch__ in a disable-dynamo guard costing
        # ~20 us per recorded op; captures never run under torch.compile.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        reason = protocol.host_sync_reason(func, args, kwargs)
        if reason is not None:
            raise HostSyncInCaptureError(HostSyncEvent(reason, frames.user_frame(2), stack=frames.user_stack(2)))
        g = self.graph
        info = op_info(func)
        for t in info.written(args, kwargs):
            g._before_write(t)
        for value in itertools.chain(args, kwargs.values()):
            if isinstance(value, torch.Tensor):
                g._seen(value)
            elif isinstance(value, (list, tuple)):
                for t in value:
                    if isinstance(t, torch.Tensor):
                        g._seen(t)
        out = func(*args, **kwargs)
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor):
                g._produced(o)
        if info.replay is not ReplayKind.SKIP:
            refresh = info.fresh_outputs(out) if info.replay is ReplayKind.COPY_OUT else []
            g._calls.append(RecordedCall(func, args, kwargs, refresh, info.replay))
        return out


# --------------------------------------------------------------------- the graph


class _PoolHandle(tuple):
    """An opaque memory-pool handle, as ``torch.cuda.graph_pool_handle()`` returns."""


_pool_ids = itertools.count(1)


def graph_pool_handle() -> _PoolHandle:
    """A new memory-pool handle to share between graphs (emulated: an id)."""
    return _PoolHandle((0, next(_pool_ids)))


_bare_ids = itertools.count(1 << 40)
_adoption = threading.local()


@contextlib.contextmanager
def owned_by(info: protocol.GraphInfo, segment: int) -> Iterator[None]:
    """The next ``EmulatedCUDAGraph`` made on this thread in the block is segment
    ``segment`` of ``info``: a breakable runtime that creates its primitive and begins
    its capture in one call (vLLM's ``BreakableCUDAGraphCapture._begin_segment``) gets
    an owned segment, announced by the runtime's bridge, not a bare graph."""
    _adoption.owner = (info, segment)
    try:
        yield
    finally:
        _adoption.owner = None


class EmulatedCUDAGraph:
    """``torch.cuda.CUDAGraph`` on a CPU; see the module docstring for its semantics."""

    def __init__(self, keep_graph: bool = False):
        self._calls: list[RecordedCall] = []
        self._pool: _PoolHandle | None = None
        self._recording: list[Any] = []
        self._known: dict[StorageId, torch.UntypedStorage] = {}  # storages seen before they were produced
        self._allocated: dict[StorageId, tuple[torch.UntypedStorage, torch.dtype]] = {}
        self._saved: dict[StorageId, tuple[torch.UntypedStorage, torch.UntypedStorage]] = {}
        self._borrowed = BorrowedTensors()
        self._captured = False
        self.poisoned: set[StorageId] = set()  # inputs found freed at a replay
        # A breakable runtime owns its segments' primitives and announces them itself;
        # a bare graph announces its own capture and replays.
        self.owner: tuple[protocol.GraphInfo, int] | None = getattr(_adoption, "owner", None)
        _adoption.owner = None
        self._info: protocol.GraphInfo | None = None
        self._where: protocol.Frame | None = None  # the line that began the capture
        self._holders: holders.Holders | None = None  # who held the inputs at capture (bare graphs, observed)
        self._replays = 0

    @property
    def info(self) -> protocol.GraphInfo:
        if self.owner is not None:
            return self.owner[0]
        if self._info is None:
            where = self._where or protocol.UNKNOWN_FRAME
            label = f"cudagraph@{where.file}:{where.line}"
            self._info = protocol.GraphInfo(next(_bare_ids), label, str(protocol.CUDAGraphMode.FULL), False,
                                             protocol.BreakOutputs.DISCARD, False)
        return self._info

    # -- capture
    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        if self._recording:
            raise RuntimeError("capture_begin called twice without capture_end")
        if self._captured:
            raise RuntimeError("this graph was already captured; call reset() first")
        self._pool = _PoolHandle(pool) if pool is not None else graph_pool_handle()
        if self.owner is None:
            self._where = frames.user_frame(2)
        modes = [_HostReadGuard(), _RecordingMode(self)]
        for m in modes:
            m.__enter__()
        self._recording = modes
        protocol.capturing_as_on_gpu(True).__enter__()
        if self.owner is None:
            protocol.announce("on_graph_begin", self.info, protocol.Phase.CAPTURE)

    def capture_end(self) -> None:
        if not self._recording:
            raise RuntimeError("capture_end called without capture_begin")
        protocol.capturing_as_on_gpu(True).__exit__(None, None, None)
        for m in reversed(self._recording):
            m.__exit__(None, None, None)
        self._recording = []
        self._captured = True
        if self.owner is None:
            protocol.announce("on_graph_end", self.info, protocol.Phase.CAPTURE, None)
        self._settle()
        self._replays = 0
        if self.owner is None and protocol.has_observers():
            inputs = [sid for sid in self._borrowed.storages() if sid not in _graph_owned]
            found = holders.discover(inputs + list(self._allocated))
            protocol.announce("on_graph_names", self.info, found.names())
            self._holders = found.only(inputs) if inputs else None

    def _seen(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        sid = st._cdata
        if sid not in self._allocated and sid not in self._known:
            self._known[sid] = st

    def _produced(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        sid = st._cdata
        if sid not in self._known and sid not in self._allocated:
            self._allocated[sid] = (st, t.dtype)

    def _before_write(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        sid = st._cdata
        if sid in self._allocated or sid in self._saved:
            return
        self._seen(t)
        with _disable_current_modes():
            self._saved[sid] = (st, st.clone())

    def _settle(self) -> None:
        """At capture end: undo the capture's writes, poison its allocations, and let
        go of the tensors it reads but does not own."""
        with _disable_current_modes(), torch.no_grad():
            for st, saved in self._saved.values():
                st.copy_(saved)
            for st, dtype in self._allocated.values():
                _poison(st, dtype)

            def own(x: Any) -> Any:
                if isinstance(x, torch.Tensor) and x.untyped_storage()._cdata in self._allocated:
                    return x  # graph-pool memory: the graph owns it
                return self._borrowed.borrow(x)

            for c in self._calls:
                c.args = _map_tensors(own, c.args)
                c.kwargs = _map_tensors(own, c.kwargs)
        self._borrowed.done()
        for sid in self._allocated:
            _graph_owned[sid] = _graph_owned.get(sid, 0) + 1
        self._saved.clear()
        self._known.clear()

    # -- replay
    def replay(self) -> None:
        if self._recording:
            raise RuntimeError("replay called during capture")
        if not self._captured:
            raise RuntimeError("replay called before a capture")
        bare = self.owner is None
        if bare:
            protocol.announce("on_graph_begin", self.info, protocol.Phase.REPLAY)
        segment = self.owner[1] if self.owner is not None else 0
        self._replays += 1
        if self._holders is not None:
            self._holders.refresh()  # before looking for freed inputs: a stale snapshot holds old locals
        poison_freed(self._borrowed, self.info, segment, self.poisoned)
        if self._holders is not None:
            announce_rebound(self._holders, self.info, segment, self._replays)
        with torch.no_grad():
            for c in self._calls:
                out = c.func(*c.args, **c.kwargs)
                if c.outputs:
                    for dst, src in zip(c.outputs, op_info(c.func).fresh_outputs(out)):
                        dst.copy_(src)
        if bare:
            protocol.announce("on_graph_end", self.info, protocol.Phase.REPLAY, None)

    def reset(self) -> None:
        self._holders = None
        self._borrowed.release()
        if self._captured:
            for sid in self._allocated:
                left = _graph_owned.get(sid, 0) - 1
                if left > 0:
                    _graph_owned[sid] = left
                else:
                    _graph_owned.pop(sid, None)
        self._calls = []
        self._allocated = {}
        self._captured = False

    def __del__(self) -> None:
        try:
            self.reset()
        except Exception:
            pass

    def pool(self) -> _PoolHandle:
        if self._pool is None:
            raise RuntimeError("pool() called before capture_begin")
        return self._pool

    @property
    def num_calls(self) -> int:
        return len(self._calls)

    def enable_debug_mode(self) -> None: ...

    def debug_dump(self, path: str) -> None:
        with open(path, "w") as f:
            for c in self._calls:
                f.write(f"{c.func}\n")


def poison_freed(borrowed: BorrowedTensors, info: protocol.GraphInfo, segment: int, poisoned: set[StorageId]) -> None:
    """Before a replay: poison every borrowed storage the program has freed, as the
    caching allocator would have reused it, and announce each once."""
    for sid, st, dtype in borrowed.freed():
        poison_storage(st, dtype)
        if sid not in poisoned:
            poisoned.add(sid)
            event = protocol.StaleInputEvent(info, segment, sid, str(dtype).removeprefix("torch."))
            protocol.announce("on_stale_input", event)


def announce_rebound(found: holders.Holders, info: protocol.GraphInfo, segment: int, replay: int) -> None:
    """Before a replay: announce each holder of an input that the program re-bound
    while the captured tensor stays alive and unwritten (``runtime.holders``), once."""
    for holder, now, held_by in found.rebound(_alive):
        event = protocol.HeldInputEvent(
            info, segment, holder.storage, str(holder.dtype).removeprefix("torch."), holder.shape, holder.label,
            now.untyped_storage()._cdata, held_by, holders.rebinding_line(holder), replay, frames.user_frame(2),
        )
        protocol.announce("on_held_input", event)


def is_current_stream_capturing() -> bool:
    return protocol.stream_capturing()


# ------------------------------------------------------------ streams and events


class EmulatedStream:
    """A stream stand-in: work is sequential on a CPU, so waits are no-ops."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any):
        self.device = torch.device("cpu")
        self.priority = priority

    def wait_stream(self, stream: Any) -> None: ...

    def wait_event(self, event: Any) -> None: ...

    def record_event(self, event: Any = None) -> "EmulatedEvent":
        event = event if event is not None else EmulatedEvent()
        event.record(self)
        return event

    def synchronize(self) -> None: ...

    def query(self) -> bool:
        return True

    def __enter__(self) -> "EmulatedStream":
        return self

    def __exit__(self, *exc: object) -> None: ...

    @property
    def cuda_stream(self) -> int:
        return id(self)


class EmulatedEvent:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.recorded = False

    def record(self, stream: Any = None) -> None:
        self.recorded = True

    def wait(self, stream: Any = None) -> None: ...

    def synchronize(self) -> None: ...

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: "EmulatedEvent") -> float:
        return 0.0


_default_stream = EmulatedStream()
_current_stream: list[EmulatedStream] = [_default_stream]


def current_stream(device: Any = None) -> EmulatedStream:
    return _current_stream[-1]


def default_stream(device: Any = None) -> EmulatedStream:
    return _default_stream


def set_stream(stream: Any) -> None:
    _current_stream[-1] = stream


@contextlib.contextmanager
def stream(s: Any) -> Iterator[Any]:
    _current_stream.append(s if s is not None else _current_stream[-1])
    try:
        yield s
    finally:
        _current_stream.pop()


def synchronize(device: Any = None) -> None: ...


class graph:
    """``torch.cuda.graph``: ``with graph(g, pool=...): ...`` captures into ``g``."""

    default_capture_stream: EmulatedStream | None = None

    def __init__(self, cuda_graph: Any, pool: Any = None, stream: Any = None, capture_error_mode: str = "global"):
        self.cuda_graph = cuda_graph
        self.pool = pool
        self.stream = stream

    def __enter__(self) -> None:
        gc.collect()
        self.cuda_graph.capture_begin(pool=self.pool)

    def __exit__(self, *exc: object) -> None:
        self.cuda_graph.capture_end()


def make_graphed_callables(
    callables: Any, sample_args: Any, num_warmup_iters: int = 3, allow_unused_input: bool = False, pool: Any = None
) -> Any:
    """``torch.cuda.make_graphed_callables`` for inference (no autograd), built as
    PyTorch builds it: ``sample_args`` hold tensors only (nested in tuples, lists or
    dicts); every callable is warmed up, then each is captured on its sample arguments,
    all into one memory pool; a module comes back as itself with its ``forward``
    replaced (the original runs when its training flag differs from the capture's), a
    function as a new function. A call copies its arguments into the static inputs,
    replays, and returns the static outputs (``_Graphed``)."""
    single = not isinstance(callables, tuple)
    fns = (callables,) if single else callables
    samples = (sample_args,) if single else sample_args
    where = frames.user_frame(2)
    flat = []
    for fn, args in zip(fns, samples):
        leaves, spec = tree_flatten(tuple(args))
        if not all(isinstance(a, torch.Tensor) for a in leaves):
            raise AssertionError(  # PyTorch's own check, in its words
                "In the beta API, sample_args for each callable must contain only Tensors. Other types are not allowed."
            )
        if any(a.requires_grad for a in leaves) or (
            isinstance(fn, torch.nn.Module) and any(p.requires_grad for p in fn.parameters()) and torch.is_grad_enabled()
        ):
            raise RuntimeError(
                "the emulated make_graphed_callables supports inference only: run it under torch.no_grad() "
                "with inputs that do not require grad"
            )
        flat.append((tuple(args), leaves, spec))
    mempool = graph_pool_handle() if pool is None else pool
    for fn, (args, _, _) in zip(fns, flat):
        for _ in range(num_warmup_iters):
            fn(*args)
    graphed = []
    for i, (fn, (args, leaves, spec)) in enumerate(zip(fns, flat)):
        module = isinstance(fn, torch.nn.Module)
        name = type(fn).__name__ if module else getattr(fn, "__qualname__", type(fn).__name__)
        label = f"graphed {name}" + ("" if single else f"#{i}") + f"@{where.file}:{where.line}"
        g = _Graphed(fn, fn.forward if module else fn, label, leaves, spec)
        g.capture(mempool, args)
        if module:
            fn.forward = g.forward
        graphed.append(fn if module else g)
    return graphed[0] if single else tuple(graphed)


class _Graphed:
    """One graphed callable: a one-segment captured graph whose replays are shadowed.

    It is the capture runtime of its callable: its primitive is an owned
    ``EmulatedCUDAGraph`` (``owned_by``), and it announces its capture and replays as a
    segmented graph of one captured segment, as a breakable runtime's graph does. Unlike
    a bare ``CUDAGraph`` it keeps Python that can re-run: before each replay it offers
    observers a shadow (``before_replay``), the callable run eagerly on the call's
    arguments as the graph reads them, the static inputs they were just copied into (an
    argument smaller than its sample, which ``copy_`` broadcasts, is seen with its own
    shape: a baked shape). The tracer undoes the shadow's tensor writes and random
    draws; ``_PythonState`` undoes what it can of its Python, so that host state evolves
    as in a run without shadows, where replays run no Python. Like torch's, it keeps its
    static input surface alive: the sample arguments and, for a module, its parameters
    as they were at capture (``static_surface``).
    """

    def __init__(self, fn: Any, run: Callable[..., Any], label: str, static_in: list[torch.Tensor], spec: Any):
        self.fn, self.run, self.static_in, self.spec = fn, run, static_in, spec
        self.static_surface = tuple(static_in) + (tuple(fn.parameters()) if isinstance(fn, torch.nn.Module) else ())
        self.info = protocol.GraphInfo(next(_bare_ids), label, "FULL", False, protocol.BreakOutputs.DISCARD, True)
        self.training = fn.training if isinstance(fn, torch.nn.Module) else None
        self.graph: EmulatedCUDAGraph | None = None
        self.static_out: Any = None

    def _segment(self, phase: protocol.Phase) -> protocol.SegmentInfo:
        return protocol.SegmentInfo(self.info.id, 0, protocol.SegmentKind.CAPTURED, None, phase)

    def capture(self, pool: Any, args: tuple) -> None:
        phase = protocol.Phase.CAPTURE
        with owned_by(self.info, 0):
            self.graph = EmulatedCUDAGraph()
        protocol.announce("on_graph_begin", self.info, phase)
        protocol.announce("on_segment_begin", self._segment(phase))
        try:
            with graph(self.graph, pool=pool):
                self.static_out = self.fn(*args)
        except HostSyncInCaptureError as e:
            raise HostSyncInCaptureError(dataclasses.replace(e.event, graph=self.info, segment=0)) from None
        protocol.announce("on_segment_end", self._segment(phase))
        protocol.announce("on_graph_end", self.info, phase, self.static_out)

    def forward(self, *args: Any) -> Any:
        """A graphed module's ``forward``: the graph, or the original ``forward`` when
        the module's training flag is not the one it was captured with."""
        if self.fn.training != self.training:
            return self.run(*args)
        return self(*args)

    def __call__(self, *args: Any) -> Any:
        leaves = tree_flatten(args)[0]
        if len(leaves) != len(self.static_in) or not all(isinstance(a, torch.Tensor) for a in leaves):
            raise TypeError(
                f"graph {self.info.label} takes {len(self.static_in)} tensors, as its sample_args, but was called "
                f"with ({', '.join(type(a).__name__ for a in leaves)}); pass tensors in the sample's order and format"
            )
        with torch.no_grad():
            for dst, src in zip(self.static_in, leaves):
                if dst.data_ptr() != src.data_ptr():
                    dst.copy_(src)
        if protocol.has_observers():
            read = [_as_read(dst, src) for dst, src in zip(self.static_in, leaves)]
            protocol.announce("before_replay", self.info, functools.partial(self._shadow, tree_unflatten(read, self.spec)))
        phase = protocol.Phase.REPLAY
        protocol.announce("on_graph_begin", self.info, phase)
        protocol.announce("on_segment_begin", self._segment(phase))
        self.graph.replay()
        protocol.announce("on_segment_end", self._segment(phase))
        protocol.announce("on_graph_end", self.info, phase, self.static_out)
        return self.static_out

    def _shadow(self, args: tuple) -> Any:
        """The callable run eagerly as the replayed step: inside a capture as far as
        ``is_current_stream_capturing()`` tells, its objects' Python state put back."""
        state = _PythonState(self.fn)
        try:
            with protocol.capturing_as_on_gpu(True):
                return self.run(*args)
        finally:
            state.restore()


def _as_read(static: torch.Tensor, arg: torch.Tensor) -> torch.Tensor:
    """The argument ``arg`` as the graph reads it once copied into ``static``: ``static``
    itself or, where ``copy_`` broadcast a smaller argument, the view of ``static``
    that holds the argument's values (index 0 of the broadcast dimensions)."""
    if arg.shape == static.shape:
        return static
    lead = (0,) * (static.dim() - arg.dim())
    return static[lead + tuple(slice(0, n) for n in arg.shape)]


class _PythonState:
    """What a shadow's Python may change in the objects a graphed callable is bound to:
    a module and its submodules, a method's object (and its submodules if it is a
    module), and the modules a function refers to (closure or globals). Saved: their
    attribute bindings and the contents of the dicts, lists and sets they hold (a
    module's parameter, buffer and submodule tables among them); ``restore`` puts them
    back, so a counter the callable advances stays where a run without shadows leaves
    it (replays run no Python). Not saved: other objects, globals and closure variables
    themselves, containers nested deeper; a shadow changes them as the callable's Python
    does."""

    def __init__(self, fn: Any) -> None:
        self.saved = []
        for obj in _bound_objects(fn):
            attrs = vars(obj)
            contents = [(c, c.copy()) for c in attrs.values() if isinstance(c, (dict, list, set))]
            self.saved.append((attrs, dict(attrs), contents))

    def restore(self) -> None:
        # Put back unconditionally: comparing would call the values' __eq__ (tensors').
        for attrs, bindings, contents in self.saved:
            attrs.clear()
            attrs.update(bindings)
            for container, copy in contents:
                if isinstance(container, list):
                    container[:] = copy
                else:
                    container.clear()
                    container.update(copy)


def _bound_objects(fn: Any) -> list[Any]:
    """The objects ``_PythonState`` keeps for callable ``fn``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if isinstance(fn, torch.nn.Module):
        return list(fn.modules())
    if inspect.ismethod(fn):
        owner = fn.__self__
        return list(owner.modules()) if isinstance(owner, torch.nn.Module) else [owner] if hasattr(owner, "__dict__") else []
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    values = [fn.__globals__.get(n) for n in code.co_names]
    for cell in fn.__closure__ or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # a cell not yet bound
            pass
    found: dict[int, Any] = {}
    for value in values:
        if isinstance(value, torch.nn.Module):
            found.update((id(m), m) for m in value.modules())
    return list(found.values())


# ---------------------------------------------------------------- installation

_SURFACE: dict[str, Any] = {
    "CUDAGraph": EmulatedCUDAGraph,
    "graph": graph,
    "graph_pool_handle": graph_pool_handle,
    "make_graphed_callables": make_graphed_callables,
    "is_current_stream_capturing": is_current_stream_capturing,
    "Stream": EmulatedStream,
    "Event": EmulatedEvent,
    "stream": stream,
    "current_stream": current_stream,
    "default_stream": default_stream,
    "set_stream": set_stream,
    "synchronize": synchronize,
}


_install_lock = threading.Lock()
_installed: list[tuple[Any, str, Any, bool]] = []  # (owner, name, saved value, had it) while emulating
_depth = 0  # blocks open, all threads together


def _surface() -> Iterator[tuple[Any, str, Any]]:
    import torch.cuda.graphs as graphs_module

    for name, value in _SURFACE.items():
        yield torch.cuda, name, value
    for name in ("CUDAGraph", "graph", "graph_pool_handle"):
        yield graphs_module, name, _SURFACE[name]
    yield from emulated_device.patches()


@contextlib.contextmanager
def emulate_cuda(force: bool = False) -> Iterator[bool]:
    """Emulate the CUDA device and its graph primitive on the CPU for the block.

    Installs the emulated primitive and its stand-ins in ``torch.cuda`` and the emulated
    device (``runtime.device``: device arguments naming ``cuda`` mean the CPU, the
    ``torch.cuda`` queries answer for one device). On a machine with a usable CUDA
    device nothing is installed unless ``force``; the block's value says whether
    emulation is on. Blocks nest, on one thread or several (the ``torch.cuda``
    attributes are shared, the device mode is per thread); everything is restored when
    the outermost block exits.
    """
    global _depth
    with _install_lock:
        real = not _depth and not force and torch.cuda.is_available()
        if not real:
            if not _depth:
                for owner, name, value in _surface():
                    _installed.append((owner, name, getattr(owner, name, None), name in vars(owner)))
                    setattr(owner, name, value)
            _depth += 1
    if real:
        yield False
        return
    mode = emulated_device.push_mode()
    try:
        yield True
    finally:
        if mode is not None:
            emulated_device.remove_mode(mode)
        with _install_lock:
            _depth -= 1
            if not _depth:
                while _installed:
                    owner, name, value, had = _installed.pop()
                    if had:
                        setattr(owner, name, value)
                    else:
                        delattr(owner, name)


__all__ = [
    "BorrowedTensors",
    "EmulatedCUDAGraph",
    "EmulatedEvent",
    "EmulatedStream",
    "RecordedCall",
    "ReplayKind",
    "emulate_cuda",
    "graph",
    "graph_pool_handle",
    "is_current_stream_capturing",
    "make_graphed_callables",
    "owned_by",
    "poison_storage",
    "poison_value",
]
