"""The tracer's watch between steps: allocations, and the bare-graph memory watch.

Between steps the tracer's dispatch mode stays on in a cheap *watch* state that notes
which source line allocated each new storage (``MemoryWatch.allocated``), so that a
finding about a re-allocated tensor can name the line that re-allocated it.

**Bare graphs' memory.** A bare graph (``torch.cuda.CUDAGraph`` used directly) gets no
shadow, but its memory has rules of its own: what its capture allocated holds no value
until a replay writes it, and each replay rewrites it. Between steps the watch state
also follows that memory: which storages no replay or eager op has written since their
capture, how many times each graph replayed and from which line, and, for every view of
graph memory made after a replay, after which replay it was made and last read (weakly,
by tensor object). An eager op that reads the values of such a storage before any write
(CL110), or reads it through a view made before the graph's latest replay and not read
after the previous one (CL109: a view read every step is a handle, as the output tensor
itself is), is reported as a ``records.GraphMemoryRead``. This costs nothing while no
bare graph has been captured, and a storage lookup per tensor argument of each eager op
after. While graph-pool memory that another graph's replay overwrote awaits its own
graph's next replay, the watch also looks for ops that read it (``OverwrittenRead``).

Kept apart from the dispatch mode (``capturelint.tracer``), as PyTorch's CUDA sanitizer
keeps its access state apart from its mode: the tracer hands each eager op here.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
from torch.utils.weak import WeakIdKeyDictionary

from capturelint.records import GraphMemoryRead, ReadKind, StorageId, Stream, TensorUse
from capturelint.runtime import protocol as rt
from capturelint.runtime.frames import register_runtime_file, user_frame
from capturelint.runtime.protocol import Frame, SegmentKind
from capturelint.runtime.schema import OpInfo

register_runtime_file(__file__)

_dtype_names: dict[torch.dtype, str] = {}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` as ``float32``, cached per dtype (the tracer asks per tensor use)."""
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = str(dtype).removeprefix("torch.")
    return name


def storage_of(t: torch.Tensor) -> StorageId | None:
    """The identity of ``t``'s storage; ``None`` for a tensor without one."""
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # a tensor without storage (sparse, nested)
        return None


def use_of(t: torch.Tensor, arg: str) -> TensorUse:
    """A read of ``t`` as argument ``arg``, as a record holds it."""
    return TensorUse(arg, storage_of(t), tuple(t.shape), t.stride(), t.storage_offset(), dtype_name(t.dtype), False)


class Taken:
    """A view of a bare graph's memory made between steps: of ``graph``, after replay
    ``replay`` (at least 1), at ``frame``; ``last_read`` the replay after which it was
    last read. Views made from it share it."""

    __slots__ = ("graph", "replay", "frame", "last_read")

    def __init__(self, graph: int, replay: int, frame: Frame, last_read: int | None = None):
        self.graph, self.replay, self.frame, self.last_read = graph, replay, frame, last_read


