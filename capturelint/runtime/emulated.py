"""An emulated ``torch.cuda.CUDAGraph`` with a GPU's capture semantics, on a CPU.

**Idea.** A CUDA graph records kernels with frozen pointers and frozen arguments and
replays them without Python. On a CPU the emulated primitive records the dispatcher
calls of a capture under a ``TorchDispatchMode`` and re-issues them on the capture-time
tensors at replay, so a stale read or a baked branch corrupts outputs on a CPU exactly
as it would on a GPU.

**What is built.** ``EmulatedCUDAGraph`` (``capture_begin(pool=...)``,
``capture_end``, ``replay``, ``reset``, ``pool``), ``graph`` (the
``torch.cuda.graph`` context manager), ``graph_pool_handle`` and the private pools'
model (``PrivatePool``), stream and event stand-ins, ``Tensor.record_stream``,
``make_graphed_callables`` (forward graphs, and backward graphs in training), and ``emulate_cuda()``, which
installs all of them in ``torch.cuda`` on a machine without CUDA, with the emulated
CUDA device of ``runtime.device`` (``.cuda()``, ``device="cuda"`` and the
``torch.cuda`` queries on the CPU), so that unmodified code written for a GPU runs.

**Who announces what.** A bare graph announces its own capture and replays to the
observers of ``protocol`` as an unsegmented graph: it keeps no Python, so its replays
get no shadow. A graphed callable (``make_graphed_callables``) keeps the callable, so
it announces a graph of one captured segment whose every replay offers a shadow, as a
breakable runtime's graph does (``_Graphed``); in training its backward graph keeps no
Python and announces itself as a bare graph (``graphed NAME backward@FILE:LINE``).

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

**A capture may end and begin inside a dispatched op.** A breakable runtime whose eager
break is the implementation of a ``torch.ops`` op (vLLM's ``sparse_attn_indexer``) ends
its segment while torch dispatches that op, with the capture's modes off torch's mode
stacks (torch pushes them back when the op returns). ``capture_end`` then leaves them
where they are, passing calls through, and the next ``capture_begin`` inside the op
records through them; the op itself is recorded by neither capture: on a GPU it ran
eagerly, between the two.

**Graphs that share a pool share memory.** PyTorch's caching allocator serves a
capture's allocations from a graph-private pool; captures given the same pool
(``pool=g1.pool()``, ``graph_pool_handle()``, a tuple handed to
``make_graphed_callables``) share it, and "within the private pool, allocations are
freed and reassigned as usual during capture" (c10/cuda/CUDACachingAllocator.cpp, Note
[Interaction with CUDA graph capture]). So a later capture gets the blocks an earlier
one freed, while that earlier graph's replays still write them; PyTorch's notes
("Sharing memory across captures") call sharing safe only for graphs "always replayed
in the same order they were captured, and never concurrently". ``PrivatePool`` models
the pool of every handle that bare graphs capture into, after the allocator:

- a request is rounded up to a multiple of 512 bytes (``kMinBlockSize``); up to 1 MiB
  it is *small* (``kSmallSize``) and served from 2 MiB segments (``kSmallBuffer``),
  under 10 MiB from 20 MiB segments (``kLargeBuffer``), from 10 MiB on from a segment
  of its size rounded up to 2 MiB (``get_allocation_size``);
- a request takes the best fit among the free blocks of its pool (small or large) and
  stream: the smallest block that fits, the lowest address among equals
  (``get_free_block``'s ``lower_bound`` over blocks ordered by stream, size, address);
  a block freed on one stream serves that stream only;
- the block is split when the rest is worth keeping (at least 512 bytes in the small
  pool, more than 1 MiB in the large one: ``should_split``), and a freed block merges
  with free neighbours of its segment (``free_block``);
- a storage a capture produces is allocated when the op returns, and freed when
  nothing outside the graphs references it any more (graphs hold their pool tensors
  through aliases that are not counted), during a capture or between captures: live
  tensors, a graph's outputs the program keeps, keep their blocks;
- a tensor a capture frees while ``record_stream`` named another stream is freed when
  the capture ends (the allocator defers it: ``needs_events_deferred_until_no_capture``).

At each replay of a graph the bytes of every block its capture used, freed or not,
are copied into the live tensors of other graphs that overlap them, as the GPU kernels
would write them, and ``on_pool_overwrite`` announces each (CL111 reports a read of
them before their own graph replays again). Addresses are virtual: only overlaps
matter. Not modelled: expandable segments, ``max_split_size``,
``roundup_power2_divisions``, the pools of graphs a breakable runtime owns (capturelint's,
vLLM's: their segments are not bare graphs), and allocations outside captures (the
default pools, which never overlap a private one).

**Streams and events, as a capture sees them.** A capture begins on the current stream
(``torch.cuda.graph`` makes a capture stream, shared by every ``graph`` as in PyTorch,
current for the block). A stream joins the capture by waiting on an event recorded in
it (``side.wait_stream(current)``: a fork) and must be joined back (the capture stream
waits on an event recorded on it after its last work) before ``capture_end``, or the
capture fails as ``cudaStreamEndCapture`` does (``cudaErrorStreamCaptureUnjoined``).
An event remembers the capture that recorded it: a record in a capture is a node
internal to the graph, and replays do not record the event again (only an
``Event(external=True)`` is recorded by each replay), so waiting on it from outside that capture (an eager break, after the graph,
another captured segment), making a capturing stream wait on an event recorded outside
it, or synchronizing with or querying a captured event from the host raise
``StreamCaptureError``, as CUDA refuses them ("It is invalid to merge two separate
capture graphs by waiting on a captured event ... It is invalid to wait on a
non-captured event from a stream which is being captured without specifying the
cudaEventWaitExternal flag": CUDA Programming Guide, stream capture). An op on a
forked stream that reads a graph-pool tensor another stream allocated is a side use:
when the tensor is freed without ``record_stream`` and the pool hands its block to a
stream that has not waited on the side stream since, ``on_stream_hazard`` announces the
race (CUDA does not refuse it). ``Event(external=True)`` is exempt from the refusals.

An op issued during a capture on a stream that takes no part in it (never forked from
the capture stream) runs, on a GPU, once and eagerly, outside the graph (on the legacy
default stream CUDA refuses it): ``on_stream_hazard`` announces it, once per stream.

Limitations: streams and events are sequential stand-ins (no concurrency is emulated:
a missing wait is seen only where CUDA refuses it or where it frees memory); an op on a
stream outside the capture is still recorded and replayed; Python garbage held in
reference cycles counts as a live reference until collected.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import inspect
import itertools
import threading
import weakref
from typing import Any, Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from capturelint.runtime import device as emulated_device
from capturelint.runtime import frames, holders, protocol, training, unchecked
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
        for t in info.written(args, kwargs):
            g._before_write(t)
        for value in itertools.chain(args, kwargs.values()):
            if isinstance(value, torch.Tensor):
                g._seen(value)
            elif isinstance(value, (list, tuple)):
                for t in value:
                    if isinstance(t, torch.Tensor):
                        g._seen(t)
        stream = _current_stream[-1]
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
                args, kwargs = _map_tensors(g._hold, args), _map_tensors(g._hold, kwargs)
                refresh = [g._hold(t) for t in refresh]
            g._calls.append(RecordedCall(func, args, kwargs, refresh, info.replay))
        return out


# ---------------------------------------------------------------- the pool model

# The caching allocator's sizes (c10/cuda/CUDACachingAllocator.cpp).
MIN_BLOCK = 512  # kMinBlockSize: every request is rounded up to a multiple of 512 bytes
SMALL_SIZE = 1 << 20  # kSmallSize: requests up to 1 MiB are "small", served from the small pool
SMALL_BUFFER = 2 << 20  # kSmallBuffer: small requests are packed into 2 MiB segments
LARGE_BUFFER = 20 << 20  # kLargeBuffer: requests between 1 and 10 MiB share 20 MiB segments
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
ROUND_LARGE = 2 << 20  # kRoundLarge: larger requests get a segment of their size rounded up to 2 MiB


def round_size(nbytes: int) -> int:
    """The block size the allocator serves a request of ``nbytes`` with (``round_size``)."""
    return MIN_BLOCK if nbytes < MIN_BLOCK else MIN_BLOCK * ((nbytes + MIN_BLOCK - 1) // MIN_BLOCK)


def segment_size(size: int) -> int:
    """The segment the allocator reserves (``cudaMalloc``) when no free block fits a
    block of ``size`` bytes (``get_allocation_size``)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((size + ROUND_LARGE - 1) // ROUND_LARGE)


@dataclasses.dataclass(eq=False)
class Block:
    """A block of a segment: ``[ptr, ptr + size)``, allocated or free. ``prev`` and
    ``next`` are its neighbours in the segment (a block is split off a larger one and
    merged back when both are free). A free block serves requests on ``stream`` only."""

    ptr: int
    size: int
    stream: Any
    small: bool
    prev: "Block | None" = None
    next: "Block | None" = None
    allocated: bool = False


@dataclasses.dataclass(eq=False)
class PoolAllocation:
    """A storage a capture allocated in a private pool, at ``[ptr, ptr + nbytes)`` of a
    block of ``size`` bytes (``block`` while allocated: a freed block is merged and
    split again). ``storage`` keeps the memory alive while the pool models it; ``info``
    and ``segment`` are the capture's graph; ``producer`` the line that allocated it.
    ``side_uses`` are the reads by other streams than ``stream`` during the capture
    (stream -> tick, line, op), ``recorded`` the streams ``record_stream`` named."""

    block: Block
    ptr: int
    size: int
    sid: StorageId
    storage: torch.UntypedStorage
    nbytes: int
    stream: Any
    info: protocol.GraphInfo
    segment: int
    side_uses: dict[Any, tuple[int, protocol.Frame, str]] = dataclasses.field(default_factory=dict)
    recorded: set = dataclasses.field(default_factory=set)


@dataclasses.dataclass(frozen=True)
class _Pending:
    """Memory freed while a side stream may still read it (no ``record_stream``): an
    allocation on a stream that has not waited on ``stream`` since ``tick`` races it."""

    ptr: int
    size: int
    stream: Any
    tick: int
    frame: protocol.Frame
    op: str
    sid: StorageId
    info: protocol.GraphInfo
    segment: int


class PrivatePool:
    """The caching allocator's private pool of one ``graph_pool_handle()``, as the
    captures that share it see it (see the module docstring, **Graphs that share a
    pool share memory**). Addresses are virtual: only overlaps matter."""

    _bases = itertools.count(1)

    def __init__(self, handle: tuple) -> None:
        self.handle = handle
        self.free: list[Block] = []
        self.live: dict[StorageId, PoolAllocation] = {}
        self.graphs: list[Any] = []  # weak references to the graphs captured into it, in capture order
        self.capturing: "EmulatedCUDAGraph | None" = None
        self.deferred: list[PoolAllocation] = []  # freed in a capture with record_stream: freed at its end
        self.pending: list[_Pending] = []
        self._top = next(self._bases) << 40

    # -- the allocator
    def malloc(self, nbytes: int, stream: Any) -> Block:
        """A block for ``nbytes`` on ``stream``: the best fit (smallest, then lowest
        address) among the free blocks of the request's pool and stream, split when
        the rest is worth keeping; a new segment when none fits."""
        size, small = round_size(nbytes), round_size(nbytes) <= SMALL_SIZE
        fits = [b for b in self.free if b.small is small and b.stream is stream and b.size >= size]
        if fits:
            block = min(fits, key=lambda b: (b.size, b.ptr))
            self.free.remove(block)
        else:
            block = Block(self._top, segment_size(size), stream, small)
            self._top += block.size
        rest = block.size - size
        if rest >= MIN_BLOCK if small else rest > SMALL_SIZE:  # should_split
            tail = Block(block.ptr + size, rest, stream, small, block, block.next)
            if block.next is not None:
                block.next.prev = tail
            block.next, block.size = tail, size
            self.free.append(tail)
        block.allocated = True
        return block

    def free_block(self, block: Block) -> None:
        """Return ``block`` to the pool, merged with its free neighbours (``free_block``)."""
        block.allocated = False
        for other in (block.prev, block.next):
            if other is not None and not other.allocated and other in self.free:
                self.free.remove(other)
                if other is block.prev:
                    block.ptr, block.prev = other.ptr, other.prev
                    if other.prev is not None:
                        other.prev.next = block
                else:
                    block.next = other.next
                    if other.next is not None:
                        other.next.prev = block
                block.size += other.size
        self.free.append(block)

    # -- what captures do
    def allocate(self, graph: "EmulatedCUDAGraph", storage: torch.UntypedStorage, stream: Any) -> PoolAllocation | None:
        """``graph``'s capture produced ``storage`` on ``stream``: place it."""
        nbytes = storage.nbytes()
        if nbytes == 0:
            return None  # the allocator hands out no block for an empty tensor
        self.sweep()
        block = self.malloc(nbytes, stream)
        if self.pending:
            self._check_pending(block, stream)
        info, segment = graph.where
        alloc = PoolAllocation(block, block.ptr, block.size, storage._cdata, storage, nbytes, stream, info, segment)
        self.live[alloc.sid] = alloc
        graph._pool_allocations.append(alloc)
        return alloc

    def sweep(self) -> None:
        """Free the blocks of the storages that nothing outside the graphs holds any more."""
        for sid, alloc in list(self.live.items()):
            if _outside_references(sid) > 0:
                continue
            del self.live[sid]
            if self.capturing is not None and alloc.recorded - {alloc.stream}:
                self.deferred.append(alloc)  # record_stream: freed when the capture ends
                continue
            for s, (tick, frame, op) in alloc.side_uses.items():
                if s not in alloc.recorded:
                    self.pending.append(_Pending(alloc.ptr, alloc.size, s, tick, frame, op, sid,
                                                 alloc.info, alloc.segment))
            self.free_block(alloc.block)

    def _check_pending(self, block: Block, stream: Any) -> None:
        end = block.ptr + block.size
        kept = []
        for p in self.pending:
            if p.ptr >= end or block.ptr >= p.ptr + p.size:
                kept.append(p)
            elif stream._seen.get(p.stream, -1) < p.tick:
                event = protocol.StreamCaptureEvent(
                    protocol.StreamHazard.FREED_IN_USE, p.frame, frames.user_frame(2), p.info, p.segment,
                    op=p.op, stream=p.stream.describe(), storage=p.sid)
                protocol.announce("on_stream_hazard", event)
        self.pending = kept

    def begin(self, graph: "EmulatedCUDAGraph") -> None:
        self.sweep()
        self.capturing = graph
        self.graphs = [r for r in self.graphs if r() is not None and r() is not graph] + [weakref.ref(graph)]

    def end(self) -> None:
        self.capturing = None
        self.pending = []
        for alloc in self.deferred:
            self.free_block(alloc.block)
        self.deferred = []

    def replayed(self, graph: "EmulatedCUDAGraph", replay_frame: protocol.Frame) -> None:
        """After ``graph``'s replay: it rewrote every block its capture used, freed or
        not. Copy those bytes into the live tensors of other graphs that the allocator
        placed over its freed blocks, and announce each."""
        if not any(a.info is not graph.info for a in self.live.values()):
            return
        self.sweep()
        overwritten: dict[tuple[StorageId, StorageId], int] = {}
        with _disable_current_modes(), torch.no_grad():
            for w in graph._pool_allocations:
                for v in self.live.values():
                    lo, hi = max(w.ptr, v.ptr), min(w.ptr + w.nbytes, v.ptr + v.nbytes)
                    if v.info is graph.info or lo >= hi:
                        continue
                    _bytes(v.storage, lo - v.ptr, hi - lo).copy_(_bytes(w.storage, lo - w.ptr, hi - lo))
                    key = (v.sid, w.sid)
                    overwritten[key] = overwritten.get(key, 0) + hi - lo
        for (sid, writer_sid), n in overwritten.items():
            victim = self.live[sid]
            protocol.announce("on_pool_overwrite", protocol.PoolOverwriteEvent(
                victim.info, sid, graph.info, writer_sid, replay_frame, n))

    def forget(self, graph: "EmulatedCUDAGraph") -> None:
        """``graph`` was reset: its replays write nothing any more."""
        self.graphs = [r for r in self.graphs if r() is not None and r() is not graph]
        if not self.graphs and self.capturing is None:
            _pools.pop(self.handle, None)


def _bytes(storage: torch.UntypedStorage, start: int, n: int) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage, start, (n,), (1,))


