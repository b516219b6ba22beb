"""The tracer: records what a capture recorded and what each replay step should compute.

It is two things at once: a ``TorchDispatchMode`` that sees every op, and a
``CaptureObserver`` that hears the capture runtime announce graphs, segments and breaks.
From them it builds **streams** (``capturelint.records``, the one form of a capture),
one per run of the forward it checks: a ``CAPTURE`` stream per capture, and a
``SHADOW`` stream per replay step, recorded from an eager execution of the step.

The replay itself is not traced: its captured segments re-issue what the capture
recorded, and its eager segments reuse the break calls the shadow just made. The
dispatch mode is pushed only while a capture or a shadow records, never during replays.

The shadow has no side effects on tensors: before an op writes a storage that existed
before the shadow began, the tracer copies the storage; after the shadow it restores
every copy and every random generator, so the replay starts from exactly the state the
shadow started from. Write sets, fresh allocations and transparent ops come from the op schema
(``runtime.schema``, the reader the emulated primitive uses too); source frames from
the frame walker (``runtime.frames``); names, module scopes and random states from the
engine's objects (``capturelint.objects``).

**Each break's Python runs once per step.** The shadow's outermost break calls are the
step's calls (host state a break keeps, a counter, a scheduling object planned per step,
advances once, as in an untraced run): the tracer records each one (``_ShadowBreak``:
its inputs, the storages it wrote and the values it left there, the random generators it
advanced, its result), and when the replay reaches that break the runtime asks for the
record (``protocol.run_or_reuse``) and re-applies it instead of running the break again.
Writes to the break's arguments land in the replay's arguments (the capture-time
tensors), writes to storages that existed before the shadow land in those storages;
a write to a tensor the shadow made that is not an argument (reached through an object)
has no counterpart in the replay and is not re-applied. The record is reused only when the replay feeds the break exactly what the shadow fed
it (its arguments and the storages it read before writing them, compared value by
value): then the call would compute the same, and the replay's tensors evolve as an
untraced replay's. When the replay diverged before the break (a stale input, a baked
branch) or its breaks differ from the shadow's, the replay runs the break on its own
inputs, as the untraced program does, so the divergence still reaches the output and
the comparison; only then does a break's host state advance a second time in the step.

**Cost.** Recording an op costs about 28 us on this project's 2-core machine
(``bench/bench_ops.py``: the dispatch-mode hop, the storage bookkeeping, the record; on
top of the emulated graph's own ~60 us). The source frame of an op is resolved once per
code object and line (``frames.user_frame``, cached ``Frame`` objects, below the noise
of the benchmark); the capture-time stack (``frames.user_stack``) is walked in captures
only. A shadow's records are released as soon as its step is analyzed; capture streams
live until the configuration's graph maps are made. A traced run freezes the objects
alive before it for the collector (``harness.quiet_gc``), which otherwise walked every
record per collection.

**Bare graphs' memory.** A bare graph (``torch.cuda.CUDAGraph`` used directly) gets no
shadow, but its memory has rules of its own: what its capture allocated holds no value
until a replay writes it, and each replay rewrites it. Between steps the watch state
also follows that memory: which storages no replay or eager op has written since their
capture, how many times each graph replayed and from which line, and, for every view of
graph memory made after a replay, after which replay it was made and last read (weakly,
by tensor object). An eager op that reads the values of such a storage before any write
(CL110), or reads it through a view made before the graph's latest replay and not read
after the previous one (CL109: a view read every step is a handle, as the output tensor
itself is), is handed to
``on_bare`` as a ``records.GraphMemoryRead``; so is the runtime's ``HeldInputEvent``
(CL108). This costs nothing while no bare graph has been captured, and a storage
lookup per tensor argument of each eager op after.

After each replay the tracer hands ``(capture, shadow)`` to ``on_step``; the
analyzer (``capturelint.analyzer``) turns them into findings. The tracer knows nothing
of any particular engine: it names tensors from the roots it is given (modules,
objects with tensor attributes, ``(name, tensor)`` pairs) and from the forward context.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
import torch.nn.modules.module as module_hooks
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

from capturelint.objects import break_leaves, max_abs_diff, module_scopes, named_tensors, random_states, restore_random_states
from capturelint.records import (
    EXTERNAL, IN_BREAK, NO_CONTEXT, BreakArg, ContextProbe, ContextSnapshot, GraphMemoryRead, OpRecord, Origin, ReadKind,
    ScopeGroup, Segment, StorageId, Stream, StreamKind, TensorUse, scalar_repr,
)
from capturelint.runtime import protocol as rt
from capturelint.runtime.frames import register_runtime_file, running_frames, user_frame, user_stack
from capturelint.runtime.protocol import Frame, SegmentKind
from capturelint.runtime.schema import OpInfo, ReplayKind, op_info

register_runtime_file(__file__)

_dtype_names: dict[torch.dtype, str] = {}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = str(dtype).removeprefix("torch.")
    return name


def _storage_of(t: torch.Tensor) -> StorageId | None:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # a tensor without storage (sparse, nested)
        return None


def _use_of(t: torch.Tensor, arg: str) -> TensorUse:
    return TensorUse(arg, _storage_of(t), tuple(t.shape), t.stride(), t.storage_offset(), _dtype_name(t.dtype), False)


class _Taken:
    """A view of a bare graph's memory made between steps: of ``graph``, after replay
    ``replay`` (at least 1), at ``frame``; ``last_read`` the replay after which it was
    last read. Views made from it share it."""

    __slots__ = ("graph", "replay", "frame", "last_read")

    def __init__(self, graph: int, replay: int, frame: Frame, last_read: int | None = None):
        self.graph, self.replay, self.frame, self.last_read = graph, replay, frame, last_read


class _OpMode(TorchDispatchMode):
    """The dispatch mode half of the tracer: pushed only while a stream records, so
    that replayed captured segments and untraced code run without a Python hop."""

    def __init__(self, tracer: "Tracer"):
        super().__init__()
        self.tracer = tracer

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ in a disable-dynamo guard unless this is
        # False; the guard cost ~20 us per op, most of the tracer's per-op cost, and no
        # tracer runs under torch.compile.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.tracer._dispatch(func, args, kwargs or {}, self)


class _ShadowBreak:
    """One outermost eager break call of a shadow step, kept for the replay of that
    step (``replayed`` hands it to the runtime as ``protocol.RecordedBreak``).

    Recorded: the values of its tensor arguments and of the storages that existed
    before the shadow which it read before writing (its inputs, at entry or first
    read), the storages it wrote, and, at exit, the values it left in its arguments
    and those storages (its effects) and what it returned."""

    def __init__(self, name: str, args: list[torch.Tensor], rng: list[tuple[Any, Any]]):
        self.name = name
        self.rng = rng  # the generators' states at entry; at exit, those the call advanced
        self.args = args
        self.args_in = [t.detach().clone() for t in args]
        self.arg_sids = [t.untyped_storage()._cdata for t in args]
        self.arg_storages = set(self.arg_sids)
        self.args_read: set[StorageId] = set()  # argument storages read before any write
        self.read: dict[StorageId, tuple[torch.Tensor, torch.Tensor]] = {}  # external storage -> (view read, its value then)
        self.written: dict[StorageId, tuple[Any, bool]] = {}  # storage -> (storage, existed before the shadow)
        self.args_out: list[torch.Tensor | None] = []
        self.external_out: list[tuple[Any, Any]] = []
        self.result: Any = None

    def exit(self, result: Any) -> None:
        self.rng = [(gen, gen.get_state()) for gen, state in self.rng if not torch.equal(gen.get_state(), state)]
        self.args_out = [t.detach().clone() if t.untyped_storage()._cdata in self.written else None for t in self.args]
        self.external_out = [(st, st.clone()) for sid, (st, external) in self.written.items()
                             if external and sid not in self.arg_storages]
        self.result = tree_map(lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, result)
        self.args = []  # the shadow's own tensors, released with it

    def input_error(self, args: list[torch.Tensor]) -> float:
        """How far the replay's inputs to this call (the arguments and storages it read
        before writing them) are from the shadow's; NaN where both hold NaN is equal."""
        pairs = [(t, value) for t, value, shadow in zip(args, self.args_in, self.arg_sids)
                 if shadow in self.args_read]
        if len(args) != len(self.args_in):
            return float("inf")
        return max((_input_diff(t, value) for t, value in pairs + list(self.read.values())), default=0.0)

    def replayed(self, args: list[torch.Tensor]) -> rt.RecordedBreak:
        def apply() -> None:
            restore_random_states(self.rng)
            with torch.no_grad():
                for st, value in self.external_out:
                    st.copy_(value)
                for dst, value in zip(args, self.args_out):
                    if value is not None:
                        dst.copy_(value)

        return rt.RecordedBreak(self.result, apply)


