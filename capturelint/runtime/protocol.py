"""All that the checker may know of a capture runtime.

A capture runtime (capturelint's breakable runtime, vLLM's, a plain
``torch.cuda.CUDAGraph`` program under the emulated primitive) announces what it does
to **observers**; the tracer is one. This module is the vocabulary of those
announcements and nothing else: it imports only torch, and no checker module imports a
runtime, only this. It imports torch when a function needs it, not when it is imported,
so that reading rule docs and settings (``capturelint rules``) stays free of torch.

**Segments and phases.** A capture is a sequence of *segments*: ``CAPTURED`` segments
are recorded and replayed verbatim; ``EAGER`` segments (eager breaks) re-run their
Python on every replay. Code runs in one of three ``Phase``\\ s: recording a graph
(``CAPTURE``), replaying one (``REPLAY``), or plainly (``EAGER``, which includes the
checker's *shadow* of a replay step).

**Announcements**, in the order an observer hears them::

    on_graph_begin(graph, CAPTURE)
      on_segment_begin(#0 captured) ... on_segment_end(#0 captured)
      on_segment_begin(#1 eager)  on_break_enter(call) ... on_break_exit(call, result)  on_segment_end(#1 eager)
      ...
    on_graph_end(graph, CAPTURE, output)
    before_replay(graph, shadow)           # shadow() runs the step eagerly, once
    on_graph_begin(graph, REPLAY) ... on_graph_end(graph, REPLAY, output)

A break that runs as plain Python (outside a capture, in a graph whose breaks are not
eager, nested in another break, or in the shadow) is announced with
``on_break_enter``/``on_break_exit`` and ``BreakCall.inline`` set.

The emulated primitive also announces what it sees happen to memory and streams: a
replay that overwrote a live tensor of another graph sharing its pool
(``on_pool_overwrite``, a ``PoolOverwriteEvent``) and a side stream's tensor whose memory
was reused without ``record_stream`` (``on_stream_hazard``). What CUDA refuses at
capture (a wait on an event across a capture boundary, a forked stream not joined
back) it raises, as ``StreamCaptureError`` with a ``StreamCaptureEvent``.

**Host synchronisation.** ``HOST_SYNC_OPS`` and ``host_sync_reason`` are the one table
of ops that need a value on the host; the emulated primitive refuses them at capture
(raising ``HostSyncInCaptureError`` with a ``HostSyncEvent``) and rule CL106 reports
them from traces.

**Policies.** ``CUDAGraphMode`` (the configured capture policy) and ``BreakOutputs``
(what replay does with a break's return values) are the runtime's own values;
``capturelint.options`` re-exports them beside the checker's other option values.

**Frames.** ``Frame`` is a source location in engine or model code; the one frame
walker (``runtime.frames``) finds them, skipping runtime machinery.
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable

if TYPE_CHECKING:
    import torch


class SegmentKind(enum.Enum):
    CAPTURED = "captured"
    EAGER = "eager"

    def __str__(self) -> str:
        return self.value


class Phase(enum.Enum):
    """When code runs: recording a graph, replaying one, or plainly (shadow included)."""

    CAPTURE = "capture"
    REPLAY = "replay"
    EAGER = "eager"

    def __str__(self) -> str:
        return self.value


class CUDAGraphMode(enum.Enum):
    """Configured capture policy; ``runtime`` modes are NONE, PIECEWISE and FULL."""

    NONE = "NONE"
    PIECEWISE = "PIECEWISE"
    FULL = "FULL"
    FULL_DECODE_ONLY = "FULL_DECODE_ONLY"
    FULL_AND_PIECEWISE = "FULL_AND_PIECEWISE"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, text: str) -> "CUDAGraphMode":
        try:
            return cls(text.upper())
        except ValueError:
            names = ", ".join(m.value for m in cls)
            raise ValueError(f"unknown CUDA-graph mode {text!r}; use one of {names}") from None


class BreakOutputs(enum.Enum):
    """What a runtime does with an eager break's return values on replay.

    ``COPY``: copies them into the tensors the break returned at capture (static
    buffers), so downstream captured ops read fresh values (vLLM's newer design).
    ``DISCARD``: drops them; downstream captured ops read the capture-time tensors
    (vLLM 0.33.0's ``add_eager``). Breaks must then write results in place.
    """

    COPY = "copy"
    DISCARD = "discard"

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, text: str) -> "BreakOutputs":
        try:
            return cls(text.lower())
        except ValueError:
            raise ValueError(f"unknown break-outputs policy {text!r}; use copy or discard") from None


@dataclasses.dataclass(frozen=True, order=True)
class Frame:
    """A source location in engine or model code.

    ``file`` is the path shown in findings, ``line`` the line running, ``function`` the
    code object's name. Frames the tracer records also carry where their function is
    defined (``qualname``, ``source``: the absolute file name, ``first_line``: the
    code object's first line), so that ``capturelint suggest`` can find the function
    and make it an eager break; these take no part in comparing frames or in JSON.
    """

    file: str
    line: int
    function: str
    qualname: str = dataclasses.field(default="", compare=False)
    source: str = dataclasses.field(default="", compare=False, repr=False)
    first_line: int = dataclasses.field(default=0, compare=False, repr=False)

    @property
    def location(self) -> str:
        """``file:line``, as findings, editors and ``grep`` spell a place in the source."""
        return f"{self.file}:{self.line}"

    def __str__(self) -> str:
        return f"{self.location} in {self.function}"

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function}


UNKNOWN_FRAME = Frame("<unknown>", 0, "<unknown>")


@dataclasses.dataclass(frozen=True)
class GraphInfo:
    """A captured graph as the checker sees it.

    ``label`` names it in messages (a batch descriptor such as ``decode/4``);
    ``mode`` is the runtime mode it was captured in (``PIECEWISE``, ``FULL``, or a
    runtime's own word); ``breaks_eager`` says whether eager breaks become eager
    segments in it (true for piecewise graphs, false where breaks run inline and are
    captured, as in FULL graphs); ``break_outputs`` is the runtime's policy for break
    return values; ``segmented`` is false for a bare CUDA-graph primitive, which
    announces no segments and gets no shadow (its whole capture is one captured
    segment).
    """

    id: int
    label: str
    mode: str
    breaks_eager: bool
    break_outputs: BreakOutputs = BreakOutputs.COPY
    segmented: bool = True


@dataclasses.dataclass(frozen=True)
class SegmentInfo:
    """A segment as announced. ``name`` is the break's qualified name for eager
    segments and ``None`` for captured ones."""

    graph_id: int
    index: int
    kind: SegmentKind
    name: str | None
    phase: Phase


@dataclasses.dataclass(frozen=True)
class BreakCall:
    """A call of an eager-break function.

    ``params`` names the positional arguments (from the function's signature; ``argN``
    where it has none). ``inline`` is true when it ran as plain Python (outside a
    capture, in a graph whose breaks are not eager, or nested inside another break);
    then ``depth`` counts the enclosing inline breaks. ``frame`` is the caller's line.
    """

    name: str
    args: tuple
    kwargs: dict
    phase: Phase
    inline: bool
    depth: int
    params: tuple[str, ...] = ()
    frame: Frame = UNKNOWN_FRAME

    def named_arguments(self) -> list[tuple[str, Any]]:
        named = [(self.params[i] if i < len(self.params) else f"arg{i}", v) for i, v in enumerate(self.args)]
        named.extend(self.kwargs.items())
        return named


@dataclasses.dataclass(frozen=True)
class HostSyncEvent:
    """A captured segment asked for a value on the host. ``graph`` and ``segment`` are
    filled in by a breakable runtime; a bare primitive knows neither."""

    op: str
    frame: Frame
    graph: GraphInfo | None = None
    segment: int = 0
    stack: tuple[Frame, ...] = ()  # engine frames, innermost first (``frames.user_stack``)


@dataclasses.dataclass(frozen=True)
class StaleInputEvent:
    """At a replay, a graph found that nothing outside the graphs holds a storage it
    reads: the engine dropped it (re-allocated the tensor), so on a GPU the graph reads
    memory the allocator has handed to someone else. ``storage`` is the storage's
    identity (``untyped_storage()._cdata``); ``dtype`` how the graph reads it.

    For a bare graph whose holders the capture found (``runtime.holders``): ``holder``
    is the name that held the storage at capture and holds another tensor now
    (``replacement``, a storage identity), ``rebound_at`` the assignment that most
    likely re-bound it (``None`` where none was found)."""

    graph: GraphInfo
    segment: int
    storage: int
    dtype: str
    holder: str | None = None
    replacement: int | None = None
    rebound_at: Frame | None = None


@dataclasses.dataclass(frozen=True)
class HeldInputEvent:
    """At a replay of a bare graph, a name the program held a graph input by at capture
    (``holder``: ``runner.static_x``, ``global x of module prog``) holds another tensor
    of the same shape and dtype (``replacement``, a storage identity), while the
    captured tensor (``storage``) is still alive and was not written since the last
    replay: the program feeds the new tensor, the graph reads the old one.

    ``held_by`` are the other holders that still hold the captured tensor (those the
    capture found), ``rebound_at`` the assignment that most likely re-bound the holder
    (``None`` where none was found), ``replay`` which replay of the graph found it (1:
    the first) and ``replay_frame`` the line that called it."""

    graph: GraphInfo
    segment: int
    storage: int
    dtype: str
    shape: tuple[int, ...]
    holder: str
    replacement: int
    held_by: tuple[str, ...]
    rebound_at: Frame | None
    replay: int
    replay_frame: Frame


class HostSyncInCaptureError(RuntimeError):
    """A host synchronisation inside a capture: a GPU capture fails here, and so does
    the emulated one. ``event`` says which op, where."""

    def __init__(self, event: HostSyncEvent):
        self.event = event
        where = f"captured segment {event.segment}" + (f" of graph {event.graph.label}" if event.graph else "")
        super().__init__(
            f"host synchronisation {event.op} inside {where} at {event.frame}: a CUDA-graph capture fails "
            "here. Move the code into an eager break or out of the captured region."
        )


@dataclasses.dataclass(frozen=True)
class PoolOverwriteEvent:
    """A replay of graph ``writer`` rewrote memory that a live tensor of graph ``graph``
    lives in (``storage``): both were captured into one private memory pool, and the
    caching allocator handed ``graph``'s capture a block that ``writer``'s capture had
    freed (``writer_storage``, which ``writer``'s replays still write).
    ``replay_frame`` is the line that replayed ``writer``; ``nbytes`` how many bytes of
    ``storage`` it overwrote. The emulated primitive announces one per replay and
    overwritten storage (``runtime.emulated``'s pool model)."""

    graph: GraphInfo
    storage: int
    writer: GraphInfo
    writer_storage: int
    replay_frame: Frame
    nbytes: int


@dataclasses.dataclass(frozen=True)
class OverwrittenRead:
    """A read of memory that a ``PoolOverwriteEvent`` overwrote, before its own graph
    rewrote it: ``op`` at ``frame``, in eager code or (``reader``) in a graph's replay."""

    overwrite: PoolOverwriteEvent
    op: str
    frame: Frame
    reader: GraphInfo | None = None


class StreamHazard(enum.Enum):
    """What crossed a capture boundary; the value is the wording of messages."""

    WAIT_OUTSIDE = "an event recorded inside a capture is waited on outside that capture"
    WAIT_INTO = "a capturing stream waits on an event recorded outside the capture"
    HOST_WAIT = "the host synchronizes with (or queries) an event recorded inside a capture"
    UNJOINED = "a stream forked into the capture is not joined back before the capture ends"
    FREED_IN_USE = "a tensor a side stream reads is freed, and its memory reused, without record_stream"
    UNCAPTURED = "work is issued during a capture on a stream that takes no part in it"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class StreamCaptureEvent:
    """A stream or an event crossed a capture boundary (``kind``). ``first`` is where
    it began (the event's record, the stream's fork, the side stream's read) and
    ``second`` where it broke (the wait, the capture's end, the allocation that reused
    the memory). ``graph``/``segment``: the capture that recorded the event, was forked
    or read the tensor; ``other``/``other_segment``: the capture the waiting stream was
    in (None: outside any capture). ``op`` is the call or op concerned, ``stream`` the
    stream in words, ``storage`` the tensor's storage (``FREED_IN_USE``)."""

    kind: StreamHazard
    first: Frame
    second: Frame
    graph: GraphInfo | None
    segment: int = 0
    other: GraphInfo | None = None
    other_segment: int = 0
    op: str = ""
    stream: str = ""
    storage: int | None = None


class TrainingHazard(enum.Enum):
    """What ``TrainingHazardEvent`` reports (``runtime.training``; ``HOST_STATE``:
    ``runtime.lifetimes.announce_host_state``, for any bare graph)."""

    BAKED_LR = "baked-lr"  # a Python-float learning rate changed after its step was captured
    GRAD_REBOUND = "grad-rebound"  # a parameter's .grad no longer the tensor the capture's backward writes
    AUTOCAST_CACHE = "autocast-cache"  # autocast with its weight cache on around or inside a capture
    HOST_STATE = "host-state"  # a tensor the captured code stored on a Python object, re-bound or removed since


@dataclasses.dataclass(frozen=True)
class TrainingHazardEvent:
    """A hazard of a captured training step the emulated runtime saw (``kind``):
    ``first`` is where the captured thing was made (the captured ``optimizer.step()``, the
    capture, the ``autocast`` entered), ``second`` where it went wrong (the line that
    changed or re-bound it, else the replay; the capture for an autocast cache).
    ``subject`` names what (``SGD.param_groups[0]['lr']``, ``model.0.weight.grad``),
    ``captured`` and ``now`` its value at capture and at the replay, ``count`` how many
    of its kind the same graph has (parameters whose ``.grad`` was re-bound),
    ``changed_by`` what changed it (a scheduler), ``storage`` the tensor concerned."""

    kind: TrainingHazard
    first: Frame
    second: Frame
    graph: GraphInfo
    subject: str
    captured: str = ""
    now: str = ""
    count: int = 1
    changed_by: str = ""
    storage: int | None = None


class StreamCaptureError(RuntimeError):
    """What CUDA refuses at capture, as the emulated primitive refuses it: waiting on an
    event across a capture boundary, or ending a capture with a forked stream not
    joined back (``cudaErrorStreamCaptureIsolation``/``cudaErrorInvalidValue``,
    ``cudaErrorStreamCaptureUnjoined``). ``event`` says what, where."""

    def __init__(self, event: StreamCaptureEvent):
        self.event = event
        super().__init__(
            f"{event.kind} ({event.op} at {event.second}; {_begun(event)} at {event.first}): CUDA refuses this "
            "during stream capture. Record and wait on the event inside one captured segment (or both outside), "
            "and join every forked stream back to the capture stream before the capture ends."
        )


def _begun(event: StreamCaptureEvent) -> str:
    return "forked" if event.kind is StreamHazard.UNJOINED else "recorded"


class CaptureObserver:
    """Receives a runtime's announcements. Subclass and override what you need."""

    def on_graph_begin(self, graph: GraphInfo, phase: Phase) -> None: ...

    def on_graph_end(self, graph: GraphInfo, phase: Phase, output: Any) -> None: ...

    def on_segment_begin(self, segment: SegmentInfo) -> None: ...

    def on_segment_end(self, segment: SegmentInfo) -> None: ...

    def on_break_enter(self, call: BreakCall) -> None: ...

    def on_break_exit(self, call: BreakCall, result: Any) -> None: ...

    def on_stale_input(self, event: StaleInputEvent) -> None: ...

    def on_held_input(self, event: HeldInputEvent) -> None: ...

    def on_graph_names(self, graph: GraphInfo, names: dict[int, tuple[str, ...]]) -> None:
        """A bare graph's capture ended: the names the program holds its inputs and
        outputs by (``runner.static_x``), by storage identity, found without roots."""

    def on_pool_overwrite(self, event: PoolOverwriteEvent) -> None: ...

    def on_stream_hazard(self, event: StreamCaptureEvent) -> None:
        """A hazard across a capture boundary that CUDA does not refuse (a race)."""

    def on_training_hazard(self, event: TrainingHazardEvent) -> None:
        """A hazard of a captured training step (``runtime.training``)."""

    def on_unchecked_graphs(self, what: str, frame: Frame) -> None:
        """The program used a runtime that captures CUDA graphs on its own at ``frame``
        (``runtime.unchecked``): those graphs are not checked."""

    def before_replay(self, graph: GraphInfo, shadow: Callable[[], Any]) -> None:
        """Called before each replay of a segmented graph. ``shadow()`` runs the same
        step eagerly (breaks inline and announced) and returns its output; an observer may call it once."""

    def replayed_break(self, call: BreakCall) -> "RecordedBreak | None":
        """The replay is about to call eager break ``call``: an observer whose shadow
        already ran this step's call of it returns that call's record, which the
        replay uses instead of running the break's Python a second time."""
        return None


class RecordedBreak:
    """One eager break call made by a shadow step, used by the replay of that step:
    ``result`` is what the call returned (the replay copies it into the break's static
    outputs), ``apply()`` re-applies the tensor writes the call made (the shadow's
    writes are undone when the shadow ends)."""

    def __init__(self, result: Any, apply: Callable[[], None]):
        self.result = result
        self.apply = apply


_observers: list[CaptureObserver] = []


def add_observer(observer: CaptureObserver) -> None:
    _observers.append(observer)


def remove_observer(observer: CaptureObserver) -> None:
    _observers.remove(observer)


def has_observers() -> bool:
    return bool(_observers)


class observing:
    """``with observing(obs): ...`` registers an observer for the block."""

    def __init__(self, observer: CaptureObserver):
        self.observer = observer

    def __enter__(self) -> CaptureObserver:
        add_observer(self.observer)
        return self.observer

    def __exit__(self, *exc: object) -> None:
        remove_observer(self.observer)


def announce(method: str, *args: Any) -> None:
    """Runtimes call this; observers hear it in registration order."""
    for obs in tuple(_observers):
        getattr(obs, method)(*args)


def replayed_break(call: BreakCall) -> RecordedBreak | None:
    """The shadow's record of the eager break call the replay is about to make, if an
    observer has one (``CaptureObserver.replayed_break``)."""
    for obs in tuple(_observers):
        record = obs.replayed_break(call)
        if record is not None:
            return record
    return None


def run_or_reuse(call: BreakCall, fn: Callable, args: tuple, kwargs: dict) -> Any:
    """Run a replayed eager break, or reuse the call the shadow of this step made.

    A shadowed step runs each break's Python in the shadow; calling it again on replay
    would advance any host state it keeps (a per-call counter, a scheduling object
    planned per step) twice per step, where an untraced run advances it once. So the
    replay takes the shadow's call: its writes re-applied, its result returned. An
    observer offers the record only when the replay feeds the break what the shadow fed
    it; a replay that feeds it other values runs it, and diverges as it would untraced."""
    record = replayed_break(call)
    if record is None:
        return fn(*args, **kwargs)
    record.apply()
    return record.result


# --------------------------------------------------------------- capture state
#
# Whether code is "inside a capture" as a GPU would see it. A primitive sets it while
# it records; the shadow of a replayed step sets it while it runs code the replay
# would run from a captured segment, so that code branching on
# ``torch.cuda.is_current_stream_capturing()`` takes the path the replay took.

_state = threading.local()


def stream_capturing() -> bool:
    """What ``torch.cuda.is_current_stream_capturing()`` answers under emulation."""
    return getattr(_state, "capturing", 0) > 0 and not getattr(_state, "suspended", 0)


class capturing_as_on_gpu:
    """Marks the block as inside a stream capture (``on=True``) or outside one."""

    def __init__(self, on: bool = True):
        self.on = on

    def __enter__(self) -> None:
        if self.on:
            _state.capturing = getattr(_state, "capturing", 0) + 1
        else:
            _state.suspended = getattr(_state, "suspended", 0) + 1

    def __exit__(self, *exc: object) -> None:
        if self.on:
            _state.capturing -= 1
        else:
            _state.suspended -= 1


def suspended_capture() -> "capturing_as_on_gpu":
    """The block runs outside the capture (an eager segment): not capturing."""
    return capturing_as_on_gpu(False)


# ------------------------------------------------------------ transparent ops

_transparent_ops: set[str] = {"aten::detach"}


def register_transparent_op(name: str) -> None:
    """Treat op ``name`` (``namespace::op``) as a host-side alias with no kernel, as
    ``aten::detach`` is: tracers do not record it (vLLM's ``_C::weak_ref_tensor``,
    which its runtime calls on break arguments and outputs while a segment captures)."""
    _transparent_ops.add(name)


def is_transparent_op(name: str) -> bool:
    return name in _transparent_ops


_wrapper_ops: dict[str, bool] = {}


def register_wrapper_op(name: str, holds_break: bool = False) -> None:
    """Treat op ``name`` (``namespace::op``) as Python around other ops (vLLM's
    ``torch.ops.vllm.unified_kv_cache_update``): a capture records the ops its
    implementation runs, as a GPU's capture records the kernels it launches, not the op,
    whose replay would run its Python again (reading the forward context of the step,
    where a GPU graph replays what the capture launched). ``holds_break``: its
    implementation is an eager break (``unified_attention_with_output``); in a graph
    whose breaks are eager the break ends the captured segment inside the op, which is
    then in no graph (``runtime.cudagraph``), so only graphs whose breaks are captured
    (FULL) record through it. Registered at import, before any op runs."""
    _wrapper_ops[name] = holds_break


def wrapper_op(name: str) -> bool | None:
    """None for an op not registered with ``register_wrapper_op``, else whether it holds a break."""
    return _wrapper_ops.get(name)


# --------------------------------------------------------------- host sync table

HOST_SYNC_OPS = frozenset({
    "aten::_local_scalar_dense",
    "aten::nonzero",
    "aten::nonzero_static",
    "aten::masked_select",
    "aten::unique",
    "aten::_unique",
    "aten::_unique2",
    "aten::unique_consecutive",
    "aten::unique_dim",
    "aten::bincount",
    "aten::equal",
    "aten::is_nonzero",
    "aten::allclose",
})
"""Ops that need a tensor's value on the host (or a data-dependent output shape)."""

HOST_READ_METHODS = frozenset({"tolist", "numpy", "__array__"})
"""Tensor methods that read values on the host without reaching the dispatcher."""

_MASK_INDEX_OPS = frozenset({"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"})


def host_sync_reason(func: Any, args: tuple, kwargs: dict) -> str | None:
    """Why the dispatcher call ``func(*args, **kwargs)`` needs the host, or None."""
    name = func._schema.name
    if name in HOST_SYNC_OPS:
        return str(func)
    if name in _MASK_INDEX_OPS or name in ("aten::_to_copy", "aten::copy_"):
        import torch
    if name in _MASK_INDEX_OPS:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        for t in indices or ():
            if isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8):
                return f"{func} with a boolean mask"
    if name in ("aten::_to_copy", "aten::copy_"):
        src = args[0] if name == "aten::_to_copy" else args[1]
        dst_dev = kwargs.get("device") if name == "aten::_to_copy" else args[0].device
        if (
            isinstance(src, torch.Tensor)
            and src.device.type != "cpu"
            and dst_dev is not None
            and torch.device(dst_dev).type == "cpu"
        ):
            return f"{func} device-to-host copy"
    return None


def is_host_sync_op(op: str) -> bool:
    """Whether a recorded op name (``aten.nonzero.default``) is in the table."""
    packet = op.rsplit(".", 1)[0] if op.count(".") >= 2 else op
    return packet.replace(".", "::", 1) in HOST_SYNC_OPS


# ---------------------------------------------------------------------- tensors

def flatten_tensors(obj: Any) -> Iterable[torch.Tensor]:
    """The tensors of a (possibly nested) output, in order."""
    import torch
    from torch.utils._pytree import tree_flatten

    return (t for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor))