_pools: dict[tuple, PrivatePool] = {}


def private_pool(handle: tuple) -> PrivatePool:
    """The pool model of ``handle`` (made on first use)."""
    pool = _pools.get(tuple(handle))
    if pool is None:
        pool = _pools[tuple(handle)] = PrivatePool(tuple(handle))
    return pool


# --------------------------------------------------------------------- the graph


class _PoolHandle(tuple):
    """An opaque memory-pool handle, as ``torch.cuda.graph_pool_handle()`` returns."""


_pool_ids = itertools.count(1)


def graph_pool_handle() -> _PoolHandle:
    """A new memory-pool handle to share between graphs (emulated: an id)."""
    return _PoolHandle((0, next(_pool_ids)))


_bare_ids = itertools.count(1 << 40)
# Bare graphs captured at one line (a loop over batch sizes, make_graphed_callables with a
# tuple) are told apart by their order: the second is cudagraph#2@file:line. Counted
# afresh in each outermost emulate_cuda() block, so that a check labels alike every time.
_line_captures: dict[tuple[str, int], int] = {}
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
        # A bare graph's pool model (the module docstring): its allocations in capture
        # order, and the aliases through which it holds them.
        self._pool_model: PrivatePool | None = None
        # an owned graph whose runtime shares pools as a bare graph does (a graphed
        # callable, ``_Graphed``): its pool is modelled too
        self.pool_modelled = False
        self._pool_allocations: list[PoolAllocation] = []
        self._held: dict[StorageId, int] = {}
        # Streams and events (the module docstring): the stream the capture began on,
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
            n = _line_captures[(where.file, where.line)] = _line_captures.get((where.file, where.line), 0) + 1
            label = f"cudagraph{f'#{n}' if n > 1 else ''}@{where.file}:{where.line}"
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
        if self.owner is None or self.pool_modelled:
            self._pool_model = private_pool(self._pool)
            self._pool_model.begin(self)
        origin = self._origin = _current_stream[-1]
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
            inputs = [sid for sid in self._borrowed.storages() if sid not in _graph_owned]
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
                self._pool_model.allocate(self, st, _current_stream[-1])

    def _hold(self, t: torch.Tensor) -> torch.Tensor:
        """What a recorded call keeps of ``t``: an alias when it is graph-pool memory."""
        sid = t.untyped_storage()._cdata
        if sid not in self._allocated:
            return t
        with _disable_current_modes():
            alias = _alias(t)
        self._held[sid] = self._held.get(sid, 0) + 1
        _graph_aliases[sid] = _graph_aliases.get(sid, 0) + 1
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
        stream._tick = next(_ticks)
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
            left = _graph_aliases.get(sid, 0) - n
            if left > 0:
                _graph_aliases[sid] = left
            else:
                _graph_aliases.pop(sid, None)
        self._held = {}
        if self._pool_model is not None:
            self._pool_model.forget(self)
            self._pool_model, self._pool_allocations = None, []
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


