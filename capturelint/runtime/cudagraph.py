"""The emulated ``torch.cuda.CUDAGraph``: capture and replay.

A capture records the dispatcher calls under a ``TorchDispatchMode`` (``RecordedCall``),
undoes their writes at its end and poisons what they allocated; a replay re-issues
them on the capture-time tensors. The semantics are ``runtime.emulated``'s docstring;
the memory a graph borrows is ``runtime.lifetimes``, its private pool
``runtime.pool``, its streams ``runtime.streams``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
from typing import Any, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from capturelint.runtime import frames, holders, protocol, training
from capturelint.runtime.lifetimes import (
    BorrowedTensors,
    StorageId,
    alias_of,
    announce_host_state,
    announce_rebound,
    graph_aliases,
    graph_owned,
    map_tensors,
    poison_freed,
    poison_unguarded,
)
from capturelint.runtime.pool import PoolAllocation, PoolHandle, PrivatePool, graph_pool_handle, private_pool
from capturelint.runtime.protocol import HostSyncEvent, HostSyncInCaptureError
from capturelint.runtime.schema import ReplayKind, call_through, op_info
from capturelint.runtime.streams import EmulatedStream, stream_stack, ticks


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

    active = True  # False while handed over (``_stash_modes``)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in protocol.HOST_READ_METHODS and self.active:
            raise HostSyncInCaptureError(HostSyncEvent(f"Tensor.{name}()", frames.user_frame(2),
                                                        stack=frames.user_stack(2)))
        return func(*args, **(kwargs or {}))


class _RecordingMode(TorchDispatchMode):
    """Records the dispatcher calls of one capture and what they allocate and write."""

    def __init__(self, graph: "EmulatedCUDAGraph | None"):
        super().__init__()
        self.graph = graph  # None while handed over (``_stash_modes``): it passes calls through

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Without this torch wraps __torch_dispatch__ in a disable-dynamo guard costing
        # ~20 us per recorded op; captures never run under torch.compile.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        info = op_info(func)
        if info.decomposes:  # under inference mode: record what it decomposes into (runtime.schema)
            with self:
                return func.decompose(*args, **kwargs)
        reason = protocol.host_sync_reason(func, args, kwargs)
        if reason is not None:
            raise HostSyncInCaptureError(HostSyncEvent(reason, frames.user_frame(2), stack=frames.user_stack(2)))
        g = self.graph
        if g is None:
            return func(*args, **kwargs)
        if info.wraps is not None and info.records_through(g.info.breaks_eager):
            return call_through(self, func, args, kwargs)  # a GPU records the kernels the op launches
        for t in info.written(args, kwargs):
            g._before_write(t)
        for value in itertools.chain(args, kwargs.values()):
            if isinstance(value, torch.Tensor):
                g._seen(value)
            elif isinstance(value, (list, tuple)):
                for t in value:
                    if isinstance(t, torch.Tensor):
                        g._seen(t)
        stream = stream_stack[-1]
        if stream is not g._origin:
            g._side_stream_op(stream, info, args, kwargs)
        out = func(*args, **kwargs)
        if self.graph is not g:
            # The capture ended inside this call: an eager break entered from inside the
            # op (its implementation is a break). On a GPU the op's kernels ran eagerly,
            # between two captured segments: no graph records it, and what it produced is
            # memory from outside the next segment.
            return out
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor):
                g._produced(o)
        if info.replay is not ReplayKind.SKIP:
            refresh = info.fresh_outputs(out) if info.replay is ReplayKind.COPY_OUT else []
            if g._pool_model is not None:
                # Hold graph-pool tensors through aliases, so that the pool model tells
                # when the program drops one (``PrivatePool.sweep``).
                args, kwargs = map_tensors(g._hold, args), map_tensors(g._hold, kwargs)
                refresh = [g._hold(t) for t in refresh]
            g._calls.append(RecordedCall(func, args, kwargs, refresh, info.replay))
        return out



bare_ids = itertools.count(1 << 40)
# Bare graphs captured at one line (a loop over batch sizes, make_graphed_callables with a
# tuple) are told apart by their order: the second is cudagraph#2@file:line. Counted
# afresh in each outermost emulate_cuda() block, so that a check labels alike every time.
line_captures: dict[tuple[str, int], int] = {}
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


def _modes_stashed(modes: list[Any]) -> bool:
    """Whether a capture's recording mode is off the dispatch mode stack: torch stashed
    it while dispatching the op the caller runs inside."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return not any(m is modes[1] for m in _get_current_dispatch_mode_stack())


