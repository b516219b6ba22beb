"""The capture record: what the tracer saw, in the one form every checker module reads.

The tracer (``capturelint.tracer``) writes these records; the analyzer, the rules, the
region graph (``capturelint.graph``) and the region maps read them. Nothing here
imports torch: records hold storage identities, shapes, dtype names and frames, never
tensors, so that they can be read, built in tests and compared without an engine.

**Streams.** A ``Stream`` is the ops of one run of the forward that the tracer
recorded, in dispatch order, cut into ``Segment``\\ s. There are two kinds
(``StreamKind``):

- ``CAPTURE``: the ops of a capture, each tagged with its segment (captured, or the
  eager break it ran in);
- ``SHADOW``: an eager execution of a replay step (same inputs, same forward context),
  segmented the way the capture was: in a PIECEWISE graph each outermost would-be break
  opens an eager segment; in a FULL graph nothing does. Ops inside a shadow's eager
  segments re-run live on replay and are exempt from R1-R4, so only the storages they
  allocate are kept, not op records.

The replay itself is not recorded: its captured segments re-issue what the capture
recorded, and its eager segments re-run the code the shadow ran.

**Storage identity.** A tensor's location is its storage (``StorageId``, the identity
of the storage object, kept alive by the stream that saw it so that it is never reused)
plus its view geometry (``TensorUse``). A storage is *in-step* when an op of the stream
allocated it, *external* otherwise (parameters, runner buffers, caches, metadata); its
``Origin`` says which.

**Frames.** Source locations are ``runtime.protocol.Frame``\\ s: the innermost engine
or model line of an op or a break call, and in capture streams the engine stack up to
the captured callable.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from capturelint.lists import and_more, shown
from capturelint.runtime.protocol import BreakOutputs, Frame, SegmentKind

if TYPE_CHECKING:
    import torch

StorageId = int
"""The identity of a storage object (``untyped_storage()._cdata``), valid while the
stream that saw it holds the storage."""

OpIndex = int
"""The position of an op in its stream (``Stream.ops``)."""

SegmentIndex = int
"""The position of a segment in its stream (``Stream.segments``)."""


class StreamKind(enum.Enum):
    """Which run of the forward a stream records: a capture, or the shadow of a replay
    step (see the module docstring)."""

    CAPTURE = "capture"
    SHADOW = "shadow"

    def __str__(self) -> str:
        return self.value


class TensorUse(NamedTuple):
    """One tensor argument or output of an op: where it lives and how it is viewed.

    ``arg`` is the schema argument's name (``self``, ``out``; ``tensors[1]`` for an
    element of a list argument; ``out0``, ``out1`` for returns), or a break argument's
    path. ``storage`` is the storage it views; ``shape``, ``stride`` and ``offset`` (in
    elements) its view, ``dtype`` the dtype's name (``float32``). ``write`` is true for
    outputs and for arguments the op writes (per the op schema).

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
        """What two uses of a storage must agree on to read the same elements."""
        return (self.shape, self.stride, self.offset, self.dtype)

    def describe_geometry(self) -> str:
        return f"{self.dtype}{list(self.shape)} stride {list(self.stride)} offset {self.offset}"


class OpRecord(NamedTuple):
    """One dispatcher call.

    ``index`` is its position in the stream; ``op`` the overload (``aten.mul.Tensor``);
    ``segment`` the index of the segment it ran in; ``scope`` the qualified name of the
    innermost module running (``layers.3.attn``; the segment's scope outside modules);
    ``frame`` the innermost engine or model line that called it. ``scalars`` are the
    non-tensor arguments as ``(name, value)`` (lists as tuples; ``scalar_repr`` prints a
    value for messages); ``inputs`` the tensor arguments and ``outputs`` the tensor
    returns, as ``TensorUse``\\ s. ``stack`` (capture streams only) is every engine frame
    from ``frame`` outwards, innermost first, up to the captured callable."""

    index: OpIndex
    op: str
    segment: SegmentIndex
    scope: str
    frame: Frame
    scalars: tuple[tuple[str, Any], ...]
    inputs: tuple[TensorUse, ...]
    outputs: tuple[TensorUse, ...]
    stack: tuple[Frame, ...] = ()

    @property
    def key(self) -> tuple[str, str]:
        """What R1 compares: the op and the module it ran in."""
        return (self.op, self.scope)


@dataclasses.dataclass(frozen=True)
class BreakArg:
    """An argument handed to an eager break, by ``path`` (``metadata.slot_mapping``,
    ``args[1]``): a tensor use, or (``tensor`` None) a scalar's ``scalar_repr``."""

    path: str
    tensor: TensorUse | None
    scalar: str | None


