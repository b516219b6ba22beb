"""The tracer: records what a capture recorded and what each replay step should compute.

It is two things at once: a ``TorchDispatchMode`` that sees every op, and a
``CaptureObserver`` that hears the capture runtime announce graphs, segments and breaks.
From them it builds **streams**, one per run of the forward it checks:

- ``CAPTURE``: the ops of a capture, each tagged with its segment (captured, or the
  eager break it ran in);
- ``SHADOW``: an eager execution of a replay step (same inputs, same forward context),
  segmented the way the capture was: in a PIECEWISE graph each outermost would-be break
  opens an eager segment; in a FULL graph nothing does. Ops inside a shadow's eager
  segments re-run live on replay and are exempt from R1-R4, so only the storages they
  allocate are kept, not op records.

The replay itself is not traced: its captured segments re-issue what the capture
recorded, and its eager segments re-run the code the shadow just ran. The dispatch mode
is pushed only while a capture or a shadow records, never during replays.

The shadow has no side effects: before an op writes a storage that existed before the
shadow began, the tracer copies the storage; after the shadow it restores every copy,
so the replay starts from exactly the state the shadow started from. Write sets come
from the op schema (``alias_info.is_write``, which covers in-place ops, ``out=`` tensors
and custom ops' mutated arguments).

**Storage identity.** A tensor's location is its storage (``StorageId``, the identity
of the storage object, kept alive by the stream that saw it so that it is never reused)
plus its view geometry. A storage is *in-step* when an op of the stream allocated it,
*external* otherwise (parameters, runner buffers, caches, metadata).

**Cost.** Recording an op costs about 28 us on this project's 2-core machine
(``bench/bench_ops.py``: the dispatch-mode hop, the storage bookkeeping, the record; on
top of the emulated graph's own ~60 us). The source frame of an op is resolved once per
code object and line (``_frame``, cached ``Frame`` objects, below the noise of the
benchmark); the capture-time stack (``_stack``) is walked in captures only. A shadow's
records are released as soon as its step is analyzed; capture streams live until the
configuration's graph maps are made. A traced run freezes the objects alive before it for
the collector (``harness.quiet_gc``), which otherwise walked every record per collection.

After each replay the tracer hands ``(capture, shadow)`` to ``on_step``; the
analyzer (``capturelint.analyzer``) turns them into findings. The tracer knows nothing
of any particular engine: it names tensors from the roots it is given (modules,
objects with tensor attributes, ``(name, tensor)`` pairs) and from the forward context.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
import weakref
from typing import Any, Callable, Iterable, Iterator, NamedTuple

import torch
import torch.nn.modules.module as module_hooks
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from capturelint.runtime import protocol as rt
from capturelint.runtime.protocol import Frame, SegmentKind

StorageId = int  # identity of a storage object, valid while the stream holds it
OpIndex = int  # position of an op in its stream
SegmentIndex = int

rt.register_runtime_file(__file__)
_DETACH = torch.ops.aten.detach.default
_transparent_cache: dict[Any, bool] = {}


def _transparent(func: Any) -> bool:
    """``detach`` and ops registered with ``register_transparent_op``: aliases with no
    kernel, which stacked dispatch modes and runtimes add at capture only."""
    hit = _transparent_cache.get(func)
    if hit is None:
        hit = _transparent_cache[func] = func is _DETACH or rt.is_transparent_op(func.name())
    return hit


class StreamKind(enum.Enum):
    CAPTURE = "capture"
    SHADOW = "shadow"

    def __str__(self) -> str:
        return self.value


class TensorUse(NamedTuple):
    """One tensor argument or output of an op: where it lives and how it is viewed.

    Op and tensor records are named tuples rather than frozen dataclasses: the tracer
    makes one per tensor of every op, and a frozen dataclass's ``__init__`` costs several
    times more (it was a third of the tracer's time)."""

    arg: str
    storage: StorageId
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: str
    write: bool

    @property
    def geometry(self) -> tuple:
        return (self.shape, self.stride, self.offset, self.dtype)

    def describe_geometry(self) -> str:
        return f"{self.dtype}{list(self.shape)} stride {list(self.stride)} offset {self.offset}"


class OpRecord(NamedTuple):
    """One dispatcher call. ``scalars`` are the non-tensor arguments as ``(name, value)``
    (lists as tuples); ``scalar_repr`` prints a value for messages."""

    index: OpIndex
    op: str
    segment: SegmentIndex
    scope: str
    frame: Frame
    scalars: tuple[tuple[str, Any], ...]
    inputs: tuple[TensorUse, ...]
    outputs: tuple[TensorUse, ...]
    stack: tuple[Frame, ...] = ()  # capture streams: engine frames, innermost first, up to the captured callable

    @property
    def key(self) -> tuple[str, str]:
        """What R1 compares: the op and the module it ran in."""
        return (self.op, self.scope)


@dataclasses.dataclass(frozen=True)
class BreakArg:
    """An argument handed to an eager break: a tensor use or a scalar's repr."""

    path: str
    tensor: TensorUse | None
    scalar: str | None


@dataclasses.dataclass
class Segment:
    """A segment of a stream. ``name`` is the break's qualified name for eager segments."""

    index: SegmentIndex
    kind: SegmentKind
    name: str | None
    scope: str
    first_op: OpIndex
    end_op: OpIndex = -1
    break_args: tuple[BreakArg, ...] = ()
    break_frame: Frame | None = None
    break_stack: tuple[Frame, ...] = ()  # capture streams: the engine frames that called the break
    returned: frozenset[StorageId] = frozenset()

    @property
    def label(self) -> str:
        return f"#{self.index} {self.kind}" + (f" {self.name}" if self.name else "")


class Origin(NamedTuple):
    """Where a storage came from in a stream: external, or allocated by op ``producer``."""

    external: bool
    producer: OpIndex | None


@dataclasses.dataclass(frozen=True)
class ContextSummary:
    """What the forward context held, as an adapter's probe describes it.

    ``key`` is what two contexts are compared by (e.g. ``"metadata"`` / ``"none"``);
    ``text`` says it in words for messages (``attn_metadata was None``).
    """

    key: str
    text: str

    def describe(self) -> str:
        return self.text


NO_CONTEXT = ContextSummary("", "no forward context")


@dataclasses.dataclass(frozen=True)
class ContextSnapshot:
    """What a context probe returns: a summary and the context's tensors by name."""

    summary: ContextSummary
    tensors: tuple[tuple[str, torch.Tensor], ...] = ()


ContextProbe = Callable[[], ContextSnapshot]
"""An adapter's reader of the engine's forward context, called at capture and at each
shadowed step."""

ScopeGroup = Callable[[str], "str | None"]
"""Maps a module scope to the prefix that the names of tensors it owns carry (the
bundled adapter maps ``model.layers.3.attn`` to ``layers.3``), so that a tensor shared
by every layer is named after the layer that read it."""


_EXTERNAL = Origin(True, None)
_IN_BREAK = Origin(False, None)  # allocated inside a shadow's eager break (not recorded op by op)


@dataclasses.dataclass
class Stream:
    """The ops of one run of the forward, with their segments and storages."""

    kind: StreamKind
    graph_id: int
    graph: str
    runtime_mode: str
    step: int
    context: ContextSummary
    ops: list[OpRecord] = dataclasses.field(default_factory=list)
    segments: list[Segment] = dataclasses.field(default_factory=list)
    origins: dict[StorageId, Origin] = dataclasses.field(default_factory=dict)
    names: dict[StorageId, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    static_names: dict[StorageId, tuple[str, ...]] = dataclasses.field(default_factory=dict, repr=False)
    copy_break_outputs: bool = True
    breaks_eager: bool = True
    output_storages: tuple[StorageId, ...] = ()
    allocation_frames: dict[StorageId, tuple[Frame, Any]] = dataclasses.field(default_factory=dict, repr=False)
    names_now: dict[str, StorageId] = dataclasses.field(default_factory=dict, repr=False)  # root paths at a stale replay
    scope_group: ScopeGroup | None = dataclasses.field(default=None, repr=False)
    _alive: list[Any] = dataclasses.field(default_factory=list, repr=False)

    def segment_ops(self, index: SegmentIndex) -> list[OpRecord]:
        seg = self.segments[index]
        return self.ops[seg.first_op : seg.end_op]

    def name_of(self, storage: StorageId, scope: str = "") -> str | None:
        names = self.names.get(storage, ()) + self.static_names.get(storage, ())
        if not names:
            return None
        if scope and len(names) > 1 and self.scope_group is not None:
            # A tensor shared by every layer's metadata is named after the op's layer.
            group = self.scope_group(scope)
            if group is not None:
                for n in names:
                    if group + "." in n:
                        return n
        return names[0]

    def allocated_at(self, storage: StorageId) -> Frame | None:
        """The source line that allocated an external storage, when the tracer saw it.
        An entry counts only while the storage it was made for is alive: a storage made
        later at the same address, unseen, does not inherit it."""
        entry = self.allocation_frames.get(storage)
        if entry is None or entry[1]() is None:
            return None
        return entry[0]

    def release(self) -> None:
        self._alive.clear()


class _SchemaInfo:
    """Per-overload argument layout, computed once: which arguments are tensors, which
    of those the op writes, and which returns are fresh allocations (``fresh``; empty
    for views and for ops that write an argument)."""

    __slots__ = ("args", "fresh", "name", "list_args", "writes")

    def __init__(self, func: Any):
        self.name = str(func)
        self.args = []
        self.list_args = set()  # arguments typed as lists that may hold tensors
        for pos, a in enumerate(func._schema.arguments):
            write = a.alias_info is not None and a.alias_info.is_write
            self.args.append((pos, a.name, a.kwarg_only, write))
            kind = str(a.type)
            if "Tensor" in kind and (kind.startswith("List[") or kind.endswith("[]")):
                self.list_args.add(a.name)
        self.writes = [arg for arg in self.args if arg[3]]
        fresh = tuple(r.alias_info is None for r in func._schema.returns)
        self.fresh = fresh if any(fresh) and not self.writes else ()


_schema_cache: dict[Any, _SchemaInfo] = {}


def _schema(func: Any) -> _SchemaInfo:
    info = _schema_cache.get(func)
    if info is None:
        info = _schema_cache[func] = _SchemaInfo(func)
    return info


_frames: dict[tuple, Frame] = {}
_code_names: dict[Any, bool | None] = {}


def _frame() -> Frame:
    """The op's source frame (innermost engine or model frame), one ``Frame`` object
    per distinct location. Runs once per recorded op, so it caches per code object."""
    f = sys._getframe(3)
    while f is not None:
        code = f.f_code
        if _shown(code):
            return _code_frame(code, f.f_lineno)
        f = f.f_back
    return Frame("<unknown>", 0, "<unknown>")


def _shown(code: Any) -> bool:
    shown = _code_names.get(code)
    if shown is None:
        shown = _code_names[code] = not rt.hidden_code(code)
    return shown


def _code_frame(code: Any, line: int) -> Frame:
    key = (code, line)
    frame = _frames.get(key)
    if frame is None:
        frame = _frames[key] = rt.code_frame(code, line)
    return frame


def _stack(f: Any, stop: frozenset[int]) -> tuple[Frame, ...]:
    """The engine frames from ``f`` outwards, innermost first, up to (not including)
    the first frame in ``stop`` (the frames that were running when the capture began,
    so the outermost frame kept is the captured callable's). Captures only: the walk
    costs a few microseconds per op."""
    out = []
    while f is not None and id(f) not in stop:
        code = f.f_code
        if _shown(code):
            out.append(_code_frame(code, f.f_lineno))
        f = f.f_back
    return tuple(out)


def capture_stack(stack: tuple[Frame, ...], entry: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """``stack`` (a full engine stack inside a capture) without the frames that were
    running when the capture began (``entry``, its outer end)."""
    if entry and len(stack) >= len(entry) and stack[len(stack) - len(entry):] == entry:
        return stack[: len(stack) - len(entry)]
    return stack


def _running_frames() -> tuple[frozenset[int], list[Any]]:
    """The ids of the frames running now, and the frames: held until the capture ends,
    so that no frame made during the capture can get one of their ids."""
    f, frames = sys._getframe(1), []
    while f is not None:
        frames.append(f)
        f = f.f_back
    return frozenset(id(x) for x in frames), frames


_dtype_names: dict[torch.dtype, str] = {}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = str(dtype).removeprefix("torch.")
    return name


def scalar_repr(value: Any) -> str:
    if isinstance(value, float):
        return repr(round(value, 9))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(scalar_repr(v) for v in value) + "]"
    return repr(value) if not isinstance(value, (torch.dtype, torch.device)) else str(value)


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
        return self.tracer._dispatch(func, args, kwargs or {})


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
    found a storage it reads freed by the engine, for graphs that get no shadow.

    Between steps the dispatch mode stays on in a cheap *watch* state that only notes
    which source line allocated each new storage, so that a finding about a
    re-allocated tensor can name the line that re-allocated it.
    """

    def __init__(
        self,
        roots: dict[str, Any] | None = None,
        on_step: Callable[[Stream, Stream, float], None] | None = None,
        shadow: bool = True,
        probe: ContextProbe | None = None,
        scope_group: ScopeGroup | None = None,
        on_stale: Callable[[Stream, rt.StaleInputEvent], None] | None = None,
    ):
        self.roots = roots or {}
        self._mode = _OpMode(self)
        self._mode_on = False
        self.on_step = on_step
        self.on_stale = on_stale
        self.shadow_enabled = shadow
        self.probe = probe
        self.scope_group = scope_group
        self.captures: dict[int, Stream] = {}
        self.stream: Stream | None = None
        self.step = 0
        self.replays = 0
        self._segment: Segment | None = None
        self._cow: dict[StorageId, tuple[Any, Any]] | None = None
        self._rng: list[tuple[Any, Any]] = []
        self._shadow: Stream | None = None
        self._shadow_out: list[torch.Tensor] = []
        self._scope_stack: list[str] = []
        self._module_names: dict[int, str] = {}
        self._hooks: list[Any] = []
        self._static_names: dict[StorageId, tuple[str, ...]] = {}
        self._static_alive: list[Any] = []
        self._alloc_frames: dict[StorageId, tuple[Frame, Any]] = {}  # frame, weakref to the storage
        self._entry: frozenset[int] = frozenset()  # frames running when the current capture began
        self._entry_frames: list[Any] = []
        self.entry_stack: tuple[Frame, ...] = ()  # their engine frames, innermost first
        self.unseen: dict[int, str] = {}  # graphs replayed whose capture the tracer did not see

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
            for prefix, module in _modules(root_name, root):
                for name, m in module.named_modules():
                    self._module_names.setdefault(id(m), f"{prefix}.{name}" if name and prefix else name or prefix)
        self._static_names = {sid: tuple(v) for sid, v in names.items()}

    def _root_names(self, stream: Stream) -> dict[StorageId, list[str]]:
        """Names of the tensors the non-module roots hold now (modules were indexed once)."""
        names: dict[StorageId, list[str]] = {}
        for root_name, root in self.roots.items():
            if isinstance(root, torch.nn.Module):
                continue
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
    def _dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        stream = self.stream
        if stream is None:
            out = func(*args, **kwargs)
            if not _transparent(func):
                self._watch(func, out)
            return out
        if _transparent(func):
            # detach is a no-op alias for replay purposes, and stacked dispatch modes add
            # it to factory ops at capture only: recording it would fake a divergence.
            return func(*args, **kwargs)
        info = _schema(func)
        if self._cow is not None and info.writes:
            self._copy_before_write(info, args, kwargs, stream)
        out = func(*args, **kwargs)
        if self._cow is not None and self._segment is not None and self._segment.kind is SegmentKind.EAGER:
            # Ops inside a shadow's eager break re-run live on replay and are exempt from
            # R1-R4: only the storages they allocate matter (as in-step, not external).
            for o in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(o, torch.Tensor):
                    st = o.untyped_storage()
                    if st._cdata not in stream.origins:
                        stream.origins[st._cdata] = _IN_BREAK
                        stream._alive.append(st)
            return out
        self._record(stream, func, info, args, kwargs, out)
        return out

    def _watch(self, func: Any, out: Any) -> None:
        """Between steps: note the source line of each fresh allocation."""
        fresh = _schema(func).fresh
        if not fresh:
            return
        for o, is_fresh in zip(out if len(fresh) > 1 else (out,), fresh):
            if is_fresh and isinstance(o, torch.Tensor):
                st = o.untyped_storage()  # the same Python object for the storage's life
                self._alloc_frames[st._cdata] = (_frame(), weakref.ref(st))

    def _copy_before_write(self, info: _SchemaInfo, args: tuple, kwargs: dict, stream: Stream) -> None:
        for pos, name, kwarg_only, _ in info.writes:
            value = kwargs.get(name) if kwarg_only or pos >= len(args) else args[pos]
            for t in value if isinstance(value, (list, tuple)) else (value,):
                if not isinstance(t, torch.Tensor):
                    continue
                st = t.untyped_storage()
                sid = st._cdata
                origin = stream.origins.get(sid)
                if (origin is None or origin.external) and sid not in self._cow:
                    self._cow[sid] = (st, st.clone())

    def _use(self, stream: Stream, t: torch.Tensor, arg: str, write: bool) -> TensorUse:
        st = t.untyped_storage()
        sid = st._cdata
        if sid not in stream.origins:
            stream.origins[sid] = _EXTERNAL
            stream._alive.append(st)
        return TensorUse(arg, sid, tuple(t.shape), t.stride(), t.storage_offset(), _dtype_name(t.dtype), write)

    def _record(self, stream: Stream, func: Any, info: _SchemaInfo, args: tuple, kwargs: dict, out: Any) -> None:
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
                    origins[sid] = _EXTERNAL
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
        frame = _frame()
        stack = _stack(sys._getframe(2), self._entry) if stream.kind is StreamKind.CAPTURE else ()
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
                   copy_break_outputs=graph.break_outputs is rt.BreakOutputs.COPY, breaks_eager=graph.breaks_eager,
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
        for path, v in _break_leaves(call.named_arguments()):
            if isinstance(v, torch.Tensor):
                out.append(BreakArg(path, self._use(stream, v, path, False), None))
            else:
                out.append(BreakArg(path, None, scalar_repr(v)))
        return tuple(out)

    # ----------------------------------------------------------- observer API
    def on_graph_begin(self, graph: rt.GraphInfo, phase: rt.Phase) -> None:
        if phase is rt.Phase.CAPTURE:
            self._entry, self._entry_frames = _running_frames()
            self.entry_stack = _stack(sys._getframe(1), frozenset())
            self.stream = self._new_stream(StreamKind.CAPTURE, graph)
            if not graph.segmented:
                self._open_segment(self.stream, 0, SegmentKind.CAPTURED, None)
            self._mode_on_()
        elif phase is rt.Phase.REPLAY and not graph.segmented:
            if graph.id not in self.captures:
                self.unseen[graph.id] = graph.label
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
            self.stream = None
            self._entry, self._entry_frames = frozenset(), []
        elif phase is rt.Phase.REPLAY:
            self._mode_on_()  # back to watching allocations between steps
            if not graph.segmented:
                self.replays += 1
            if self._shadow is not None:
                # The replay itself is not traced: captured segments re-issue what the capture
                # recorded, and eager segments re-run the code the shadow just ran.
                shadow, self._shadow = self._shadow, None
                error = _max_abs_diff(list(rt.flatten_tensors(output)), self._shadow_out)
                self._shadow_out = []
                self.replays += 1
                if self.on_step is not None:
                    self.on_step(self.captures[graph.id], shadow, error)
                shadow.release()

    def on_stale_input(self, event: rt.StaleInputEvent) -> None:
        capture = self.captures.get(event.graph.id)
        if capture is not None and self.on_stale is not None and not event.graph.segmented:
            capture.names_now = {name: sid for sid, names in self._root_names(capture).items() for name in names}
            self.on_stale(capture, event)

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
        elif not call.inline and self._segment is not None:
            self._segment.break_args = self._break_args(stream, call)
            self._segment.break_frame = call.frame
            self._segment.break_stack = _stack(sys._getframe(1), self._entry)

    def on_break_exit(self, call: rt.BreakCall, result: Any) -> None:
        stream = self.stream
        if stream is None:
            return
        returned = frozenset(t.untyped_storage()._cdata for t in rt.flatten_tensors(result))
        if stream.kind is StreamKind.SHADOW:
            if call.depth == 0 and stream.breaks_eager:
                if self._segment is not None:
                    self._segment.returned = returned
                self._close_segment(stream)
                self._open_segment(stream, len(stream.segments), SegmentKind.CAPTURED, None)
        elif not call.inline and self._segment is not None:
            self._segment.returned = returned

    def before_replay(self, graph: rt.GraphInfo, shadow: Callable[[], Any]) -> None:
        if graph.id not in self.captures:
            self.unseen[graph.id] = graph.label
        if not self.shadow_enabled or graph.id not in self.captures:
            self._mode_off()
            return
        self.step += 1
        stream = self._new_stream(StreamKind.SHADOW, graph)
        self.stream, self._cow = stream, {}
        self._open_segment(stream, 0, SegmentKind.CAPTURED, None)
        self._rng = _random_states(self.roots)
        self._mode_on_()
        try:
            out = shadow()
        finally:
            self._mode_off()
            self._close_segment(stream)
            self.stream = None
            with torch.no_grad():
                for st, saved in self._cow.values():
                    st.copy_(saved)
            self._cow = None
            _restore_random_states(self._rng)
            self._rng = []
        self._shadow_out = [t.detach().clone() for t in rt.flatten_tensors(out)]
        stream.output_storages = tuple(t.untyped_storage()._cdata for t in rt.flatten_tensors(out))
        self._shadow = stream


def _modules(name: str, root: Any) -> Iterator[tuple[str, torch.nn.Module]]:
    """The modules a root holds, with the scope prefix their ops get: a module root
    names its own submodules (``layers.0.attn``); an object root's module attributes
    are named by path (``server.model.0``)."""
    if isinstance(root, torch.nn.Module):
        yield "", root
        return
    attrs = root.items() if isinstance(root, dict) else getattr(root, "__dict__", {}).items()
    for key, value in attrs:
        if isinstance(value, torch.nn.Module):
            yield f"{name}.{key}", value


def _random_states(roots: dict[str, Any]) -> list[tuple[Any, Any]]:
    """The state of every random generator a shadow may advance: the CPU default
    generator, the CUDA generators (where CUDA is initialised), and every
    ``torch.Generator`` reachable from the roots."""
    states: list[tuple[Any, Any]] = [(torch.random.default_generator, torch.random.default_generator.get_state())]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i in range(torch.cuda.device_count()):
            gen = torch.cuda.default_generators[i]
            states.append((gen, gen.get_state()))
    seen = {id(torch.random.default_generator)}
    for gen in _generators(roots):
        if id(gen) not in seen:
            seen.add(id(gen))
            states.append((gen, gen.get_state()))
    return states


def _restore_random_states(states: list[tuple[Any, Any]]) -> None:
    for gen, state in states:
        gen.set_state(state)


def _generators(obj: Any, depth: int = 0, seen: set[int] | None = None) -> Iterator[torch.Generator]:
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 3 or obj is None or isinstance(obj, (int, float, str, bool, torch.Tensor)):
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Generator):
        yield obj
        return
    if isinstance(obj, dict):
        values: Iterable[Any] = obj.values()
    elif isinstance(obj, (list, tuple)):
        values = obj
    elif isinstance(obj, torch.nn.Module):
        values = [v for k, v in vars(obj).items() if not k.startswith("_")] + list(obj.children())
    else:
        values = [v for k, v in getattr(obj, "__dict__", {}).items() if not k.startswith("__")]
    for v in values:
        yield from _generators(v, depth + 1, seen)


def _break_leaves(named: list[tuple[str, Any]], depth: int = 0) -> Iterator[tuple[str, Any]]:
    """The values handed to a break, by path: tensors and plain scalars inside tuples,
    lists, dicts, NamedTuples, dataclasses and objects with attributes
    (``metadata.slot_mapping``, ``args[1]``). Other objects are not compared."""
    for path, v in named:
        if isinstance(v, torch.Tensor) or isinstance(v, (int, float, bool, str, type(None), torch.dtype, torch.device)):
            yield path, v
        elif depth >= 4 or callable(v) and not dataclasses.is_dataclass(v):
            continue
        elif isinstance(v, dict):
            yield from _break_leaves([(f"{path}[{k!r}]", x) for k, x in v.items()], depth + 1)
        elif isinstance(v, tuple) and hasattr(v, "_fields"):
            yield from _break_leaves([(f"{path}.{k}", getattr(v, k)) for k in v._fields], depth + 1)
        elif isinstance(v, (list, tuple)):
            yield from _break_leaves([(f"{path}[{i}]", x) for i, x in enumerate(v)], depth + 1)
        elif dataclasses.is_dataclass(v):
            yield from _break_leaves([(f"{path}.{f.name}", getattr(v, f.name)) for f in dataclasses.fields(v)], depth + 1)
        elif isinstance(v, torch.nn.Module):
            continue  # parameters and buffers are external and compared by the ops that read them
        elif hasattr(v, "__dict__"):
            yield from _break_leaves(
                [(f"{path}.{k}", x) for k, x in vars(v).items() if not k.startswith("_")], depth + 1
            )


def _max_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    if len(a) != len(b):
        return float("inf")
    worst = 0.0
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return float("inf")
        if x.numel():
            d = (x.detach().double() - y.double()).abs().max()
            worst = max(worst, float("inf") if torch.isnan(d) else float(d))
    return worst


def named_tensors(prefix: str, obj: Any, depth: int = 0, sep: str = ".") -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors reachable from ``obj`` with readable paths, two levels deep."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
        return
    if depth > 2 or obj is None or isinstance(obj, (int, float, str, bool)):
        return
    if isinstance(obj, torch.nn.Module):
        for n, p in obj.named_parameters():
            yield f"{prefix}.{n}", p
        for n, b in obj.named_buffers():
            yield f"{prefix}.{n}", b
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from named_tensors(f"{prefix}[{k!r}]", v, depth + 1, sep=".")
        return
    if isinstance(obj, (list, tuple)):
        if obj and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in obj):
            for n, t in obj:
                yield from named_tensors(n, t, depth + 1)
            return
        for i, v in enumerate(obj):
            yield from named_tensors(f"{prefix}[{i}]", v, depth + 1)
        return
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from named_tensors(f"{prefix}.{f.name}", getattr(obj, f.name), depth + 1)
        return
    attrs = getattr(obj, "__dict__", None)
    if attrs:
        for k, v in attrs.items():
            if not k.startswith("__"):
                yield from named_tensors(f"{prefix}.{k}", v, depth + 1)