class MemoryWatch:
    """What the watch state follows between steps (the module docstring).

    ``captures`` are the tracer's capture streams by graph id (shared, not copied);
    ``report`` hears each ``GraphMemoryRead``, ``hazard`` each ``OverwrittenRead``."""

    def __init__(self, captures: dict[int, Stream], report: Callable[[GraphMemoryRead], None],
                 hazard: Callable[[Any], None]):
        self.captures = captures
        self.report = report
        self.hazard = hazard
        self.alloc_frames: dict[StorageId, tuple[Frame, Any, int]] = {}  # frame, weakref to the storage, ordinal
        self.allocations = 0  # allocations noted so far (the ordinal of the latest)
        self.overwritten: dict[StorageId, rt.PoolOverwriteEvent] = {}  # until their graph's next replay
        # Bare graphs' memory: storage -> graph, graph -> storages, replays since capture
        # and their lines, storages unwritten since capture, views made after a replay.
        self.graph_memory: dict[StorageId, int] = {}
        self._graph_storages: dict[int, tuple[StorageId, ...]] = {}
        self._replay_frames: dict[int, list[Frame]] = {}
        self._unreplayed: set[StorageId] = set()
        self._segmented: set[int] = set()  # breakable graphs whose capture outputs are watched until their first replay
        self._taken: WeakIdKeyDictionary = WeakIdKeyDictionary()

    # ------------------------------------------------------------ allocations
    def allocated(self, fresh: tuple[bool, ...], out: Any) -> None:
        """Between steps: note the source line of each fresh allocation (``fresh``: the
        op's ``OpInfo.allocates``)."""
        for o, is_fresh in zip(out if len(fresh) > 1 else (out,), fresh):
            if is_fresh and isinstance(o, torch.Tensor):
                st = o.untyped_storage()  # the same Python object for the storage's life
                self.allocations += 1
                self.alloc_frames[st._cdata] = (user_frame(3), weakref.ref(st), self.allocations)

    # ------------------------------------------------------- graphs' lifecycle
    def bare_captured(self, graph: rt.GraphInfo, stream: Stream) -> None:
        """A bare graph's capture ended: what it allocated is its memory, unwritten yet."""
        for sid in self._graph_storages.pop(graph.id, ()):
            self.graph_memory.pop(sid, None)
            self._unreplayed.discard(sid)
        owned = tuple(sid for sid, origin in stream.origins.items() if not origin.external)
        self._graph_storages[graph.id] = owned
        self.graph_memory.update((sid, graph.id) for sid in owned)
        self._unreplayed.update(owned)
        self._replay_frames[graph.id] = []

    def segmented_captured(self, graph: rt.GraphInfo, stream: Stream) -> None:
        """A breakable graph's capture ended: the outputs its captured segments computed
        hold no value until its first replay (CL110 applies as to a bare graph's memory;
        after that replay the runtime hands the same static outputs to every step)."""
        owned = []
        for sid in stream.output_storages:
            origin = stream.origins.get(sid)
            if origin is not None and not origin.external and origin.producer is not None:
                segment = stream.ops[origin.producer].segment
                if any(seg.index == segment and seg.kind is SegmentKind.CAPTURED for seg in stream.segments):
                    owned.append(sid)
        if owned:
            self._segmented.add(graph.id)
            self._graph_storages[graph.id] = tuple(owned)
            self.graph_memory.update((sid, graph.id) for sid in owned)
            self._unreplayed.update(owned)
            self._replay_frames.setdefault(graph.id, [])

    def segmented_replay(self, graph: rt.GraphInfo) -> None:
        """A breakable graph replays: its first replay wrote its outputs."""
        for sid in self._graph_storages.pop(graph.id, ()):
            self.graph_memory.pop(sid, None)
            self._unreplayed.discard(sid)

    def bare_replay(self, graph: rt.GraphInfo) -> None:
        """A bare graph the tracer saw captured is about to replay (from the line that
        called the runtime's hook's caller)."""
        if graph.id in self._replay_frames:
            self._replay_frames[graph.id].append(user_frame(3))
            self._unreplayed.difference_update(self._graph_storages[graph.id])
        if self.overwritten:
            self._replay_reads(graph)

    def replayed(self, graph: rt.GraphInfo) -> None:
        """A graph replayed: it rewrote its own memory."""
        if self.overwritten:
            self.overwritten = {sid: e for sid, e in self.overwritten.items() if e.graph.id != graph.id}

    def _replay_reads(self, graph: rt.GraphInfo) -> None:
        """A bare graph about to replay reads, as inputs, overwritten memory of another graph."""
        capture = self.captures[graph.id]
        for op in capture.ops:
            for use in op.inputs:
                event = self.overwritten.get(use.storage)
                if event is not None and not use.write and capture.origins[use.storage].external:
                    del self.overwritten[use.storage]
                    self.hazard(rt.OverwrittenRead(event, op.op, user_frame(4), graph))

    # --------------------------------------------------------------- eager ops
    def reads_overwritten(self, info: OpInfo, args: tuple, kwargs: dict) -> None:
        """Between steps: an op that reads overwritten graph-pool memory observed the
        hazard (once per overwrite); one that writes it refreshed it. Views are not
        reads: the op that reads through one is."""
        written = {id(t) for t in info.written(args, kwargs)}
        for value in (*args, *kwargs.values()):
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if not isinstance(t, torch.Tensor):
                    continue
                event = self.overwritten.pop(t.untyped_storage()._cdata, None)
                if event is not None and id(t) not in written:
                    self.hazard(rt.OverwrittenRead(event, info.name, user_frame(3)))

    def eager_op(self, info: OpInfo, args: tuple, kwargs: dict, out: Any) -> None:
        """Between steps, once a bare graph was captured: an eager op's reads of graph
        memory, its writes to it, and the views of it that it makes (the module
        docstring)."""
        memory = self.graph_memory
        if info.reads_values:
            nargs = len(args)
            for pos, name, kwarg_only, write in info.args:
                if write:
                    continue
                value = kwargs.get(name) if kwarg_only or pos >= nargs else args[pos]
                if isinstance(value, torch.Tensor):
                    if storage_of(value) in memory:
                        self._read(info, name, value)
                elif name in info.list_args and isinstance(value, (list, tuple)):
                    self._read_list(info, name, value)
        if info.writes:
            for t in info.written(args, kwargs):
                sid = storage_of(t)
                if sid not in memory:
                    continue
                self._unreplayed.discard(sid)
                taken = self._taken.get(t)
                replays = len(self._replay_frames[memory[sid]])
                if taken is not None and taken.replay < replays:  # written through: it holds this step's values now
                    self._taken[t] = Taken(taken.graph, replays, user_frame(2), replays)
        if info.aliases and args and isinstance(args[0], torch.Tensor):
            sid = storage_of(args[0])
            graph = memory.get(sid)
            if graph is None:
                return
            taken = self._taken.get(args[0])
            replays = len(self._replay_frames[graph])
            if taken is None and replays:
                taken = Taken(graph, replays, user_frame(2))
            if taken is not None:
                for o in out if isinstance(out, (tuple, list)) else (out,):
                    if isinstance(o, torch.Tensor) and storage_of(o) == sid:
                        self._taken[o] = taken

    def _read(self, info: OpInfo, arg: str, t: torch.Tensor) -> None:
        sid = storage_of(t)
        graph = self.graph_memory[sid]
        replays = self._replay_frames[graph]
        if sid in self._unreplayed:
            self.report(GraphMemoryRead(ReadKind.UNREPLAYED, graph, info.name, user_frame(2), use_of(t, arg),
                                        len(replays), provisional=graph in self._segmented))
            return
        taken = self._taken.get(t)
        if taken is None:
            return
        # A view read after the previous replay too is read afresh every step, as the
        # output tensor itself is: a handle, not a value kept.
        stale = taken.replay < len(replays) and taken.last_read != len(replays) - 1
        if taken.last_read != len(replays):
            taken.last_read = len(replays)
        if stale:
            self.report(GraphMemoryRead(ReadKind.OVERWRITTEN, graph, info.name, user_frame(2), use_of(t, arg),
                                        len(replays), taken.replay, taken.frame, replays[taken.replay]))

    def _read_list(self, info: OpInfo, name: str, values: list | tuple) -> None:
        """A list argument: each element as a read, and the graph's own output tensor
        held more than once (``ReadKind.REPEATED``)."""
        handles: dict[tuple, list[tuple[str, torch.Tensor]]] = {}
        for i, t in enumerate(values):
            if not isinstance(t, torch.Tensor):
                continue
            sid = storage_of(t)
            if sid not in self.graph_memory:
                continue
            arg = f"{name}[{i}]"
            if sid in self._unreplayed or t in self._taken:
                self._read(info, arg, t)
            else:
                handles.setdefault((sid, tuple(t.shape), t.stride(), t.storage_offset()), []).append((arg, t))
        for (sid, *_), uses in handles.items():
            replays = self._replay_frames[self.graph_memory[sid]]
            if len(uses) > 1 and replays:
                arg, t = uses[0]
                self.report(GraphMemoryRead(ReadKind.REPEATED, self.graph_memory[sid], info.name, user_frame(2),
                                            use_of(t, arg), len(replays), replay_frame=replays[-1], count=len(uses)))
