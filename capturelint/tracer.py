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

After each replay the tracer hands ``(capture, shadow)`` to ``on_step``; the
analyzer (``capturelint.analyzer``) turns them into findings. The tracer knows nothing
of any particular engine: it names tensors from the roots it is given (modules,
objects with tensor attributes, ``(name, tensor)`` pairs) and from the forward context.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import sys
from typing import Any, Callable, Iterator, NamedTuple

import torch
import torch.nn.modules.module as module_hooks
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from capturelint.engine import cudagraph as rt
from capturelint.engine.forward_context import CUDAGraphMode, get_forward_context, has_forward_context
from capturelint.findings import Frame

StorageId = int  # identity of a storage object, valid while the stream holds it
OpIndex = int  # position of an op in its stream
SegmentIndex = int

rt.register_runtime_file(__file__)
_DETACH = torch.ops.aten.detach.default
_LAYER = re.compile(r"layers\.\d+")


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
    kind: rt.SegmentKind
    name: str | None
    scope: str
    first_op: OpIndex
    end_op: OpIndex = -1
    break_args: tuple[BreakArg, ...] = ()
    break_frame: Frame | None = None
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
    """What the forward context held: enough to explain a divergence."""

    has_metadata: bool
    metadata_keys: int
    runtime_mode: str

    def describe(self) -> str:
        if not self.has_metadata:
            return "attn_metadata was None"
        return f"attn_metadata held {self.metadata_keys} entries"


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
    output_storages: tuple[StorageId, ...] = ()
    _alive: list[Any] = dataclasses.field(default_factory=list, repr=False)

    def segment_ops(self, index: SegmentIndex) -> list[OpRecord]:
        seg = self.segments[index]
        return self.ops[seg.first_op : seg.end_op]

    def name_of(self, storage: StorageId, scope: str = "") -> str | None:
        names = self.names.get(storage, ()) + self.static_names.get(storage, ())
        if not names:
            return None
        if scope and len(names) > 1:
            # A tensor shared by every layer's metadata is named after the op's layer.
            m = _LAYER.search(scope)
            if m is not None:
                for n in names:
                    if m.group(0) + "." in n:
                        return n
        return names[0]

    def release(self) -> None:
        self._alive.clear()


class _SchemaInfo:
    """Per-overload argument layout, computed once: which arguments are tensors and
    which of those the op writes."""

    __slots__ = ("args", "name", "list_args", "writes")

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


_schema_cache: dict[Any, _SchemaInfo] = {}


def _schema(func: Any) -> _SchemaInfo:
    info = _schema_cache.get(func)
    if info is None:
        info = _schema_cache[func] = _SchemaInfo(func)
    return info


_frames: dict[tuple, Frame] = {}
_code_names: dict[Any, tuple[str, str] | None] = {}


