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

**Where each job lives.** This module is the install surface (``emulate_cuda``) and
re-exports the public names of the modules that do the work: capture and replay in
``runtime.cudagraph``, poison and lifetimes in ``runtime.lifetimes``, the private
pools in ``runtime.pool``, streams and events in ``runtime.streams``,
``torch.cuda.graph`` and ``make_graphed_callables`` in ``runtime.graphed``.
"""


from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import torch

from capturelint.runtime import device as emulated_device
from capturelint.runtime import training, unchecked
from capturelint.runtime.cudagraph import EmulatedCUDAGraph, RecordedCall, is_current_stream_capturing, line_captures, owned_by
from capturelint.runtime.graphed import graph, make_graphed_callables
from capturelint.runtime.lifetimes import BorrowedTensors, StorageId, poison_freed, poison_storage, poison_value
from capturelint.runtime.pool import PrivatePool, graph_pool_handle, private_pool, record_stream, round_size, segment_size
from capturelint.runtime.schema import ReplayKind
from capturelint.runtime.streams import (
    EmulatedEvent,
    EmulatedStream,
    current_stream,
    default_stream,
    set_stream,
    stream,
    synchronize,
)


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
                line_captures.clear()  # graph labels number the captures of one line per check
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
    "PrivatePool",
    "RecordedCall",
    "ReplayKind",
    "StorageId",
    "current_stream",
    "default_stream",
    "emulate_cuda",
    "graph",
    "graph_pool_handle",
    "is_current_stream_capturing",
    "make_graphed_callables",
    "owned_by",
    "poison_freed",
    "poison_storage",
    "poison_value",
    "private_pool",
    "record_stream",
    "round_size",
    "segment_size",
    "set_stream",
    "stream",
    "synchronize",
]