def poison_freed(borrowed: BorrowedTensors, info: protocol.GraphInfo, segment: int, poisoned: set[StorageId],
                 found: holders.Holders | None = None) -> None:
    """Before a replay: poison every borrowed storage the program has freed, as the
    caching allocator would have reused it, and announce each once, with the holder
    the program re-bound away from it and the line that did, where the capture found
    the holders (``found``: a bare graph's)."""
    for sid, st, dtype in borrowed.freed():
        poison_storage(st, dtype)
        if sid not in poisoned:
            poisoned.add(sid)
            replaced = found.replaced(sid) if found is not None else None
            if replaced is None:
                event = protocol.StaleInputEvent(info, segment, sid, str(dtype).removeprefix("torch."))
            else:
                holder, now = replaced
                event = protocol.StaleInputEvent(info, segment, sid, str(dtype).removeprefix("torch."), holder.label,
                                                 now.untyped_storage()._cdata, holders.rebinding_line(holder))
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


def announce_host_state(stored: list[tuple[holders.Holder, protocol.Frame]], info: protocol.GraphInfo,
                        replay: int) -> list[tuple[holders.Holder, protocol.Frame]]:
    """Before a replay: announce, once per graph, the holders the captured code filled
    (``holders.stored``) that the program has re-bound or emptied since (CL116), and
    return what is left to watch (nothing once announced)."""
    changed = [(h, at, how) for h, at in stored if (how := holders.emptied(h)) is not None]
    if not changed:
        return stored
    holder, at, how = changed[0]
    line = holders.rebinding_line(holder) if how == "re-bound" else None
    replay_at = frames.user_frame(3)
    known = line is not None and line != at  # a class's one assignment may be the captured one itself
    protocol.announce("on_training_hazard", protocol.TrainingHazardEvent(
        protocol.TrainingHazard.HOST_STATE, at, line if known else replay_at, info, holder.label,
        f"replay {replay}", how, count=len(changed), changed_by="re-binding" if known else "", storage=holder.storage))
    return []