@dataclasses.dataclass
class Segment:
    """A run of consecutive ops of a stream: ``CAPTURED`` (recorded, replayed verbatim)
    or ``EAGER`` (an eager break, re-run in Python on every replay).

    ``index`` is its position in the stream and ``name`` the break's qualified name for
    eager segments (None for captured ones). ``scope`` is the module scope it began in.
    Its ops are ``Stream.ops[first_op:end_op]``. For an eager segment, ``break_args``
    are the break's arguments, ``break_frame`` the line that called it,
    ``break_stack`` (capture streams) the engine frames that called it, and
    ``returned`` the storages of the tensors it returned."""

    index: SegmentIndex
    kind: SegmentKind
    name: str | None
    scope: str
    first_op: OpIndex
    end_op: OpIndex = -1
    break_args: tuple[BreakArg, ...] = ()
    break_frame: Frame | None = None
    break_stack: tuple[Frame, ...] = ()
    returned: frozenset[StorageId] = frozenset()

    @property
    def label(self) -> str:
        return f"#{self.index} {self.kind}" + (f" {self.name}" if self.name else "")


class Origin(NamedTuple):
    """Where a storage came from in a stream: ``external`` (it existed before the
    stream began), or allocated by op ``producer`` of the stream. An in-step storage
    with no producer was allocated inside a shadow's eager break (``IN_BREAK``), whose
    ops are not recorded one by one."""

    external: bool
    producer: OpIndex | None


EXTERNAL = Origin(True, None)
IN_BREAK = Origin(False, None)


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
    """What a context probe returns: a summary and the context's tensors by name. The
    tracer turns the tensors into stream names; the snapshot itself is not kept."""

    summary: ContextSummary
    tensors: tuple[tuple[str, torch.Tensor], ...] = ()


class ReadKind(enum.Enum):
    """Why an eager read of a bare graph's memory (``GraphMemoryRead``) reads another
    value than the program means.

    ``UNREPLAYED``: nothing wrote the storage since the capture, which records kernels
    without running them: the read gets uninitialised memory (rule CL110).
    ``OVERWRITTEN``: the tensor read was taken (made as a view) after replay ``taken``
    and the graph has replayed since, rewriting it (rule CL109). ``REPEATED``: one list
    argument holds the graph's output tensor itself more than once, as a list that
    collected it after each replay does: every entry reads the latest replay (CL109).
    """

    UNREPLAYED = "unreplayed"
    OVERWRITTEN = "overwritten"
    REPEATED = "repeated"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class GraphMemoryRead:
    """An op outside every capture read memory a bare graph owns (its capture allocated
    it, every replay rewrites it) at a moment it does not hold the value the program
    means (``kind``). The tracer's watch between steps records it.

    ``op`` and ``frame`` are the reading op and its line; ``use`` the tensor argument
    read; ``graph_id`` the graph. ``replay`` is how many times the graph had replayed
    when the op ran, ``taken`` after which replay the tensor read was made, with
    ``taken_frame`` the line that made it (``OVERWRITTEN``), and ``replay_frame`` the
    line of the replay that overwrote it: the first after ``taken`` (``OVERWRITTEN``),
    the latest (``REPEATED``). ``count`` is how many arguments read it that way.
    ``provisional``: a breakable graph's capture output read before its first replay,
    which counts only where the run's result diverged from its eager twin by a
    non-finite error, the emulator's NaN poison (engines read a capture pass's discarded
    outputs knowingly: vLLM's dummy runs)."""

    kind: ReadKind
    graph_id: int
    op: str
    frame: Frame
    use: TensorUse
    replay: int
    taken: int | None = None
    taken_frame: Frame | None = None
    replay_frame: Frame | None = None
    count: int = 1
    provisional: bool = False


ContextProbe = Callable[[], ContextSnapshot]
"""An adapter's reader of the engine's forward context, called at capture and at each
shadowed step."""

ScopeGroup = Callable[[str], "str | None"]
"""Maps a module scope to the prefix that the names of tensors it owns carry (the
bundled adapter maps ``model.layers.3.attn`` to ``layers.3``), so that a tensor shared
by every layer is named after the layer that read it."""


