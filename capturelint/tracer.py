"""The tracer: records what a capture recorded and what each replay step should compute.

It is two things at once: a ``TorchDispatchMode`` that sees every op, and a
``CaptureObserver`` that hears the capture runtime announce graphs, segments and breaks.
From them it builds **streams** (``capturelint.records``, the one form of a capture),
one per run of the forward it checks: a ``CAPTURE`` stream per capture, and a
``SHADOW`` stream per replay step, recorded from an eager execution of the step.

The replay itself is not traced: its captured segments re-issue what the capture
recorded, and its eager segments reuse the break calls the shadow just made. The
dispatch mode is pushed only while a capture or a shadow records, never during replays.

The shadow has no side effects on tensors, and each break's Python runs once per step
(``capturelint.shadow_isolation``). Write sets, fresh allocations and transparent ops
come from the op schema (``runtime.schema``, the reader the emulated primitive uses
too); source frames from the frame walker (``runtime.frames``); names and module scopes
from the roots (``capturelint.naming``), random states from the engine's objects
(``capturelint.objects``).

**Cost.** Recording an op costs about 28 us on this project's 2-core machine
(``bench/bench_ops.py``: the dispatch-mode hop, the storage bookkeeping, the record; on
top of the emulated graph's own ~60 us). The source frame of an op is resolved once per
code object and line (``frames.user_frame``, cached ``Frame`` objects, below the noise
of the benchmark); the capture-time stack (``frames.user_stack``) is walked in captures
only. A shadow's records are released as soon as its step is analyzed; capture streams
live until the configuration's graph maps are made. A traced run freezes the objects
alive before it for the collector (``harness.quiet_gc``), which otherwise walked every
record per collection.

**Between steps** the dispatch mode stays on in a cheap watch state
(``capturelint.memory_watch``): it notes the line of each allocation, and follows bare
graphs' memory (``torch.cuda.CUDAGraph`` used directly, which gets no shadow): reads of
it that do not hold the value meant are handed to ``on_bare`` as
``records.GraphMemoryRead``; so is the runtime's ``HeldInputEvent`` (CL108).

After each replay the tracer hands ``(capture, shadow)`` to ``on_step``; the
analyzer (``capturelint.analyzer``) turns them into findings. The tracer knows nothing
of any particular engine: it names tensors from the roots it is given (modules,
objects with tensor attributes, ``(name, tensor)`` pairs) and from the forward context.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes, _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_flatten

from capturelint.memory_watch import MemoryWatch, dtype_name
from capturelint.naming import Naming
from capturelint.objects import break_leaves, max_abs_diff, random_states
from capturelint.records import (
    EXTERNAL, IN_BREAK, NO_CONTEXT, BreakArg, ContextProbe, ContextSnapshot, GraphMemoryRead, OpRecord, Origin,
    ScopeGroup, Segment, Stream, StreamKind, TensorUse, scalar_repr,
)
from capturelint.runtime import protocol as rt
from capturelint.runtime.frames import register_runtime_file, running_frames, user_frame, user_stack
from capturelint.runtime.protocol import Frame, SegmentKind
from capturelint.runtime.schema import OpInfo, ReplayKind, call_through, op_info
from capturelint.shadow_isolation import ShadowBreak, ShadowIsolation

register_runtime_file(__file__)


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


# ------------------------------------------------------------------ recording
def _use(stream: Stream, t: torch.Tensor, arg: str, write: bool) -> TensorUse:
    """A use of ``t`` as argument ``arg``; a storage first seen here is external."""
    st = t.untyped_storage()
    sid = st._cdata
    if sid not in stream.origins:
        stream.origins[sid] = EXTERNAL
        stream._alive.append(st)
    return TensorUse(arg, sid, tuple(t.shape), t.stride(), t.storage_offset(), dtype_name(t.dtype), write)


def _record(stream: Stream, info: OpInfo, args: tuple, kwargs: dict, out: Any, seg: Segment | None,
            scope_stack: list[str], entry: frozenset[int]) -> None:
    """Append the record of an op to ``stream``: its tensor uses, scalars, scope and frame."""
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
                                    dtype_name(value.dtype), write))
        elif name in info.list_args and isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                if isinstance(v, torch.Tensor):
                    inputs.append(_use(stream, v, f"{name}[{i}]", write))
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
            outputs.append(TensorUse(f"out{i}", sid, tuple(o.shape), o.stride(), o.storage_offset(), dtype_name(o.dtype), True))
    scope = scope_stack[-1] if scope_stack else (seg.scope if seg is not None else "")
    frame = user_frame(3)  # from the caller of __torch_dispatch__ outwards
    stack = user_stack(3, entry) if stream.kind is StreamKind.CAPTURE else ()
    stream.ops.append(
        OpRecord(index, info.name, seg.index if seg is not None else 0, scope, frame,
                 tuple(scalars), tuple(inputs), tuple(outputs), stack)
    )


def _in_break(stream: Stream, info: OpInfo, args: tuple, kwargs: dict, out: Any) -> None:
    """The storages an op inside an eager break allocates, first seen there, are
    in-step (``IN_BREAK``): the break re-runs live on replay. A view it returns is not
    new memory: a break that views a buffer the engine keeps (DeepSeek V4's layers all
    view one KV buffer) leaves that storage external, so the shadow's writes through
    the view are still copied before they land and undone after the shadow."""
    fresh = info.fresh_outputs(out)
    if not fresh:
        return
    inputs = {t.untyped_storage()._cdata for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
    for o in fresh:
        st = o.untyped_storage()
        sid = st._cdata
        if sid not in stream.origins and sid not in inputs:
            stream.origins[sid] = IN_BREAK
            stream._alive.append(st)


def _break_args(stream: Stream, call: rt.BreakCall) -> tuple[BreakArg, ...]:
    out = []
    for path, v in break_leaves(call.named_arguments()):
        if isinstance(v, torch.Tensor):
            out.append(BreakArg(path, _use(stream, v, path, False), None))
        else:
            out.append(BreakArg(path, None, scalar_repr(v)))
    return tuple(out)


class Tracer(rt.CaptureObserver):
    """Records capture, shadow and replay streams; see the module docstring.

    ``roots`` name external tensors (``capturelint.naming``): modules, objects with
    tensor attributes, ``(name, tensor)`` pairs, walked again at each capture and each
    shadowed step. ``on_step(capture, shadow, error)`` is called after
    every replay with ``error`` the max abs difference between the replay's output and
    the shadow's. ``shadow=False`` records captures only. ``probe`` reads the engine's
    forward context (an adapter's); ``scope_group`` maps a module scope to the name
    prefix of the tensors it owns. ``on_stale(capture, event)`` hears a graph that
    found a storage it reads freed by the engine, for graphs that get no shadow;
    ``on_bare(capture, event)`` the other hazards of such graphs (a re-bound holder of
    an input, a read of graph memory that does not hold the value meant: see
    ``capturelint.memory_watch``).
    ``on_hazard(event, captures)`` hears what the emulated runtime saw happen rather
    than what a step computes: a read of graph-pool memory that another graph's replay
    overwrote (``OverwrittenRead``), a stream or event crossing a capture boundary
    (``StreamCaptureEvent``), with the capture streams by graph id.

    Between steps the dispatch mode stays on in the cheap *watch* state of
    ``capturelint.memory_watch`` (allocation lines, bare graphs' memory, overwritten
    graph-pool memory awaiting its graph's next replay).
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
        self._rejoined: list[bool] = []  # per break under way: whether its entry pushed the mode back (``_rejoin``)
        self.on_step = on_step
        self.on_stale = on_stale
        self.on_bare = on_bare
        self.on_hazard = on_hazard
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
        self._shadow: Stream | None = None
        self._shadow_out: list[torch.Tensor] = []
        self._naming = Naming(self.roots)
        self._isolation = ShadowIsolation()
        self._watch = MemoryWatch(self.captures, self._report, self._hazard)
        self._entry: frozenset[int] = frozenset()  # frames running when the current capture began
        self._entry_frames: list[Any] = []
        self.entry_stack: tuple[Frame, ...] = ()  # their engine frames, innermost first
        self.unseen: dict[int, str] = {}  # graphs replayed whose capture the tracer did not see

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> "Tracer":
        self._naming.install()
        rt.add_observer(self)
        self._mode_on_()
        return self

    def __exit__(self, *exc: Any) -> None:
        while self._rejoined:  # a break that raised was never announced as exited
            self._leave_break()
        self._mode_off()
        self.stream = None
        rt.remove_observer(self)
        self._naming.remove()

    def _mode_on_(self) -> None:
        if not self._mode_on:
            self._mode.__enter__()
            self._mode_on = True

    def _mode_off(self) -> None:
        if self._mode_on:
            self._mode_on = False
            self._mode.__exit__(None, None, None)

    def _rejoin(self) -> None:
        """A break begins: where it runs inside the dispatch of an op (its implementation
        is the break, as ``torch.ops.vllm.unified_attention_with_output``'s is), torch has
        taken the dispatch mode off its stack until the op returns, so the break's ops
        would pass unseen: no capture record of them, and no shadow record of what the
        break wrote for its replay to re-apply. The mode is pushed back for the break."""
        rejoin = self._mode_on and not any(m is self._mode for m in _get_current_dispatch_mode_stack())
        if rejoin:
            self._mode.__enter__()
        self._rejoined.append(rejoin)

    def _leave_break(self) -> None:
        if self._rejoined and self._rejoined.pop():
            self._mode.__exit__(None, None, None)

    @property
    def scope(self) -> str:
        return self._naming.scope

    # -------------------------------------------------------------- op records
    def _dispatch(self, func: Any, args: tuple, kwargs: dict, mode: TorchDispatchMode) -> Any:
        info = op_info(func)
        if info.decomposes:  # under inference mode: trace what it decomposes into (runtime.schema)
            with mode:
                return func.decompose(*args, **kwargs)
        stream = self.stream
        if stream is None:
            watch = self._watch
            if watch.overwritten and info.replay is not ReplayKind.SKIP and not info.transparent:
                watch.reads_overwritten(info, args, kwargs)
            out = func(*args, **kwargs)
            if info.allocates and not info.transparent:
                watch.allocated(info.allocates, out)
            if watch.graph_memory:
                watch.eager_op(info, args, kwargs, out)
            return out
        if info.transparent:
            # detach is a no-op alias for replay purposes, and stacked dispatch modes add
            # it to factory ops at capture only: recording it would fake a divergence.
            return func(*args, **kwargs)
        if info.wraps is not None and info.records_through(stream.breaks_eager):
            # the capture records the ops the op's implementation runs (runtime.cudagraph):
            # the streams record them too, capture and shadow alike
            return call_through(mode, func, args, kwargs)
        isolation = self._isolation
        if isolation.call is not None:
            isolation.call.uses(info, args, kwargs, stream)
        if isolation.active and info.writes:
            isolation.copy_before_write(info, args, kwargs, stream)
        segment = self._segment
        out = func(*args, **kwargs)
        if self._segment is not segment:
            # The op's implementation entered an eager break (vLLM's sparse_attn_indexer op
            # is itself one): the segment changed inside the call, so on a GPU the op ran
            # eagerly between two captured segments, and no graph holds it. What it
            # allocated is the break's (as in-step, not external).
            _in_break(stream, info, args, kwargs, out)
            return out
        if isolation.active and self._segment is not None and self._segment.kind is SegmentKind.EAGER:
            # Ops inside a shadow's eager break re-run live on replay and are exempt from
            # R1-R4: only the storages they allocate matter (as in-step, not external).
            _in_break(stream, info, args, kwargs, out)
            return out
        _record(stream, info, args, kwargs, out, self._segment, self._naming.scope_stack, self._entry)
        return out

    def _report(self, event: GraphMemoryRead) -> None:
        if self.on_bare is not None:
            self.on_bare(self.captures[event.graph_id], event)

    def _hazard(self, event: Any) -> None:
        if self.on_hazard is not None:
            captures = self.captures
            if self.stream is not None and self.stream.kind is StreamKind.CAPTURE:  # the capture under way
                captures = {**captures, self.stream.graph_id: self.stream}
            self.on_hazard(event, captures)

    # ------------------------------------------------------------ stream setup
    def _snapshot(self) -> ContextSnapshot:
        return self.probe() if self.probe is not None else ContextSnapshot(NO_CONTEXT)

    def _new_stream(self, kind: StreamKind, graph: rt.GraphInfo) -> Stream:
        snap = self._snapshot()
        s = Stream(kind, graph.id, graph.label, graph.mode, self.step, snap.summary,
                   break_outputs=graph.break_outputs, breaks_eager=graph.breaks_eager,
                   allocation_frames=self._watch.alloc_frames, scope_group=self.scope_group)
        s.static_names = self._naming.static_names
        names = self._naming.root_names(s)
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

    # ----------------------------------------------------------- observer API
    def on_graph_begin(self, graph: rt.GraphInfo, phase: rt.Phase) -> None:
        if phase is rt.Phase.CAPTURE:
            self._entry, self._entry_frames = running_frames()
            self.entry_stack = user_stack(2)
            self.stream = self._new_stream(StreamKind.CAPTURE, graph)
            self.stream.allocation_mark = self._watch.allocations
            if not graph.segmented:
                self._open_segment(self.stream, 0, SegmentKind.CAPTURED, None)
            self._mode_on_()
        elif phase is rt.Phase.REPLAY and graph.segmented:
            self._watch.segmented_replay(graph)
        elif phase is rt.Phase.REPLAY and not graph.segmented:
            if graph.id not in self.captures:
                self.unseen[graph.id] = graph.label
            else:
                self._watch.bare_replay(graph)
            self._mode_off()  # a bare graph's replay is not traced

    def on_graph_end(self, graph: rt.GraphInfo, phase: rt.Phase, output: Any) -> None:
        if phase is rt.Phase.CAPTURE and self.stream is not None:
            if not graph.segmented:
                self._close_segment(self.stream)
            self.stream.output_storages = tuple(t.untyped_storage()._cdata for t in rt.flatten_tensors(output))
            names = self._naming.root_names(self.stream)  # tensors the engine made during the capture
            for sid, extra in names.items():
                self.stream.names[sid] = tuple(dict.fromkeys(self.stream.names.get(sid, ()) + tuple(extra)))
            self.captures[graph.id] = self.stream
            if not graph.segmented:
                self._watch.bare_captured(graph, self.stream)
            else:
                self._watch.segmented_captured(graph, self.stream)
            self.stream = None
            self._entry, self._entry_frames = frozenset(), []
        elif phase is rt.Phase.REPLAY:
            self._watch.replayed(graph)  # the graph rewrote its own memory
            self._mode_on_()  # back to watching allocations between steps
            if self._shadow is None and not graph.segmented:
                self.replays += 1
                self.bare_replays += 1
            if self._shadow is not None:
                # The replay itself is not traced: captured segments re-issue what the capture
                # recorded, and eager segments reused the shadow's break calls.
                shadow, self._shadow = self._shadow, None
                error = max_abs_diff(list(rt.flatten_tensors(output)), self._shadow_out)
                self._shadow_out, self._isolation.calls = [], []
                self.replays += 1
                if self.on_step is not None:
                    self.on_step(self.captures[graph.id], shadow, error)
                shadow.release()

    def on_stale_input(self, event: rt.StaleInputEvent) -> None:
        capture = self.captures.get(event.graph.id)
        if capture is not None and self.on_stale is not None and not event.graph.segmented:
            capture.names_now = {name: sid for sid, names in self._naming.root_names(capture).items() for name in names}
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

    def on_pool_overwrite(self, event: rt.PoolOverwriteEvent) -> None:
        if event.graph.id in self.captures:
            self._watch.overwritten[event.storage] = event

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
        self._rejoin()
        stream = self.stream
        if stream is None:
            return
        if stream.kind is StreamKind.SHADOW:
            if call.depth == 0 and stream.breaks_eager:
                self._close_segment(stream)
                seg = self._open_segment(stream, len(stream.segments), SegmentKind.EAGER, call.name)
                seg.break_args = _break_args(stream, call)
                seg.break_frame = call.frame
                with _disable_current_modes():  # the tracer's own copies are no ops of the step
                    self._isolation.call = ShadowBreak(call.name, list(rt.flatten_tensors((call.args, call.kwargs))),
                                                       random_states(self.roots), list(break_leaves(call.named_arguments())),
                                                       stream.origins)
        elif not call.inline and self._segment is not None:
            self._segment.break_args = _break_args(stream, call)
            self._segment.break_frame = call.frame
            self._segment.break_stack = user_stack(2, self._entry)

    def on_break_exit(self, call: rt.BreakCall, result: Any) -> None:
        self._leave_break()
        stream = self.stream
        if stream is None:
            return
        returned = frozenset(t.untyped_storage()._cdata for t in rt.flatten_tensors(result))
        if stream.kind is StreamKind.SHADOW:
            if call.depth == 0 and stream.breaks_eager:
                with _disable_current_modes():
                    self._isolation.break_exit(result)
                if self._segment is not None:
                    self._segment.returned = returned
                self._close_segment(stream)
                self._open_segment(stream, len(stream.segments), SegmentKind.CAPTURED, None)
        elif not call.inline and self._segment is not None:
            self._segment.returned = returned

    def replayed_break(self, call: rt.BreakCall) -> rt.RecordedBreak | None:
        """The shadow's record of this break call, for the replay to reuse
        (``ShadowIsolation.reuse``)."""
        return self._isolation.reuse(call)

    def before_replay(self, graph: rt.GraphInfo, shadow: Callable[[], Any]) -> None:
        if graph.id not in self.captures:
            self.unseen[graph.id] = graph.label
        if not self.shadow_enabled or graph.id not in self.captures:
            self._mode_off()
            return
        self.step += 1
        self.replayed_graphs[graph.label] = self.replayed_graphs.get(graph.label, 0) + 1
        stream = self._new_stream(StreamKind.SHADOW, graph)
        self.stream = stream
        self._isolation.begin()
        self._open_segment(stream, 0, SegmentKind.CAPTURED, None)
        self._isolation.save_random(self.roots)
        self._mode_on_()
        try:
            out = shadow()
        finally:
            self._mode_off()
            self._close_segment(stream)
            self.stream = None
            self._isolation.undo()
        self._shadow_out = [t.detach().clone() for t in rt.flatten_tensors(out)]
        stream.output_storages = tuple(t.untyped_storage()._cdata for t in rt.flatten_tensors(out))
        self._shadow = stream