def _input_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    both_nan = a.isnan() & b.isnan() if a.is_floating_point() else None
    diff = (a.detach().double() - b.double()).abs()
    if both_nan is not None:
        diff = diff.masked_fill(both_nan, 0.0)
    return max_abs_diff([diff], [torch.zeros_like(diff)])


class Tracer(rt.CaptureObserver):
    """Records capture, shadow and replay streams; see the module docstring.

    ``roots`` name external tensors: an ``nn.Module`` contributes its parameters and
    buffers, a mapping or an object its tensor attributes (two levels deep), a
    ``(name, tensor)`` iterable its pairs. Roots are walked again at each capture and
    each shadowed step, so a tensor the engine allocates later is named by the
    attribute that holds it then. ``on_step(capture, shadow, error)`` is called after
    every replay with ``error`` the max abs difference between the replay's output and
    the shadow's. ``shadow=False`` records captures only. ``probe`` reads the engine's
    forward context (an adapter's); ``scope_group`` maps a module scope to the name
    prefix of the tensors it owns. ``on_stale(capture, event)`` hears a graph that
    found a storage it reads freed by the engine, for graphs that get no shadow;
    ``on_bare(capture, event)`` the other hazards of such graphs (a re-bound holder of
    an input, a read of graph memory that does not hold the value meant: see the
    module docstring).
    ``on_hazard(event, captures)`` hears what the emulated runtime saw happen rather
    than what a step computes: a read of graph-pool memory that another graph's replay
    overwrote (``OverwrittenRead``), a stream or event crossing a capture boundary
    (``StreamCaptureEvent``), with the capture streams by graph id.

    Between steps the dispatch mode stays on in a cheap *watch* state that only notes
    which source line allocated each new storage, so that a finding about a
    re-allocated tensor can name the line that re-allocated it. While graph-pool memory
    that another graph's replay overwrote awaits its own graph's next replay, the watch
    state also looks for ops that read it.
    """

    def __init__(
        self,
        roots: dict[str, Any] | None = None,
        on_step: Callable[[Stream, Stream, float], None] | None = None,
        shadow: bool = True,
        probe: ContextProbe | None = None,
        scope_group: ScopeGroup | None = None,
        on_stale: Callable[[Stream, rt.StaleInputEvent], None] | None = None,
        on_bare: Callable[[Stream, Any], None] | None = None,
        on_hazard: Callable[[Any, dict[int, Stream]], None] | None = None,
    ):
        self.roots = roots or {}
        self._mode = _OpMode(self)
        self._mode_on = False
        self.on_step = on_step
        self.on_stale = on_stale
        self.on_bare = on_bare
        self.on_hazard = on_hazard
        self._overwritten: dict[StorageId, rt.PoolOverwriteEvent] = {}  # until their graph's next replay
        self.shadow_enabled = shadow
        self.probe = probe
        self.scope_group = scope_group
        self.captures: dict[int, Stream] = {}
        self.stream: Stream | None = None
        self.step = 0
        self.replays = 0
        self.unchecked_graphs: list[str] = []  # runtimes that captured on their own, and where (not checked)
        self.bare_replays = 0  # replays without a shadow of graphs with no Python to re-run (bare CUDA graphs)
        self.replayed_graphs: dict[str, int] = {}  # shadowed replay steps per graph label, in order of first replay
        self._segment: Segment | None = None
        self._cow: dict[StorageId, tuple[Any, Any]] | None = None
        self._rng: list[tuple[Any, Any]] = []
        self._shadow: Stream | None = None
        self._shadow_out: list[torch.Tensor] = []
        self._break: _ShadowBreak | None = None  # the shadow's break call under way
        self._breaks: list[_ShadowBreak] = []  # the shadow's break calls, for its replay
        self._scope_stack: list[str] = []
        self._module_names: dict[int, str] = {}
        self._hooks: list[Any] = []
        self._static_names: dict[StorageId, tuple[str, ...]] = {}
        self._static_alive: list[Any] = []
        self._alloc_frames: dict[StorageId, tuple[Frame, Any, int]] = {}  # frame, weakref to the storage, ordinal
        self._allocations = 0  # allocations noted so far (the ordinal of the latest)
        self._entry: frozenset[int] = frozenset()  # frames running when the current capture began
        self._entry_frames: list[Any] = []
        self.entry_stack: tuple[Frame, ...] = ()  # their engine frames, innermost first
        self.unseen: dict[int, str] = {}  # graphs replayed whose capture the tracer did not see
        # Bare graphs' memory (the module docstring): storage -> graph, graph -> storages,
        # replays since capture and their lines, storages unwritten since capture, views
        # made after a replay.
        self._graph_memory: dict[StorageId, int] = {}
        self._graph_storages: dict[int, tuple[StorageId, ...]] = {}
        self._replay_frames: dict[int, list[Frame]] = {}
        self._unreplayed: set[StorageId] = set()
        self._segmented: set[int] = set()  # breakable graphs whose capture outputs are watched until their first replay
        self._taken: WeakIdKeyDictionary = WeakIdKeyDictionary()

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> "Tracer":
        self._index_roots()
        self._hooks = [
            module_hooks.register_module_forward_pre_hook(self._pre_hook),
            module_hooks.register_module_forward_hook(self._post_hook),
        ]
        rt.add_observer(self)
        self._mode_on_()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode_off()
        self.stream = None
        rt.remove_observer(self)
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _index_roots(self) -> None:
        names: dict[StorageId, list[str]] = {}
        for root_name, root in self.roots.items():
            for name, t in named_tensors(root_name, root):
                st = t.untyped_storage()
                self._static_alive.append(st)
                names.setdefault(st._cdata, []).append(name)
            for prefix, module in module_scopes(root_name, root):
                for name, m in module.named_modules():
                    self._module_names.setdefault(id(m), f"{prefix}.{name}" if name and prefix else name or prefix)
        self._static_names = {sid: tuple(v) for sid, v in names.items()}

    def _root_names(self, stream: Stream) -> dict[StorageId, list[str]]:
        """Names of the tensors the roots hold now that they did not hold when tracing
        began (a runner's per-step buffer, a module's buffer replaced after capture)."""
        names: dict[StorageId, list[str]] = {}
        for root_name, root in self.roots.items():
            for name, t in named_tensors(root_name, root):
                st = t.untyped_storage()
                sid = st._cdata
                if name in self._static_names.get(sid, ()):
                    continue
                stream._alive.append(st)
                names.setdefault(sid, []).append(name)
        return names

    def _mode_on_(self) -> None:
        if not self._mode_on:
            self._mode.__enter__()
            self._mode_on = True

    def _mode_off(self) -> None:
        if self._mode_on:
            self._mode_on = False
            self._mode.__exit__(None, None, None)

    def _pre_hook(self, module: torch.nn.Module, args: Any) -> None:
        name = self._module_names.get(id(module))
        if name is None:
            name = (self._scope_stack[-1] + "." if self._scope_stack else "") + type(module).__name__
        self._scope_stack.append(name)

    def _post_hook(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        if self._scope_stack:
            self._scope_stack.pop()

    @property
    def scope(self) -> str:
        return self._scope_stack[-1] if self._scope_stack else ""

    # -------------------------------------------------------------- op records
    def _dispatch(self, func: Any, args: tuple, kwargs: dict, mode: TorchDispatchMode) -> Any:
        info = op_info(func)
        if info.decomposes:  # under inference mode: trace what it decomposes into (runtime.schema)
            with mode:
                return func.decompose(*args, **kwargs)
        stream = self.stream
        if stream is None:
            if self._overwritten and info.replay is not ReplayKind.SKIP and not info.transparent:
                self._reads_overwritten(info, args, kwargs)
            out = func(*args, **kwargs)
            if info.allocates and not info.transparent:
                self._watch(info.allocates, out)
            if self._graph_memory:
                self._watch_graph_memory(info, args, kwargs, out)
            return out
        if info.transparent:
            # detach is a no-op alias for replay purposes, and stacked dispatch modes add
            # it to factory ops at capture only: recording it would fake a divergence.
            return func(*args, **kwargs)
        if self._break is not None:
            self._break_uses(info, args, kwargs, stream)
        if self._cow is not None and info.writes:
            self._copy_before_write(info, args, kwargs, stream)
        segment = self._segment
        out = func(*args, **kwargs)
        if self._segment is not segment:
            # The op's implementation entered an eager break (vLLM's sparse_attn_indexer op
            # is itself one): the segment changed inside the call, so on a GPU the op ran
            # eagerly between two captured segments, and no graph holds it. What it
            # allocated is the break's (as in-step, not external).
            self._in_break(stream, info, out)
            return out
        if self._cow is not None and self._segment is not None and self._segment.kind is SegmentKind.EAGER:
            # Ops inside a shadow's eager break re-run live on replay and are exempt from
            # R1-R4: only the storages they allocate matter (as in-step, not external).
            self._in_break(stream, info, out)
            return out
        self._record(stream, func, info, args, kwargs, out)
        return out

    def _in_break(self, stream: Stream, info: OpInfo, out: Any) -> None:
        """The storages of what an op inside an eager break returns, first seen there,
        are in-step (``IN_BREAK``): the break re-runs live on replay."""
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor):
                st = o.untyped_storage()
                if st._cdata not in stream.origins:
                    stream.origins[st._cdata] = IN_BREAK
                    stream._alive.append(st)

    def _watch(self, fresh: tuple[bool, ...], out: Any) -> None:
        """Between steps: note the source line of each fresh allocation (``fresh``: the
        op's ``OpInfo.allocates``)."""
        for o, is_fresh in zip(out if len(fresh) > 1 else (out,), fresh):
            if is_fresh and isinstance(o, torch.Tensor):
                st = o.untyped_storage()  # the same Python object for the storage's life
                self._allocations += 1
                self._alloc_frames[st._cdata] = (user_frame(3), weakref.ref(st), self._allocations)

    def _watch_graph_memory(self, info: OpInfo, args: tuple, kwargs: dict, out: Any) -> None:
        """Between steps, once a bare graph was captured: an eager op's reads of graph
        memory, its writes to it, and the views of it that it makes (the module
        docstring)."""
        memory = self._graph_memory
        if info.reads_values:
            nargs = len(args)
            for pos, name, kwarg_only, write in info.args:
                if write:
                    continue
                value = kwargs.get(name) if kwarg_only or pos >= nargs else args[pos]
                if isinstance(value, torch.Tensor):
                    if _storage_of(value) in memory:
                        self._read(info, name, value)
                elif name in info.list_args and isinstance(value, (list, tuple)):
                    self._read_list(info, name, value)
        if info.writes:
            for t in info.written(args, kwargs):
                sid = _storage_of(t)
                if sid not in memory:
                    continue
                self._unreplayed.discard(sid)
                taken = self._taken.get(t)
                replays = len(self._replay_frames[memory[sid]])
                if taken is not None and taken.replay < replays:  # written through: it holds this step's values now
                    self._taken[t] = _Taken(taken.graph, replays, user_frame(2), replays)
        if info.aliases and args and isinstance(args[0], torch.Tensor):
            sid = _storage_of(args[0])
            graph = memory.get(sid)
            if graph is None:
                return
            taken = self._taken.get(args[0])
            replays = len(self._replay_frames[graph])
            if taken is None and replays:
                taken = _Taken(graph, replays, user_frame(2))
            if taken is not None:
                for o in out if isinstance(out, (tuple, list)) else (out,):
                    if isinstance(o, torch.Tensor) and _storage_of(o) == sid:
                        self._taken[o] = taken

    def _read(self, info: OpInfo, arg: str, t: torch.Tensor) -> None:
        sid = _storage_of(t)
        graph = self._graph_memory[sid]
        replays = self._replay_frames[graph]
        if sid in self._unreplayed:
            self._report(GraphMemoryRead(ReadKind.UNREPLAYED, graph, info.name, user_frame(2), _use_of(t, arg),
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
            self._report(GraphMemoryRead(ReadKind.OVERWRITTEN, graph, info.name, user_frame(2), _use_of(t, arg),
                                         len(replays), taken.replay, taken.frame, replays[taken.replay]))

    def _read_list(self, info: OpInfo, name: str, values: list | tuple) -> None:
        """A list argument: each element as a read, and the graph's own output tensor
        held more than once (``ReadKind.REPEATED``)."""
        handles: dict[tuple, list[tuple[str, torch.Tensor]]] = {}
        for i, t in enumerate(values):
            if not isinstance(t, torch.Tensor):
                continue
            sid = _storage_of(t)
            if sid not in self._graph_memory:
                continue
            arg = f"{name}[{i}]"
            if sid in self._unreplayed or t in self._taken:
                self._read(info, arg, t)
            else:
                handles.setdefault((sid, tuple(t.shape), t.stride(), t.storage_offset()), []).append((arg, t))
        for (sid, *_), uses in handles.items():
            replays = self._replay_frames[self._graph_memory[sid]]
            if len(uses) > 1 and replays:
                arg, t = uses[0]
                self._report(GraphMemoryRead(ReadKind.REPEATED, self._graph_memory[sid], info.name, user_frame(2),
                                             _use_of(t, arg), len(replays), replay_frame=replays[-1], count=len(uses)))

    def _report(self, event: GraphMemoryRead) -> None:
        if self.on_bare is not None:
            self.on_bare(self.captures[event.graph_id], event)

    def _bare_captured(self, graph: rt.GraphInfo, stream: Stream) -> None:
        """A bare graph's capture ended: what it allocated is its memory, unwritten yet."""
        for sid in self._graph_storages.pop(graph.id, ()):
            self._graph_memory.pop(sid, None)
            self._unreplayed.discard(sid)
        owned = tuple(sid for sid, origin in stream.origins.items() if not origin.external)
        self._graph_storages[graph.id] = owned
        self._graph_memory.update((sid, graph.id) for sid in owned)
        self._unreplayed.update(owned)
        self._replay_frames[graph.id] = []

    def _segmented_captured(self, graph: rt.GraphInfo, stream: Stream) -> None:
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
            self._graph_memory.update((sid, graph.id) for sid in owned)
            self._unreplayed.update(owned)
            self._replay_frames.setdefault(graph.id, [])

    def _reads_overwritten(self, info: OpInfo, args: tuple, kwargs: dict) -> None:
        """Between steps: an op that reads overwritten graph-pool memory observed the
        hazard (once per overwrite); one that writes it refreshed it. Views are not
        reads: the op that reads through one is."""
        written = {id(t) for t in info.written(args, kwargs)}
        for value in (*args, *kwargs.values()):
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if not isinstance(t, torch.Tensor):
                    continue
                event = self._overwritten.pop(t.untyped_storage()._cdata, None)
                if event is not None and id(t) not in written:
                    self._hazard(rt.OverwrittenRead(event, info.name, user_frame(3)))

    def _hazard(self, event: Any) -> None:
        if self.on_hazard is not None:
            captures = self.captures
            if self.stream is not None and self.stream.kind is StreamKind.CAPTURE:  # the capture under way
                captures = {**captures, self.stream.graph_id: self.stream}
            self.on_hazard(event, captures)

    def _break_uses(self, info: OpInfo, args: tuple, kwargs: dict, stream: Stream) -> None:
        """A shadow's break call: note the storages it writes, and the values of those
        that existed before the shadow that it reads before writing them."""
        record = self._break
        written = {t.untyped_storage()._cdata: t.untyped_storage() for t in info.written(args, kwargs)}
        if info.reads_values:
            for t in tree_flatten((args, kwargs))[0]:
                if not isinstance(t, torch.Tensor):
                    continue
                st = t.untyped_storage()
                sid = st._cdata
                origin = stream.origins.get(sid)
                if sid in written or sid in record.written:
                    continue
                if sid in record.arg_storages:
                    record.args_read.add(sid)
                elif sid not in record.read and (origin is None or origin.external):
                    record.read[sid] = (t, t.detach().clone())
        for sid, st in written.items():
            if sid not in record.written:
                origin = stream.origins.get(sid)
                record.written[sid] = (st, origin is None or origin.external)

    def _copy_before_write(self, info: OpInfo, args: tuple, kwargs: dict, stream: Stream) -> None:
        for t in info.written(args, kwargs):
            st = t.untyped_storage()
            sid = st._cdata
            origin = stream.origins.get(sid)
            if (origin is None or origin.external) and sid not in self._cow:
                self._cow[sid] = (st, st.clone())

    def _use(self, stream: Stream, t: torch.Tensor, arg: str, write: bool) -> TensorUse:
        st = t.untyped_storage()
        sid = st._cdata
        if sid not in stream.origins:
            stream.origins[sid] = EXTERNAL
            stream._alive.append(st)
        return TensorUse(arg, sid, tuple(t.shape), t.stride(), t.storage_offset(), _dtype_name(t.dtype), write)

    def _record(self, stream: Stream, func: Any, info: OpInfo, args: tuple, kwargs: dict, out: Any) -> None:
        inputs: list[TensorUse] = []
        scalars: list[tuple[str, Any]] = []
        nargs = len(args)
        origins = stream.origins
        for pos, name, kwarg_only, write in info.args:
            if kwarg_only or pos >= nargs:
                if name not in kwargs:
                    continue
                value = kwargs[name]
            else:
                value = args[pos]
            if isinstance(value, torch.Tensor):
                st = value.untyped_storage()
                sid = st._cdata
                if sid not in origins:
                    origins[sid] = EXTERNAL
                    stream._alive.append(st)
                inputs.append(TensorUse(name, sid, tuple(value.shape), value.stride(), value.storage_offset(),
                                        _dtype_name(value.dtype), write))
            elif name in info.list_args and isinstance(value, (list, tuple)):
                for i, v in enumerate(value):
                    if isinstance(v, torch.Tensor):
                        inputs.append(self._use(stream, v, f"{name}[{i}]", write))
                    elif v is not None:
                        scalars.append((f"{name}[{i}]", v))
            elif value is not None or not kwarg_only:
                scalars.append((name, tuple(value) if isinstance(value, list) else value))
        index = len(stream.ops)
        outputs: list[TensorUse] = []
        for i, o in enumerate(out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(o, torch.Tensor):
                st = o.untyped_storage()
                sid = st._cdata
                if sid not in stream.origins:
                    stream.origins[sid] = Origin(False, index)
                    stream._alive.append(st)
                outputs.append(TensorUse(f"out{i}", sid, tuple(o.shape), o.stride(), o.storage_offset(), _dtype_name(o.dtype), True))
        seg = self._segment
        scope = self._scope_stack[-1] if self._scope_stack else (seg.scope if seg is not None else "")
        frame = user_frame(3)  # from the caller of __torch_dispatch__ outwards
        stack = user_stack(3, self._entry) if stream.kind is StreamKind.CAPTURE else ()
        stream.ops.append(
            OpRecord(index, info.name, seg.index if seg is not None else 0, scope, frame,
                     tuple(scalars), tuple(inputs), tuple(outputs), stack)
        )

    # ------------------------------------------------------------ stream setup
    def _snapshot(self) -> ContextSnapshot:
        return self.probe() if self.probe is not None else ContextSnapshot(NO_CONTEXT)

    def _new_stream(self, kind: StreamKind, graph: rt.GraphInfo) -> Stream:
        snap = self._snapshot()
        s = Stream(kind, graph.id, graph.label, graph.mode, self.step, snap.summary,
                   break_outputs=graph.break_outputs, breaks_eager=graph.breaks_eager,
                   allocation_frames=self._alloc_frames, scope_group=self.scope_group)
        s.static_names = self._static_names
        names = self._root_names(s)
        for name, t in snap.tensors:
            st = t.untyped_storage()
            s._alive.append(st)
            names.setdefault(st._cdata, []).append(name)
        s.names = {sid: tuple(v) for sid, v in names.items()}
        return s

    def _open_segment(self, stream: Stream, index: int, kind: SegmentKind, name: str | None) -> Segment:
        seg = Segment(index, kind, name, self.scope, len(stream.ops))
        stream.segments.append(seg)
        self._segment = seg
        return seg

    def _close_segment(self, stream: Stream) -> None:
        if self._segment is not None:
            self._segment.end_op = len(stream.ops)
            self._segment = None

    def _break_args(self, stream: Stream, call: rt.BreakCall) -> tuple[BreakArg, ...]:
        out = []
        for path, v in break_leaves(call.named_arguments()):
            if isinstance(v, torch.Tensor):
                out.append(BreakArg(path, self._use(stream, v, path, False), None))
            else:
                out.append(BreakArg(path, None, scalar_repr(v)))
        return tuple(out)

    # ----------------------------------------------------------- observer API
    def on_graph_begin(self, graph: rt.GraphInfo, phase: rt.Phase) -> None:
        if phase is rt.Phase.CAPTURE:
            self._entry, self._entry_frames = running_frames()
            self.entry_stack = user_stack(2)
            self.stream = self._new_stream(StreamKind.CAPTURE, graph)
            self.stream.allocation_mark = self._allocations
            if not graph.segmented:
                self._open_segment(self.stream, 0, SegmentKind.CAPTURED, None)
            self._mode_on_()
        elif phase is rt.Phase.REPLAY and graph.segmented:
            for sid in self._graph_storages.pop(graph.id, ()):  # its first replay wrote its outputs
                self._graph_memory.pop(sid, None)
                self._unreplayed.discard(sid)
        elif phase is rt.Phase.REPLAY and not graph.segmented:
            if graph.id not in self.captures:
                self.unseen[graph.id] = graph.label
            else:
                if graph.id in self._replay_frames:
                    self._replay_frames[graph.id].append(user_frame(2))
                    self._unreplayed.difference_update(self._graph_storages[graph.id])
                if self._overwritten:
                    self._replay_reads(graph)
            self._mode_off()  # a bare graph's replay is not traced

    def on_graph_end(self, graph: rt.GraphInfo, phase: rt.Phase, output: Any) -> None:
        if phase is rt.Phase.CAPTURE and self.stream is not None:
            if not graph.segmented:
                self._close_segment(self.stream)
            self.stream.output_storages = tuple(t.untyped_storage()._cdata for t in rt.flatten_tensors(output))
            names = self._root_names(self.stream)  # tensors the engine made during the capture
            for sid, extra in names.items():
                self.stream.names[sid] = tuple(dict.fromkeys(self.stream.names.get(sid, ()) + tuple(extra)))
            self.captures[graph.id] = self.stream
            if not graph.segmented:
                self._bare_captured(graph, self.stream)
            else:
                self._segmented_captured(graph, self.stream)
            self.stream = None
            self._entry, self._entry_frames = frozenset(), []
        elif phase is rt.Phase.REPLAY:
            if self._overwritten:  # the graph rewrote its own memory
                self._overwritten = {sid: e for sid, e in self._overwritten.items() if e.graph.id != graph.id}
            self._mode_on_()  # back to watching allocations between steps
            if self._shadow is None and not graph.segmented:
                self.replays += 1
                self.bare_replays += 1
            if self._shadow is not None:
                # The replay itself is not traced: captured segments re-issue what the capture
                # recorded, and eager segments reused the shadow's break calls.
                shadow, self._shadow = self._shadow, None
                error = max_abs_diff(list(rt.flatten_tensors(output)), self._shadow_out)
                self._shadow_out, self._breaks = [], []
                self.replays += 1
                if self.on_step is not None:
                    self.on_step(self.captures[graph.id], shadow, error)
                shadow.release()

    def on_stale_input(self, event: rt.StaleInputEvent) -> None:
        capture = self.captures.get(event.graph.id)
        if capture is not None and self.on_stale is not None and not event.graph.segmented:
            capture.names_now = {name: sid for sid, names in self._root_names(capture).items() for name in names}
            self.on_stale(capture, event)

    def on_graph_names(self, graph: rt.GraphInfo, names: dict[int, tuple[str, ...]]) -> None:
        capture = self.captures.get(graph.id)
        if capture is not None:  # after the roots' names, which the engine chose
            for sid, found in names.items():
                if sid in capture.origins:
                    capture.names[sid] = tuple(dict.fromkeys(capture.names.get(sid, ()) + found))

    def on_held_input(self, event: rt.HeldInputEvent) -> None:
        capture = self.captures.get(event.graph.id)
        if capture is not None and self.on_bare is not None and not event.graph.segmented:
            self.on_bare(capture, event)

    def _replay_reads(self, graph: rt.GraphInfo) -> None:
        """A bare graph about to replay reads, as inputs, overwritten memory of another graph."""
        capture = self.captures[graph.id]
        for op in capture.ops:
            for use in op.inputs:
                event = self._overwritten.get(use.storage)
                if event is not None and not use.write and capture.origins[use.storage].external:
                    del self._overwritten[use.storage]
                    self._hazard(rt.OverwrittenRead(event, op.op, user_frame(3), graph))

    def on_pool_overwrite(self, event: rt.PoolOverwriteEvent) -> None:
        if event.graph.id in self.captures:
            self._overwritten[event.storage] = event

    def on_stream_hazard(self, event: rt.StreamCaptureEvent) -> None:
        self._hazard(event)

    def on_training_hazard(self, event: rt.TrainingHazardEvent) -> None:
        self._hazard(event)

    def on_unchecked_graphs(self, what: str, frame: Frame) -> None:
        note = f"{what} at {frame.file}:{frame.line}"
        if note not in self.unchecked_graphs:
            self.unchecked_graphs.append(note)

    def on_segment_begin(self, info: rt.SegmentInfo) -> None:
        if self.stream is not None and info.phase is rt.Phase.CAPTURE:
            self._open_segment(self.stream, info.index, info.kind, info.name)

    def on_segment_end(self, info: rt.SegmentInfo) -> None:
        if self.stream is not None and info.phase is rt.Phase.CAPTURE:
            self._close_segment(self.stream)

    def on_break_enter(self, call: rt.BreakCall) -> None:
        stream = self.stream
        if stream is None:
            return
        if stream.kind is StreamKind.SHADOW:
            if call.depth == 0 and stream.breaks_eager:
                self._close_segment(stream)
                seg = self._open_segment(stream, len(stream.segments), SegmentKind.EAGER, call.name)
                seg.break_args = self._break_args(stream, call)
                seg.break_frame = call.frame
                self._break = _ShadowBreak(call.name, list(rt.flatten_tensors((call.args, call.kwargs))),
                                           random_states(self.roots))
        elif not call.inline and self._segment is not None:
            self._segment.break_args = self._break_args(stream, call)
            self._segment.break_frame = call.frame
            self._segment.break_stack = user_stack(2, self._entry)

    def on_break_exit(self, call: rt.BreakCall, result: Any) -> None:
        stream = self.stream
        if stream is None:
            return
        returned = frozenset(t.untyped_storage()._cdata for t in rt.flatten_tensors(result))
        if stream.kind is StreamKind.SHADOW:
            if call.depth == 0 and stream.breaks_eager:
                record, self._break = self._break, None
                if record is not None:
                    record.exit(result)
                    self._breaks.append(record)
                if self._segment is not None:
                    self._segment.returned = returned
                self._close_segment(stream)
                self._open_segment(stream, len(stream.segments), SegmentKind.CAPTURED, None)
        elif not call.inline and self._segment is not None:
            self._segment.returned = returned

    def replayed_break(self, call: rt.BreakCall) -> rt.RecordedBreak | None:
        """The replay's call of a break reuses the shadow's call of it (see
        ``protocol.run_or_reuse``) when the replay feeds it exactly what the shadow fed
        it; otherwise the replay runs it on its own inputs, as an untraced replay would,
        so a replay that feeds a break wrong values still diverges from the shadow."""
        if call.phase is not rt.Phase.REPLAY or not self._breaks:
            return None
        record = self._breaks.pop(0)
        if record.name != call.name:  # the replay left the shadow's path: it runs its breaks itself
            self._breaks.clear()
            return None
        args = list(rt.flatten_tensors((call.args, call.kwargs)))
        if record.input_error(args) != 0.0:  # the replay diverged before the break: it runs on its own inputs
            return None
        return record.replayed(args)

    def before_replay(self, graph: rt.GraphInfo, shadow: Callable[[], Any]) -> None:
        if graph.id not in self.captures:
            self.unseen[graph.id] = graph.label
        if not self.shadow_enabled or graph.id not in self.captures:
            self._mode_off()
            return
        self.step += 1
        self.replayed_graphs[graph.label] = self.replayed_graphs.get(graph.label, 0) + 1
        stream = self._new_stream(StreamKind.SHADOW, graph)
        self.stream, self._cow = stream, {}
        self._breaks, self._break = [], None
        self._open_segment(stream, 0, SegmentKind.CAPTURED, None)
        self._rng = random_states(self.roots)
        self._mode_on_()
        try:
            out = shadow()
        finally:
            self._mode_off()
            self._close_segment(stream)
            self.stream = None
            self._break = None
            with torch.no_grad():
                for st, saved in self._cow.values():
                    st.copy_(saved)
            self._cow = None
            restore_random_states(self._rng)
            self._rng = []
        self._shadow_out = [t.detach().clone() for t in rt.flatten_tensors(out)]
        stream.output_storages = tuple(t.untyped_storage()._cdata for t in rt.flatten_tensors(out))
        self._shadow = stream