@dataclasses.dataclass
class Stream:
    """The ops of one run of the forward, with their segments and storages.

    ``kind`` says which run (see ``StreamKind``). ``graph_id`` and ``graph`` identify the
    captured graph (``graph`` is its label, a batch descriptor such as ``decode/4``),
    ``runtime_mode`` the mode it was captured in. ``step`` counts the shadowed replay
    steps: a shadow's own number, or for a capture those before it. ``context`` is the
    forward context at the start.

    ``ops`` and ``segments`` are the records, in order. ``origins`` maps every storage
    the stream saw to its ``Origin``. ``names`` maps storages to the human names the
    tracer's roots and the forward context gave them at the stream's start (and, for
    captures, at its end); ``static_names`` (shared by every stream of a run) those the
    roots held when the tracer began, module parameters and buffers included. ``break_outputs`` and ``breaks_eager`` are
    the graph's break policies (``runtime.protocol.GraphInfo``). ``output_storages`` are
    the storages of the run's outputs. ``allocation_frames`` (shared by a run's streams)
    maps a storage to the line that allocated it between steps, a weak reference to
    it and the ordinal of the allocation (``allocated_at``, ``allocated_after``); a capture's
    ``allocation_mark`` is the ordinal of the last allocation noted before it began. ``names_now`` maps root paths to the storages they held at a
    replay that found a stale input. ``scope_group`` picks among a storage's names.

    A stream holds every storage it saw (``_alive``) so that no storage identity is
    reused while it lives; ``release`` lets go of them.
    """

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
    break_outputs: BreakOutputs = BreakOutputs.COPY
    breaks_eager: bool = True
    output_storages: tuple[StorageId, ...] = ()
    allocation_frames: dict[StorageId, tuple[Frame, Any, int]] = dataclasses.field(default_factory=dict, repr=False)
    allocation_mark: int = 0  # a capture's: the allocations noted before it began
    names_now: dict[str, StorageId] = dataclasses.field(default_factory=dict, repr=False)
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

    def allocated_after(self, storage: StorageId, mark: int) -> bool:
        """Whether the tracer saw external storage ``storage`` allocated after ``mark``
        allocations (a capture's ``allocation_mark``): made after that capture began."""
        entry = self.allocation_frames.get(storage)
        return entry is not None and entry[1]() is not None and entry[2] > mark

    def release(self) -> None:
        self._alive.clear()

    # ------------------------------------------------------- printed form and lint

    def __str__(self) -> str:
        """The stream as ``torch.fx.Graph`` prints its IR: a header (kind, graph, mode,
        step, forward context), the external storages it read (``inputs``, with their
        names), then each segment and its ops, one per line, and the run's outputs::

            capture decode/4 (PIECEWISE), step 0, context: attn_metadata was None
              inputs: %s0 model.layers.0.attn.wq, %s1
              #0 captured in model.layers.0 (ops 0..1):
                %0 = aten.mm.default(self=%s1, mat2=%s0) -> %s2 float32[2, 4]  # model.layers.0.attn at engine.py:12
              #1 eager model.attn.kernel in model.layers.0 (ops 1..1): break(q=%s2, n=3) at engine.py:30
              outputs: %s2

        Storages are numbered ``%sN`` in the order the stream first uses them (their
        identities are addresses, which differ from run to run); ``%N`` is op ``N``."""
        number: dict[StorageId, str] = {}

        def s(sid: StorageId) -> str:
            return number.setdefault(sid, f"%s{len(number)}")

        def use(u: TensorUse) -> str:
            return f"{u.arg}={s(u.storage)}"

        body: list[str] = []
        ops_of = {seg.index: range(max(seg.first_op, 0), max(seg.end_op, seg.first_op, 0)) for seg in self.segments}
        for seg in self.segments:
            head = f"  {seg.label} in {seg.scope or '<top>'} (ops {seg.first_op}..{seg.end_op})"
            if seg.kind is SegmentKind.EAGER:
                args = ", ".join(f"{a.path}={s(a.tensor.storage) if a.tensor is not None else a.scalar}"
                                 for a in seg.break_args)
                head += f": break({args})" + (f" at {seg.break_frame.location}" if seg.break_frame else "")
                if seg.returned:
                    known = sorted(seg.returned, key=lambda r: (r not in number, number.get(r, ""), r))
                    head += " -> " + ", ".join(s(r) for r in known)
            body.append(head + ":" if ops_of[seg.index] else head)
            for i in ops_of[seg.index]:
                if 0 <= i < len(self.ops):
                    body.append("    " + self._op_line(self.ops[i], s, use))
        listed = {i for r in ops_of.values() for i in r}
        body += ["  (outside every segment) " + self._op_line(op, s, use) for op in self.ops if op.index not in listed]
        inputs = [sid for sid in number if self.origins.get(sid, EXTERNAL).external]
        for sid in self.origins:  # external storages no op used (read by the context, say)
            if self.origins[sid].external and sid not in number and sid in self.names:
                s(sid)
                inputs.append(sid)
        header = (f"{self.kind} {self.graph} ({self.runtime_mode}), step {self.step}, "
                  f"context: {self.context.describe()}")
        lines = [header]
        if inputs:
            lines.append("  inputs: " + ", ".join(s(sid) + (f" {self.name_of(sid)}" if self.name_of(sid) else "")
                                                 for sid in inputs))
        lines += body
        if self.output_storages:
            lines.append("  outputs: " + ", ".join(s(sid) for sid in self.output_storages))
        return "\n".join(lines)

    @staticmethod
    def _op_line(op: OpRecord, s: Callable[[StorageId], str], use: Callable[[TensorUse], str]) -> str:
        args = [use(u) for u in op.inputs] + [f"{name}={scalar_repr(v)}" for name, v in op.scalars]
        outs = ", ".join(f"{s(u.storage)} {u.dtype}{list(u.shape)}" for u in op.outputs)
        return (f"%{op.index} = {op.op}({', '.join(args)})" + (f" -> {outs}" if outs else "")
                + f"  # {op.scope or '<top>'} at {op.frame.location}")

    def problems(self) -> list[str]:
        """What breaks the stream's invariants (``lint``), one sentence each; empty when
        it is well formed:

        - the segments tile the ops: segment ``i`` has index ``i``, the first begins at
          op 0, each begins where the one before ended, the last ends at the last op,
          and each op's ``segment`` is the one it lies in (a stream without segments
          has no ops);
        - op ``i`` has index ``i``;
        - every tensor use has an origin, and an op's producer comes no later than the
          op (before it for an input);
        - break arguments are in range: only an eager segment has them, and a tensor
          argument has an origin made before the break began."""
        out: list[str] = []
        for i, op in enumerate(self.ops):
            if op.index != i:
                out.append(f"op {i} has index {op.index}")
        end = 0
        for i, seg in enumerate(self.segments):
            if seg.index != i:
                out.append(f"segment {i} has index {seg.index}")
            if seg.first_op != end:
                out.append(f"segment #{seg.index} begins at op {seg.first_op}, not at op {end} where the one "
                           "before it ended")
            if seg.end_op < seg.first_op:
                out.append(f"segment #{seg.index} ends at op {seg.end_op}, before it begins (op {seg.first_op}): "
                           "it was never closed")
            for op in self.ops[max(seg.first_op, 0):max(seg.end_op, 0)]:
                if op.segment != seg.index:
                    out.append(f"op {op.index} lies in segment #{seg.index} but names segment #{op.segment}")
            end = max(seg.end_op, seg.first_op)
        if end != len(self.ops):
            out.append(f"the segments end at op {end} but the stream has {len(self.ops)} ops")
        for op in self.ops:
            for u in op.inputs + op.outputs:
                origin = self.origins.get(u.storage)
                if origin is None:
                    out.append(f"op {op.index} ({op.op}) {u.arg} uses a storage with no origin")
                elif origin.producer is not None and not (
                        0 <= origin.producer < op.index or (u in op.outputs and origin.producer == op.index)):
                    out.append(f"op {op.index} ({op.op}) {u.arg} uses a storage made by op {origin.producer}, "
                               "which does not come before it")
        for seg in self.segments:
            if seg.break_args and seg.kind is not SegmentKind.EAGER:
                out.append(f"segment #{seg.index} is {seg.kind} but has break arguments")
            for a in seg.break_args:
                if (a.tensor is None) == (a.scalar is None):
                    out.append(f"break argument {a.path} of segment #{seg.index} is neither a tensor nor a scalar")
                if a.tensor is None:
                    continue
                origin = self.origins.get(a.tensor.storage)
                if origin is None:
                    out.append(f"break argument {a.path} of segment #{seg.index} has no origin")
                elif origin.producer is not None and not 0 <= origin.producer < seg.first_op:
                    out.append(f"break argument {a.path} of segment #{seg.index} was made by op {origin.producer}, "
                               f"not before the break began (op {seg.first_op})")
        return out

    def lint(self) -> None:
        """Check the stream's invariants (``problems``), as ``torch.fx.Graph.lint``
        checks a graph: a ``MalformedStream`` naming what is broken, else nothing. The
        tests run it on every stream recorded, and so does ``--debug``
        (``lint_recorded``)."""
        problems = self.problems()
        if problems:
            listed, more = shown(problems)
            raise MalformedStream(f"the {self.kind} stream of graph {self.graph} (step {self.step}) is malformed: "
                                  + "; ".join(listed) + (f" {and_more(more)}" if more else "") + "; print(stream) shows it")


class MalformedStream(Exception):
    """A recorded stream breaks an invariant of the capture record (``Stream.lint``): a
    bug of the tracer, never of the engine checked."""


_LINT = {"on": False}


def lint_recorded(on: bool = True) -> None:
    """Lint every stream when its run is recorded (``Stream.lint``; the harness asks
    ``linting``): on for the test suite and under ``--debug``."""
    _LINT["on"] = on


def linting() -> bool:
    return _LINT["on"]


def scalar_repr(value: Any) -> str:
    """A scalar argument as messages print it: floats rounded to 9 digits, lists
    bracketed, dtypes and devices as torch prints them (``torch.float32``, ``cpu``)."""
    if isinstance(value, float):
        return repr(round(value, 9))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(scalar_repr(v) for v in value) + "]"
    torch = sys.modules.get("torch")  # a dtype or a device exists only where torch is imported
    if torch is not None and isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    return repr(value)