def is_current_stream_capturing() -> bool:
    return protocol.stream_capturing()


# ------------------------------------------------------------ streams and events


_ticks = itertools.count(1)  # orders the work of streams taking part in captures


class EmulatedStream:
    """A stream stand-in. Work is sequential on a CPU, so waits only keep the capture
    bookkeeping CUDA keeps (the module docstring, **Streams and events**): which capture
    the stream takes part in (``_capture``), when it last did work there (``_tick``),
    and up to when it has waited on each other stream (``_seen``). The bookkeeping is
    private: break arguments that hold a stream compare its public attributes only."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any):
        self.device = torch.device("cpu")
        self.priority = priority
        self._capture: EmulatedCUDAGraph | None = None
        self._tick = 0
        self._seen: dict[EmulatedStream, int] = {}
        self._made_at = frames.user_frame(2)
        self._label: str | None = None

    def describe(self) -> str:
        return self._label or f"the stream made at {self._made_at.file}:{self._made_at.line}"

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
        _current_stream.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _current_stream.pop()

    @property
    def cuda_stream(self) -> int:
        return id(self)


class EmulatedEvent:
    """An event stand-in that remembers where it was recorded: on which stream, in
    which capture (``capture``: a captured record, which replays do not record again;
    until the event is recorded outside a capture), at which line. Waiting on it across a capture boundary raises
    ``StreamCaptureError`` as CUDA refuses it (the module docstring)."""

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
    def capture(self) -> "EmulatedCUDAGraph | None":
        return self._capture() if self._capture is not None else None

    @capture.setter
    def capture(self, graph: "EmulatedCUDAGraph | None") -> None:
        self._capture = weakref.ref(graph) if graph is not None else None

    def record(self, stream: Any = None) -> None:
        stream = stream if stream is not None else _current_stream[-1]
        self._recorded, self._stream, self.capture = True, stream, None if self._external else stream._capture
        self._frame = frames.user_frame(2)
        if stream._capture is not None:
            stream._tick = self._tick = next(_ticks)
        else:
            self._tick = stream._tick
        self._seen = {**stream._seen, stream: self._tick}

    def wait(self, stream: Any = None) -> None:
        self._waited(stream if stream is not None else _current_stream[-1], frames.user_frame(2), "Event.wait")

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
            stream._capture, stream._seen, stream._tick = mine, {}, next(_ticks)
            mine._forks.setdefault(stream, frame)
        for s, tick in self._seen.items():
            if stream._seen.get(s, -1) < tick:
                stream._seen[s] = tick

    def _refused(self, kind: protocol.StreamHazard, frame: protocol.Frame, op: str, stream: EmulatedStream,
                 theirs: "EmulatedCUDAGraph | None") -> None:
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
    """``torch.cuda.graph``: ``with graph(g, pool=..., stream=...): ...`` captures into
    ``g`` on ``stream`` (default: one capture stream shared by every ``graph``, as in
    PyTorch), which is the current stream inside the block."""

    default_capture_stream: EmulatedStream | None = None

    def __init__(self, cuda_graph: Any, pool: Any = None, stream: Any = None, capture_error_mode: str = "global"):
        if graph.default_capture_stream is None:
            graph.default_capture_stream = EmulatedStream()
            graph.default_capture_stream._label = "torch.cuda.graph's capture stream"
        self.cuda_graph = cuda_graph
        self.pool = pool
        self.stream = stream if stream is not None else graph.default_capture_stream

    def __enter__(self) -> None:
        gc.collect()
        _current_stream.append(self.stream)
        try:
            self.cuda_graph.capture_begin(pool=self.pool)
        except BaseException:
            _current_stream.pop()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.cuda_graph.capture_end(check_joined=exc[0] is None)
        finally:
            _current_stream.pop()


def make_graphed_callables(
    callables: Any, sample_args: Any, num_warmup_iters: int = 3, allow_unused_input: bool = False, pool: Any = None
) -> Any:
    """``torch.cuda.make_graphed_callables``, built as PyTorch builds it: ``sample_args``
    hold tensors only (nested in tuples, lists or dicts); every callable is warmed up,
    then each forward is captured on its sample arguments and, for a callable that
    trains (grad enabled, and a sample argument or a module parameter requiring grad),
    each backward in reverse order (``torch.autograd.grad`` of the outputs with respect
    to the arguments and parameters that require grad, on static output gradients), all
    into one memory pool. A module comes back as itself with its ``forward`` replaced
    (the original runs when its training flag differs from the capture's), a function
    as a new function. A call copies its arguments into the static inputs, replays the
    forward and returns the static outputs (``_Graphed``); in training it is an
    autograd function whose backward copies the incoming gradients into the static
    output gradients and replays the backward graph."""
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
        params = tuple(fn.parameters()) if isinstance(fn, torch.nn.Module) else ()
        surface = tuple(leaves) + params
        training = torch.is_grad_enabled() and any(t.requires_grad for t in surface)
        flat.append((tuple(args), leaves, spec, surface, training))
    mempool = graph_pool_handle() if pool is None else pool
    for fn, (args, _, _, surface, training) in zip(fns, flat):
        for _ in range(num_warmup_iters):
            outputs = [o for o in tree_flatten(fn(*args))[0] if isinstance(o, torch.Tensor) and o.requires_grad]
            if training and outputs:
                torch.autograd.grad(outputs, [t for t in surface if t.requires_grad],
                                    [torch.empty_like(o) for o in outputs], allow_unused=allow_unused_input)
    graphed = []
    for i, (fn, (args, leaves, spec, surface, training)) in enumerate(zip(fns, flat)):
        module = isinstance(fn, torch.nn.Module)
        name = type(fn).__name__ if module else getattr(fn, "__qualname__", type(fn).__name__)
        label = f"graphed {name}" + ("" if single else f"#{i}") + f"@{where.file}:{where.line}"
        g = _Graphed(fn, fn.forward if module else fn, label, leaves, spec)
        g.capture(mempool, args)
        graphed.append(g)
    for g, (_, _, _, surface, training) in reversed(list(zip(graphed, flat))):
        if training:  # backward graphs in reverse order, as PyTorch captures them
            g.capture_backward(mempool, surface, allow_unused_input)
    out = []
    for fn, g in zip(fns, graphed):
        if isinstance(fn, torch.nn.Module):
            fn.forward = g.forward
        out.append(fn if isinstance(fn, torch.nn.Module) else g)
    return out[0] if single else tuple(out)


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
        self.backward_graph: EmulatedCUDAGraph | None = None  # in training (``capture_backward``)
        self._autograd: Any = None

    def _segment(self, phase: protocol.Phase) -> protocol.SegmentInfo:
        return protocol.SegmentInfo(self.info.id, 0, protocol.SegmentKind.CAPTURED, None, phase)

    def capture(self, pool: Any, args: tuple) -> None:
        phase = protocol.Phase.CAPTURE
        with owned_by(self.info, 0):
            self.graph = EmulatedCUDAGraph()
        self.graph.pool_modelled = True  # the callables of one tuple share a pool (CL111)
        protocol.announce("on_graph_begin", self.info, phase)
        protocol.announce("on_segment_begin", self._segment(phase))
        try:
            with graph(self.graph, pool=pool):
                self.static_out = self.fn(*args)
        except HostSyncInCaptureError as e:
            raise HostSyncInCaptureError(dataclasses.replace(e.event, graph=self.info, segment=0)) from None
        protocol.announce("on_segment_end", self._segment(phase))
        protocol.announce("on_graph_end", self.info, phase, self.static_out)

    def capture_backward(self, pool: Any, surface: tuple[torch.Tensor, ...], allow_unused: bool) -> None:
        """Capture the backward graph: the gradients of the outputs that require grad
        with respect to the static input surface (the sample arguments, then a module's
        parameters) that requires grad, from static output gradients. It has no Python
        to re-run, so it is announced as a bare graph (labelled ``... backward``): its
        replays get no shadow, and the bare-graph rules watch its memory."""
        outputs = [o for o in tree_flatten(self.static_out)[0] if isinstance(o, torch.Tensor)]
        needs = [o for o in outputs if o.requires_grad]
        grad_outputs = [torch.empty_like(o) if o.requires_grad else None for o in outputs]
        wanted = [t for t in surface if t.requires_grad]
        grads: tuple = ()
        bwd = EmulatedCUDAGraph()
        bwd._where = frames.user_frame(3)
        bwd._info = protocol.GraphInfo(next(_bare_ids), self.info.label.replace("@", " backward@", 1),
                                       str(protocol.CUDAGraphMode.FULL), False, protocol.BreakOutputs.DISCARD, False)
        if needs:
            with graph(bwd, pool=pool):
                grads = torch.autograd.grad(needs, wanted, [g for g in grad_outputs if g is not None],
                                            only_inputs=True, allow_unused=allow_unused)
        it = iter(grads)
        grad_inputs = tuple(next(it) if t.requires_grad and grads else None for t in surface)
        self.backward_graph = bwd if needs else None
        flat_out = tuple(outputs)
        n_user = len(self.static_in)
        graphed = self

        class Graphed(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
                graphed._replay(inputs[:n_user])
                return tuple(o.detach() for o in flat_out)

            @staticmethod
            @torch.autograd.function.once_differentiable
            def backward(ctx: Any, *grads_in: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
                with torch.no_grad():
                    for static, grad in zip(grad_outputs, grads_in):
                        if static is not None and grad is not None and static.data_ptr() != grad.data_ptr():
                            static.copy_(grad)
                if graphed.backward_graph is not None:
                    graphed.backward_graph.replay()
                return tuple(b.detach() if b is not None else None for b in grad_inputs)

        params = tuple(surface[n_user:])
        spec = tree_flatten(self.static_out)[1]

        def functionalized(*args: Any) -> Any:
            leaves = self._leaves(args)
            return tree_unflatten(list(Graphed.apply(*leaves, *params)), spec)

        self._autograd = functionalized

    def forward(self, *args: Any) -> Any:
        """A graphed module's ``forward``: the graph, or the original ``forward`` when
        the module's training flag is not the one it was captured with."""
        if self.fn.training != self.training:
            return self.run(*args)
        return self(*args)

    def __call__(self, *args: Any) -> Any:
        if self._autograd is not None:
            return self._autograd(*args)
        return self._replay(self._leaves(args))

    def _leaves(self, args: tuple) -> list[torch.Tensor]:
        leaves = tree_flatten(args)[0]
        if len(leaves) != len(self.static_in) or not all(isinstance(a, torch.Tensor) for a in leaves):
            raise TypeError(
                f"graph {self.info.label} takes {len(self.static_in)} tensors, as its sample_args, but was called "
                f"with ({', '.join(type(a).__name__ for a in leaves)}); pass tensors in the sample's order and format"
            )
        return leaves

    def _replay(self, leaves: Any) -> Any:
        """Copy the arguments into the static inputs, offer the shadow, replay the forward."""
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


def record_stream(tensor: torch.Tensor, stream: Any) -> None:
    """``Tensor.record_stream``: ``stream`` uses ``tensor``, so the allocator must not
    hand its memory to another allocation before ``stream``'s work is done (in a
    capture: not before the capture ends)."""
    sid = tensor.untyped_storage()._cdata
    for pool in _pools.values():
        alloc = pool.live.get(sid)
        if alloc is not None:
            alloc.recorded.add(stream)


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
    yield from training.patches()  # the captured training step's watch (runtime.training)
    yield from unchecked.patches()  # runtimes that capture on their own: said, not checked
    # the pools' record_stream (CL111, CL112): torch parses a stream argument before any
    # mode sees the call, so it is patched on the class
    yield torch.Tensor, "record_stream", record_stream


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
                _line_captures.clear()  # graph labels number the captures of one line per check
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
    "private_pool",
    "record_stream",
    "round_size",
    "segment_size",
]