def _frame() -> Frame:
    """The op's source frame (innermost engine or model frame), one ``Frame`` object
    per distinct location. Runs once per recorded op, so it caches per code object."""
    f = sys._getframe(3)
    while f is not None:
        code = f.f_code
        names = _code_names.get(code, False)
        if names is False:
            names = None if rt.hidden_code(code) else (rt._display_path(code.co_filename), code.co_name)
            _code_names[code] = names
        if names is not None:
            key = (code, f.f_lineno)
            frame = _frames.get(key)
            if frame is None:
                frame = _frames[key] = Frame(names[0], f.f_lineno, names[1])
            return frame
        f = f.f_back
    return Frame("<unknown>", 0, "<unknown>")


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
    ``(name, tensor)`` iterable its pairs. ``on_step(capture, shadow, error)``
    is called after every replay with ``error`` the max abs difference between the
    replay's output and the shadow's. ``shadow=False`` records captures only.
    """

    def __init__(
        self,
        roots: dict[str, Any] | None = None,
        on_step: Callable[[Stream, Stream, float], None] | None = None,
        shadow: bool = True,
    ):
        self.roots = roots or {}
        self._mode = _OpMode(self)
        self._mode_on = False
        self.on_step = on_step
        self.shadow_enabled = shadow
        self.captures: dict[int, Stream] = {}
        self.stream: Stream | None = None
        self.step = 0
        self.replays = 0
        self._segment: Segment | None = None
        self._cow: dict[StorageId, tuple[Any, Any]] | None = None
        self._shadow: Stream | None = None
        self._shadow_out: list[torch.Tensor] = []
        self._scope_stack: list[str] = []
        self._module_names: dict[int, str] = {}
        self._hooks: list[Any] = []
        self._static_names: dict[StorageId, tuple[str, ...]] = {}
        self._static_alive: list[Any] = []

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> "Tracer":
        self._index_roots()
        self._hooks = [
            module_hooks.register_module_forward_pre_hook(self._pre_hook),
            module_hooks.register_module_forward_hook(self._post_hook),
        ]
        rt.add_observer(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode_off()  # a capture that raised left it on
        self.stream = None
        rt.remove_observer(self)
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _index_roots(self) -> None:
        names: dict[StorageId, list[str]] = {}

        def add(name: str, t: torch.Tensor) -> None:
            st = t.untyped_storage()
            self._static_alive.append(st)
            names.setdefault(st._cdata, []).append(name)

        for root_name, root in self.roots.items():
            for name, t in _named_tensors(root_name, root):
                add(name, t)
            if isinstance(root, torch.nn.Module):
                for name, m in root.named_modules():
                    self._module_names[id(m)] = name
        self._static_names = {sid: tuple(v) for sid, v in names.items()}

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
        if stream is None or func is _DETACH:
            # detach is a no-op alias for replay purposes, and stacked dispatch modes add
            # it to factory ops at capture only: recording it would fake a divergence.
            return func(*args, **kwargs)
        info = _schema(func)
        if self._cow is not None and info.writes:
            self._copy_before_write(info, args, kwargs, stream)
        out = func(*args, **kwargs)
        if self._cow is not None and self._segment is not None and self._segment.kind is rt.SegmentKind.EAGER:
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
        stream.ops.append(
            OpRecord(index, info.name, seg.index if seg is not None else 0, scope, _frame(),
                     tuple(scalars), tuple(inputs), tuple(outputs))
        )

    # ------------------------------------------------------------ stream setup
    def _context(self) -> ContextSummary:
        if not has_forward_context():
            return ContextSummary(False, 0, "NONE")
        ctx = get_forward_context()
        md = ctx.attn_metadata
        return ContextSummary(isinstance(md, dict), len(md) if isinstance(md, dict) else 0, str(ctx.cudagraph_runtime_mode))

    def _new_stream(self, kind: StreamKind, graph: rt.BreakableGraph) -> Stream:
        s = Stream(kind, graph.id, graph.label,
                   str(graph.runtime_mode), self.step, self._context(), copy_break_outputs=graph.copy_break_outputs)
        self._name_context(s)
        return s

    def _name_context(self, stream: Stream) -> None:
        stream.static_names = self._static_names
        names: dict[StorageId, list[str]] = {}
        if has_forward_context():
            md = get_forward_context().attn_metadata
            if isinstance(md, dict):
                for key, value in md.items():
                    for name, t in _named_tensors(f"attn_metadata[{key!r}]", value, sep=""):
                        st = t.untyped_storage()
                        stream._alive.append(st)
                        names.setdefault(st._cdata, []).append(name)
        stream.names = {sid: tuple(v) for sid, v in names.items()}

    def _open_segment(self, stream: Stream, index: int, kind: rt.SegmentKind, name: str | None) -> Segment:
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
        leaves, _ = tree_flatten((call.args, call.kwargs))
        for i, v in enumerate(leaves):
            path = f"arg{i}"
            if isinstance(v, torch.Tensor):
                out.append(BreakArg(path, self._use(stream, v, path, False), None))
            elif isinstance(v, (int, float, bool, str, type(None), torch.dtype, torch.device)):
                out.append(BreakArg(path, None, scalar_repr(v)))
        return tuple(out)

    # ----------------------------------------------------------- observer API
    def on_graph_begin(self, graph: rt.BreakableGraph, phase: rt.Phase) -> None:
        if phase is rt.Phase.CAPTURE:
            self.stream = self._new_stream(StreamKind.CAPTURE, graph)
            self._mode_on_()

    def on_graph_end(self, graph: rt.BreakableGraph, phase: rt.Phase, output: Any) -> None:
        if phase is rt.Phase.CAPTURE and self.stream is not None:
            self.stream.output_storages = tuple(t.untyped_storage()._cdata for t in rt.flatten_tensors(output))
            self.captures[graph.id] = self.stream
            self.stream = None
            self._mode_off()
        elif phase is rt.Phase.REPLAY and self._shadow is not None:
            # The replay itself is not traced: captured segments re-issue what the capture
            # recorded, and eager segments re-run the code the shadow just ran.
            shadow, self._shadow = self._shadow, None
            error = _max_abs_diff(list(rt.flatten_tensors(output)), self._shadow_out)
            self._shadow_out = []
            self.replays += 1
            if self.on_step is not None:
                self.on_step(self.captures[graph.id], shadow, error)
            shadow.release()

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
            if call.depth == 0 and stream.runtime_mode == str(CUDAGraphMode.PIECEWISE):
                self._close_segment(stream)
                seg = self._open_segment(stream, len(stream.segments), rt.SegmentKind.EAGER, call.name)
                seg.break_args = self._break_args(stream, call)
                seg.break_frame = Frame(*rt.user_frame(3))
        elif not call.inline and self._segment is not None:
            self._segment.break_args = self._break_args(stream, call)
            self._segment.break_frame = Frame(*rt.user_frame(4))

    def on_break_exit(self, call: rt.BreakCall, result: Any) -> None:
        stream = self.stream
        if stream is None:
            return
        returned = frozenset(t.untyped_storage()._cdata for t in rt.flatten_tensors(result))
        if stream.kind is StreamKind.SHADOW:
            if call.depth == 0 and stream.runtime_mode == str(CUDAGraphMode.PIECEWISE):
                if self._segment is not None:
                    self._segment.returned = returned
                self._close_segment(stream)
                self._open_segment(stream, len(stream.segments), rt.SegmentKind.CAPTURED, None)
        elif not call.inline and self._segment is not None:
            self._segment.returned = returned

    def before_replay(self, graph: rt.BreakableGraph, shadow: Callable[[], Any]) -> None:
        if not self.shadow_enabled or graph.id not in self.captures:
            return
        self.step += 1
        stream = self._new_stream(StreamKind.SHADOW, graph)
        self.stream, self._cow = stream, {}
        self._open_segment(stream, 0, rt.SegmentKind.CAPTURED, None)
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
        self._shadow_out = [t.detach().clone() for t in rt.flatten_tensors(out)]
        stream.output_storages = tuple(t.untyped_storage()._cdata for t in rt.flatten_tensors(out))
        self._shadow = stream


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


def _named_tensors(prefix: str, obj: Any, depth: int = 0, sep: str = ".") -> Iterator[tuple[str, torch.Tensor]]:
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
            yield from _named_tensors(f"{prefix}[{k!r}]", v, depth + 1, sep=".")
        return
    if isinstance(obj, (list, tuple)):
        if obj and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in obj):
            for n, t in obj:
                yield from _named_tensors(n, t, depth + 1)
            return
        for i, v in enumerate(obj):
            yield from _named_tensors(f"{prefix}[{i}]", v, depth + 1)
        return
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _named_tensors(f"{prefix}.{f.name}", getattr(obj, f.name), depth + 1)
        return
    attrs = getattr(obj, "__dict__", None)
    if attrs:
        for k, v in attrs.items():
            if not k.startswith("__"):
                yield from _named_tensors(f"{prefix}.{k}", v, depth + 1)
