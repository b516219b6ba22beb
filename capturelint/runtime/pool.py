"""The caching allocator's private pools, as the captures that share one see them.

Graphs captured into one ``graph_pool_handle()`` share memory: a replay rewrites every
block its capture used, and the allocator may have placed another graph's live tensor
over a block the first one freed (CL111); memory a side stream still reads may be
handed out again (CL112, ``record_stream``). ``PrivatePool`` models the allocator's
blocks, sizes and streams (``c10/cuda/CUDACachingAllocator.cpp``) with virtual
addresses; see ``runtime.emulated``'s docstring, **Graphs that share a pool share
memory**.

The module sits below the graph it serves (``runtime.cudagraph``): a capture here is
an ``EmulatedCUDAGraph``, typed ``Any``, known by what it exposes.
"""

from __future__ import annotations

import dataclasses
import itertools
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from capturelint.runtime import frames, protocol
from capturelint.runtime.lifetimes import StorageId, outside_references


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
    captures that share it see it (see ``runtime.emulated``'s docstring, **Graphs that share a
    pool share memory**). Addresses are virtual: only overlaps matter."""

    _bases = itertools.count(1)

    def __init__(self, handle: tuple) -> None:
        self.handle = handle
        self.free: list[Block] = []
        self.live: dict[StorageId, PoolAllocation] = {}
        self.graphs: list[Any] = []  # weak references to the graphs captured into it, in capture order
        self.capturing: Any = None
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
    def allocate(self, graph: Any, storage: torch.UntypedStorage, stream: Any) -> PoolAllocation | None:
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
            if outside_references(sid) > 0:
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

    def begin(self, graph: Any) -> None:
        self.sweep()
        self.capturing = graph
        self.graphs = [r for r in self.graphs if r() is not None and r() is not graph] + [weakref.ref(graph)]

    def end(self) -> None:
        self.capturing = None
        self.pending = []
        for alloc in self.deferred:
            self.free_block(alloc.block)
        self.deferred = []

    def replayed(self, graph: Any, replay_frame: protocol.Frame) -> None:
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

    def forget(self, graph: Any) -> None:
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



class PoolHandle(tuple):
    """An opaque memory-pool handle, as ``torch.cuda.graph_pool_handle()`` returns."""


_pool_ids = itertools.count(1)


def graph_pool_handle() -> PoolHandle:
    """A new memory-pool handle to share between graphs (emulated: an id)."""
    return PoolHandle((0, next(_pool_ids)))



def record_stream(tensor: torch.Tensor, stream: Any) -> None:
    """``Tensor.record_stream``: ``stream`` uses ``tensor``, so the allocator must not
    hand its memory to another allocation before ``stream``'s work is done (in a
    capture: not before the capture ends)."""
    sid = tensor.untyped_storage()._cdata
    for pool in _pools.values():
        alloc = pool.live.get(sid)
        if alloc is not None:
            alloc.recorded.add(stream)