def _stash_modes(modes: list[Any]) -> None:
    """Keep an ended capture's stashed modes (``capture_end``) for the next capture on
    this thread."""
    stashed = getattr(_adoption, "stashed", None)
    if stashed is None:
        stashed = _adoption.stashed = []
    stashed.append(modes)


def _take_stashed_modes() -> list[Any] | None:
    """The modes of a capture that ended inside the op being dispatched, for a capture
    that begins inside the same op (``capture_begin``); None where there are none."""
    stashed = getattr(_adoption, "stashed", None)
    while stashed:
        modes = stashed.pop()
        if _modes_stashed(modes):
            return modes
        # pushed back by now (the op returned with no capture begun in it): a retired
        # mode, passing calls through, which leaves the stacks where it can
        _retire(modes)
    return None


def _retire(modes: list[Any]) -> None:
    """Pop retired stashed modes where they are on top of their stacks."""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    dispatch, function = _get_current_dispatch_mode_stack(), _get_current_function_mode_stack()
    if dispatch and dispatch[-1] is modes[1] and function and function[-1] is modes[0]:
        modes[1].__exit__(None, None, None)
        modes[0].__exit__(None, None, None)


class EmulatedCUDAGraph:
    """``torch.cuda.CUDAGraph`` on a CPU; see ``runtime.emulated``'s docstring for its semantics."""

    def __init__(self, keep_graph: bool = False):
        self._calls: list[RecordedCall] = []
        self._pool: PoolHandle | None = None
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
        # A bare graph's pool model (``runtime.emulated``'s docstring): its allocations in capture
        # order, and the aliases through which it holds them.
        self._pool_model: PrivatePool | None = None
        # an owned graph whose runtime shares pools as a bare graph does (a graphed
        # callable, ``_Graphed``): its pool is modelled too
        self.pool_modelled = False
        self._pool_allocations: list[PoolAllocation] = []
        self._held: dict[StorageId, int] = {}
        # Streams and events (``runtime.emulated``'s docstring): the stream the capture began on,
        # the streams forked into it (and the line that forked each).
        self._origin: EmulatedStream | None = None
        self._forks: dict[EmulatedStream, protocol.Frame] = {}
        self._begun_at = protocol.UNKNOWN_FRAME
        self._outsiders: set[EmulatedStream] = set()  # streams outside the capture that got work in it
        self._training: training.Watch | None = None  # a captured training step's state (runtime.training)
        # what the captured code stored on the program's objects (CL116): where each
        # storage the capture allocated was made, then the holders it filled
        self._made: dict[StorageId, tuple] = {}
        self._stored: list[tuple[holders.Holder, protocol.Frame]] = []

    @property
    def where(self) -> tuple[protocol.GraphInfo, int]:
        """The graph and segment this capture is, as findings name them."""
        return self.owner if self.owner is not None else (self.info, 0)

    @property
    def capturing(self) -> bool:
        return bool(self._recording)

    @property
    def info(self) -> protocol.GraphInfo:
        if self.owner is not None:
            return self.owner[0]
        if self._info is None:
            where = self._where or protocol.UNKNOWN_FRAME
            n = line_captures[(where.file, where.line)] = line_captures.get((where.file, where.line), 0) + 1
            label = f"cudagraph{f'#{n}' if n > 1 else ''}@{where.location}"
            self._info = protocol.GraphInfo(next(bare_ids), label, str(protocol.CUDAGraphMode.FULL), False,
                                             protocol.BreakOutputs.DISCARD, False)
        return self._info

    # -- capture
    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        if self._recording:
            raise RuntimeError("capture_begin called twice without capture_end")
        if self._captured:
            raise RuntimeError("this graph was already captured; call reset() first")
        self._pool = PoolHandle(pool) if pool is not None else graph_pool_handle()
        if self.owner is None:
            self._where = frames.user_frame(2)
        if self.owner is None or self.pool_modelled:
            self._pool_model = private_pool(self._pool)
            self._pool_model.begin(self)
        origin = self._origin = stream_stack[-1]
        origin._capture, origin._seen = self, {}
        self._begun_at = self._where or frames.user_frame(2)
        handed = _take_stashed_modes()
        if handed is not None:
            # inside the dispatch of an op whose capture ended in it (see capture_end):
            # torch pushes that capture's modes back when the op returns, so this capture
            # records through them, from where they stand on the stacks
            handed[0].active, handed[1].graph = True, self
            self._recording = handed
        else:
            modes = [_HostReadGuard(), _RecordingMode(self)]
            for m in modes:
                m.__enter__()
            self._recording = modes
        protocol.capturing_as_on_gpu(True).__enter__()
        if self.owner is None:
            protocol.announce("on_graph_begin", self.info, protocol.Phase.CAPTURE)
        self._training = training.capture_begun(self)

    def capture_end(self, check_joined: bool = True) -> None:
        """End the capture. As ``cudaStreamEndCapture``, it fails when a stream forked
        into the capture was not joined back (unless ``check_joined`` is false: the
        capture is being abandoned on another error)."""
        if not self._recording:
            raise RuntimeError("capture_end called without capture_begin")
        protocol.capturing_as_on_gpu(True).__exit__(None, None, None)
        if _modes_stashed(self._recording):
            # An eager break entered from inside a dispatched op (vLLM's
            # ``sparse_attn_indexer`` op is itself a break): torch took this capture's
            # modes off its stacks for the op's dispatch and pushes them back when the op
            # returns, so they cannot be popped here. They pass calls through until the
            # capture that begins next in the op adopts them (the break's new segment).
            self._recording[0].active, self._recording[1].graph = False, None
            _stash_modes(self._recording)
        else:
            for m in reversed(self._recording):
                m.__exit__(None, None, None)
        self._recording = []
        self._captured = True
        if self.owner is None:
            protocol.announce("on_graph_end", self.info, protocol.Phase.CAPTURE, None)
        self._settle()
        training.capture_ended(self._training, self._allocated)
        self._replays = 0
        if self.owner is None and protocol.has_observers():
            inputs = [sid for sid in self._borrowed.storages() if sid not in graph_owned]
            found = holders.discover(inputs + list(self._allocated))
            protocol.announce("on_graph_names", self.info, found.names())
            self._holders = found.only(inputs) if inputs else None
            self._stored = holders.stored(found.only(self._allocated), self._made)
        self._made = {}
        if self._pool_model is not None:
            self._pool_model.end()
        origin, forks = self._origin, self._forks
        unjoined = [(s, frame) for s, frame in forks.items() if origin._seen.get(s, -1) < s._tick]
        for s in (origin, *forks):
            s._capture = None
        self._forks, self._outsiders = {}, set()
        if unjoined and check_joined:
            stream, forked = unjoined[0]
            info, segment = self.where
            raise protocol.StreamCaptureError(protocol.StreamCaptureEvent(
                protocol.StreamHazard.UNJOINED, forked, frames.user_frame(2), info, segment,
                op="capture_end", stream=stream.describe()))

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
            if self.owner is None and protocol.has_observers():
                self._made[sid] = frames.user_codes(2)
            if self._pool_model is not None:
                self._pool_model.allocate(self, st, stream_stack[-1])

    def _hold(self, t: torch.Tensor) -> torch.Tensor:
        """What a recorded call keeps of ``t``: an alias when it is graph-pool memory."""
        sid = t.untyped_storage()._cdata
        if sid not in self._allocated:
            return t
        with _disable_current_modes():
            alias = alias_of(t)
        self._held[sid] = self._held.get(sid, 0) + 1
        graph_aliases[sid] = graph_aliases.get(sid, 0) + 1
        return alias

    def _side_stream_op(self, stream: "EmulatedStream", info: Any, args: tuple, kwargs: dict) -> None:
        """An op on another stream than the capture's own. On a stream forked into this
        capture, it is work to join back, and the graph-pool tensors it reads that another
        stream allocated are side uses (``record_stream``). On a stream outside the capture
        a GPU runs it once, eagerly, and leaves it out of the graph: announced once per
        stream (the emulation still records it)."""
        if stream._capture is not self:
            if stream not in self._outsiders:
                self._outsiders.add(stream)
                info_, segment = self.where
                protocol.announce("on_stream_hazard", protocol.StreamCaptureEvent(
                    protocol.StreamHazard.UNCAPTURED, frames.user_frame(3), self._begun_at, info_, segment,
                    op=info.name, stream=stream.describe()))
            return
        stream._tick = next(ticks)
        if self._pool_model is None:
            return
        live, frame = self._pool_model.live, None
        for value in itertools.chain(args, kwargs.values()):
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(t, torch.Tensor):
                    alloc = live.get(t.untyped_storage()._cdata)
                    if alloc is not None and alloc.stream is not stream:
                        frame = frame or frames.user_frame(3)
                        alloc.side_uses[stream] = (stream._tick, frame, info.name)

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
                poison_unguarded(st, dtype)

            def own(x: Any) -> Any:
                if isinstance(x, torch.Tensor) and x.untyped_storage()._cdata in self._allocated:
                    return x  # graph-pool memory: the graph owns it
                return self._borrowed.borrow(x)

            for c in self._calls:
                c.args = map_tensors(own, c.args)
                c.kwargs = map_tensors(own, c.kwargs)
        self._borrowed.done()
        for sid in self._allocated:
            graph_owned[sid] = graph_owned.get(sid, 0) + 1
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
        if self._training is not None:
            self._training.before_replay(frames.user_frame(2))
        if self._holders is not None:
            self._holders.refresh()  # before looking for freed inputs: a stale snapshot holds old locals
        poison_freed(self._borrowed, self.info, segment, self.poisoned, self._holders)
        if self._holders is not None:
            announce_rebound(self._holders, self.info, segment, self._replays)
        if self._stored:
            self._stored = announce_host_state(self._stored, self.info, self._replays)
        with torch.no_grad():
            for c in self._calls:
                out = c.func(*c.args, **c.kwargs)
                if c.outputs:
                    for dst, src in zip(c.outputs, op_info(c.func).fresh_outputs(out)):
                        dst.copy_(src)
        if self._pool_model is not None:
            self._pool_model.replayed(self, frames.user_frame(2))
        if bare:
            protocol.announce("on_graph_end", self.info, protocol.Phase.REPLAY, None)

    def reset(self) -> None:
        self._holders = None
        self._stored = []
        self._borrowed.release()
        for sid, n in self._held.items():
            left = graph_aliases.get(sid, 0) - n
            if left > 0:
                graph_aliases[sid] = left
            else:
                graph_aliases.pop(sid, None)
        self._held = {}
        if self._pool_model is not None:
            self._pool_model.forget(self)
            self._pool_model, self._pool_allocations = None, []
        if self._captured:
            for sid in self._allocated:
                left = graph_owned.get(sid, 0) - 1
                if left > 0:
                    graph_owned[sid] = left
                else:
                    graph_owned.pop(sid, None)
        self._calls = []
        self._allocated = {}
        self._captured = False

    def __del__(self) -> None:
        try:
            self.reset()
        except Exception:
            pass

    def pool(self) -> PoolHandle:
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


def is_current_stream_capturing() -> bool:
    return protocol.stream_capturing()

