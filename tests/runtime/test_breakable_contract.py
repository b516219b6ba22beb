"""The breakable-capture contract, tested against capturelint's runtime (emulated backend).

These are the behaviours a breakable CUDA-graph runtime promises its users (vLLM's
breakable cudagraphs promise the same): captured work does not happen at capture,
segments replay in order, eager breaks re-run with their capture-time arguments, nested
breaks run inline, FULL graphs capture breaks, break outputs are copied or discarded by
policy, the wrapper captures once per (mode, batch descriptor), host synchronisation is
refused inside captured segments, and memory a graph reads but nobody holds is reused.

Every value asserted here is computed by the runtime under test: on a GPU a capture
records kernels without running them, so the emulated backend must give the same
values on a CPU.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import nn

from capturelint.runtime import breakable, protocol
from capturelint.runtime.breakable import (
    BreakableGraph,
    CapturedSegment,
    CUDAGraphWrapper,
    EagerSegment,
    current_phase,
    eager_break_during_capture,
)
from capturelint.runtime.emulated import EmulatedCUDAGraph, is_current_stream_capturing, poison_value
from capturelint.runtime.forward_context import (
    BatchDescriptor,
    CUDAGraphMode,
    get_forward_context,
    set_forward_context,
)
from capturelint.runtime.protocol import (
    BreakCall,
    BreakOutputs,
    CaptureObserver,
    Frame,
    GraphInfo,
    HostSyncInCaptureError,
    Phase,
    SegmentInfo,
    SegmentKind,
    StaleInputEvent,
    observing,
    stream_capturing,
)

PIECEWISE, FULL, NONE = CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL, CUDAGraphMode.NONE
CAPTURED, EAGER = SegmentKind.CAPTURED, SegmentKind.EAGER
DECODE2 = BatchDescriptor(2, True)
MIXED4 = BatchDescriptor(4, False)

_HERE = Path(__file__).resolve()
# findings name files relative to the folder that holds the ``capturelint`` package
THIS_FILE = _HERE.relative_to(_HERE.parents[2]).as_posix()


def line_of(marker: str) -> int:
    """The line of this file that ends with ``# <marker>``."""
    lines = _HERE.read_text(encoding="utf-8").splitlines()
    (line,) = [i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# {marker}")]
    return line


@pytest.fixture(autouse=True)
def _inference_and_clean_runtime():
    observers = list(protocol._observers)
    with torch.random.fork_rng():
        torch.manual_seed(1234)
        with torch.no_grad():
            yield
    # whatever a test did, even raising mid-capture, the runtime is left idle
    assert breakable._active_capture() is None
    assert current_phase() is Phase.EAGER
    assert not stream_capturing()
    assert protocol._observers == observers
    assert torch._C._len_torch_dispatch_stack() == 0
    assert torch._C._len_torch_function_stack() == 0


class Recorder(CaptureObserver):
    """Keeps what the runtime announces."""

    def __init__(self) -> None:
        self.segments: list[SegmentInfo] = []
        self.breaks: list[tuple[str, BreakCall]] = []
        self.stale: list[StaleInputEvent] = []
        self.graphs: list[tuple[str, GraphInfo, Phase]] = []

    def on_graph_begin(self, graph: GraphInfo, phase: Phase) -> None:
        self.graphs.append(("begin", graph, phase))

    def on_graph_end(self, graph: GraphInfo, phase: Phase, output: Any) -> None:
        self.graphs.append(("end", graph, phase))

    def on_segment_begin(self, segment: SegmentInfo) -> None:
        self.segments.append(segment)

    def on_break_enter(self, call: BreakCall) -> None:
        self.breaks.append(("enter", call))

    def on_break_exit(self, call: BreakCall, result: Any) -> None:
        self.breaks.append(("exit", call))

    def on_stale_input(self, event: StaleInputEvent) -> None:
        self.stale.append(event)

    def entered(self) -> list[tuple[str, Phase, bool, int]]:
        return [(c.name.rsplit(".", 1)[-1], c.phase, c.inline, c.depth) for kind, c in self.breaks if kind == "enter"]


def kinds(graph: BreakableGraph) -> list[SegmentKind]:
    return [s.kind for s in graph.segments]


# ============================================================ 1. capture does not compute


def test_in_place_writes_of_a_captured_segment_are_undone_at_capture_and_applied_on_replay():
    buf = torch.full((4,), 3.0)
    view_target = torch.arange(6.0)

    def step():
        buf.mul_(2)
        buf.add_(1)
        view_target[1:3].fill_(-5.0)  # a write through a view

    graph = BreakableGraph(PIECEWISE, DECODE2)
    graph.capture(step)
    assert kinds(graph) == [CAPTURED]
    # the kernels were recorded, not run: pre-capture values survive
    assert torch.equal(buf, torch.full((4,), 3.0))
    assert torch.equal(view_target, torch.arange(6.0))

    graph.replay()
    assert torch.equal(buf, torch.full((4,), 7.0))
    assert torch.equal(view_target, torch.tensor([0.0, -5.0, -5.0, 3.0, 4.0, 5.0]))
    graph.replay()  # every replay runs the kernels again, on the current values
    assert torch.equal(buf, torch.full((4,), 15.0))


def test_tensors_first_produced_during_capture_are_poisoned_until_replay():
    x = torch.tensor([1.0, 2.0, 3.0])

    def step(t):
        return t * 2, t.to(torch.bfloat16) + 1, t.long() + 5, t.int() * 3, t < -100

    graph = BreakableGraph(FULL, DECODE2)
    out = graph.capture(step, x)
    as_float, as_bf16, as_long, as_int, as_bool = out
    assert torch.isnan(as_float).all()
    assert torch.isnan(as_bf16.float()).all()
    assert torch.equal(as_long, torch.zeros(3, dtype=torch.long))
    assert torch.equal(as_int, torch.zeros(3, dtype=torch.int32))
    assert torch.equal(as_bool, torch.ones(3, dtype=torch.bool))  # eager would be all False
    # the poison values, by dtype
    assert poison_value(torch.float32) != poison_value(torch.float32)  # NaN
    assert poison_value(torch.int64) == 0 and poison_value(torch.int8) == 0
    assert poison_value(torch.bool) is True

    x.copy_(torch.tensor([4.0, -1.0, 0.0]))
    assert graph.replay() is out  # a replay returns the capture's output objects ...
    expected = step(x)
    for got, want in zip(out, expected):  # ... now holding the replay's values
        assert got.dtype == want.dtype
        assert torch.equal(got, want)


def test_eager_break_runs_for_real_at_capture_between_undone_captured_writes():
    x = torch.zeros(4)

    @eager_break_during_capture
    def add_seven(t):
        t.add_(7.0)

    def step(t):
        t.add_(1.0)
        add_seven(t)
        t.mul_(3.0)

    graph = BreakableGraph(PIECEWISE, DECODE2)
    graph.capture(step, x)
    # the captured add and mul did not happen; the eager break's add did
    assert torch.equal(x, torch.full((4,), 7.0))
    x.fill_(1.0)
    graph.replay()
    assert torch.equal(x, torch.full((4,), 27.0))  # (1 + 1 + 7) * 3


# ============================================================ 2. segments replay in order


def test_segments_replay_in_order_captured_eager_captured():
    x = torch.zeros(8)
    seen: list[tuple[Phase, bool, torch.Tensor]] = []

    @eager_break_during_capture
    def double(t):
        seen.append((current_phase(), is_current_stream_capturing(), t.clone()))
        t.mul_(2.0)

    def step(t):
        t.add_(1.0)
        double(t)
        t.add_(5.0)

    graph = BreakableGraph(PIECEWISE, DECODE2)
    graph.capture(step, x)
    assert kinds(graph) == [CAPTURED, EAGER, CAPTURED]
    assert [s.index for s in graph.segments] == [0, 1, 2]
    assert isinstance(graph.segments[0], CapturedSegment) and isinstance(graph.segments[0].graph, EmulatedCUDAGraph)
    assert isinstance(graph.segments[1], EagerSegment) and graph.segments[1].name.endswith("double")
    # at capture the break saw the value before the (unexecuted) captured add, and no
    # stream was capturing while it ran
    ((phase, capturing, value),) = seen
    assert phase is Phase.CAPTURE and capturing is False
    assert torch.equal(value, torch.zeros(8))
    assert torch.equal(x, torch.zeros(8))

    for start, expected in ((10.0, 27.0), (100.0, 207.0)):  # (x + 1) * 2 + 5, and no other order
        x.fill_(start)
        graph.replay()
        assert torch.equal(x, torch.full((8,), expected))
        phase, capturing, value = seen[-1]
        assert phase is Phase.REPLAY and capturing is False
        assert torch.equal(value, torch.full((8,), start + 1.0))  # segment 0 ran before the break
    assert len(seen) == 3


def test_many_breaks_interleave_with_captured_segments_on_replay():
    clock = torch.zeros(1)
    stamps = [torch.zeros(1) for _ in range(3)]
    log: list[tuple[str, float]] = []

    def make_break(name: str) -> Callable[[], None]:
        def brk():
            log.append((name, clock.item()))  # a host read is fine in an eager break

        brk.__qualname__ = name
        return eager_break_during_capture(brk)

    first, second = make_break("A"), make_break("B")

    def tick(i: int) -> None:
        clock.add_(1.0)
        stamps[i].copy_(clock)

    def step():
        tick(0)
        first()
        tick(1)
        second()
        tick(2)

    recorder = Recorder()
    graph = BreakableGraph(PIECEWISE, DECODE2)
    with observing(recorder):
        graph.capture(step)
        # capture: every captured tick was undone at its segment's end
        assert log == [("A", 0.0), ("B", 0.0)]
        assert clock.item() == 0.0 and [s.item() for s in stamps] == [0.0, 0.0, 0.0]
        assert [s.name for s in graph.segments] == [None, "A", None, "B", None]

        log.clear()
        recorder.segments.clear()
        graph.replay()
    assert log == [("A", 1.0), ("B", 2.0)]
    assert [s.item() for s in stamps] == [1.0, 2.0, 3.0]
    assert [(s.index, s.kind, s.name, s.phase) for s in recorder.segments] == [
        (0, CAPTURED, None, Phase.REPLAY),
        (1, EAGER, "A", Phase.REPLAY),
        (2, CAPTURED, None, Phase.REPLAY),
        (3, EAGER, "B", Phase.REPLAY),
        (4, CAPTURED, None, Phase.REPLAY),
    ]


def test_captured_code_sees_a_capturing_stream_and_python_runs_once():
    x = torch.arange(4.0)
    python_runs: list[bool] = []

    def step(t):
        python_runs.append(is_current_stream_capturing())
        return t + 1

    graph = BreakableGraph(PIECEWISE, DECODE2)
    out = graph.capture(step, x)
    assert python_runs == [True]
    assert not is_current_stream_capturing()
    graph.replay()
    graph.replay()
    assert python_runs == [True]  # a replay runs no Python of captured segments
    assert torch.equal(out, x + 1)


# ============================================================ 3. break arguments are frozen


def test_break_reruns_with_its_capture_time_arguments_even_if_the_caller_passes_others():
    received: list[tuple[torch.Tensor, int, tuple, tuple, int, float]] = []

    @eager_break_during_capture
    def scale(t, factor):
        where = (t.untyped_storage()._cdata, tuple(t.shape), t.stride(), t.storage_offset())
        received.append((t, *where, factor))
        return t * factor

    def forward(t, factor):
        return scale(t, factor) + 1

    at_capture = torch.arange(4.0)
    other = torch.full((4,), 100.0)
    wrapper = CUDAGraphWrapper(forward)
    with set_forward_context(None, PIECEWISE, MIXED4):
        wrapper(at_capture, 2.0)
        out = wrapper(other, 3.0)  # replay: the caller's new arguments are not seen

    assert len(received) == 2
    (t0, *where0, f0), (t1, *where1, f1) = received
    assert t0 is at_capture  # at capture the break gets the caller's own tensor
    # at replay, the same memory (the runtime may hold it through an alias of its own)
    assert where1 == where0 == [at_capture.untyped_storage()._cdata, (4,), (1,), 0]
    assert where1[0] != other.untyped_storage()._cdata
    assert torch.equal(t1, at_capture)
    assert f0 == f1 == 2.0
    assert torch.equal(out, at_capture * 2.0 + 1)


def test_a_view_passed_to_a_break_is_the_same_view_of_the_live_buffer_on_replay():
    buf = torch.arange(6.0)
    seen: list[torch.Tensor] = []

    @eager_break_during_capture
    def read(v):
        seen.append(v.clone())
        return v * 10

    graph = BreakableGraph(PIECEWISE, DECODE2)
    out = graph.capture(lambda: read(buf[1:4]) + 1)  # a temporary view of a persistent buffer
    assert torch.equal(seen[0], torch.tensor([1.0, 2.0, 3.0]))
    buf.copy_(torch.tensor([9.0, 8.0, 7.0, 6.0, 5.0, 4.0]))
    graph.replay()
    assert torch.equal(seen[1], torch.tensor([8.0, 7.0, 6.0]))
    assert torch.equal(out, torch.tensor([81.0, 71.0, 61.0]))


def test_break_argument_made_in_a_captured_segment_is_the_same_tensor_refreshed_by_replay():
    x = torch.arange(4.0)
    received: list[tuple[torch.Tensor, torch.Tensor]] = []

    @eager_break_during_capture
    def look(h):
        received.append((h, h.clone()))
        return h + 0

    def forward(t):
        h = t * 2  # produced in captured segment 0
        return look(h) - 1

    graph = BreakableGraph(PIECEWISE, DECODE2)
    graph.capture(forward, x)
    # at capture the captured multiply had not run: the break read graph-pool garbage
    assert torch.isnan(received[0][1]).all()

    x.copy_(torch.tensor([5.0, 6.0, 7.0, 8.0]))
    out = graph.replay()
    h0, h1 = received[0][0], received[1][0]
    assert h1 is h0 or h1.untyped_storage()._cdata == h0.untyped_storage()._cdata  # same memory
    assert (h1.shape, h1.stride(), h1.storage_offset()) == (h0.shape, h0.stride(), h0.storage_offset())
    assert torch.equal(received[1][1], x * 2)  # refreshed by segment 0's replay
    assert torch.equal(out, x * 2 - 1)


# ============================================================ 4. nested breaks run inline


def test_a_break_called_inside_a_break_runs_inline_not_as_a_segment():
    x = torch.zeros(4)
    inner_phases: list[Phase] = []

    @eager_break_during_capture
    def inner(t):
        inner_phases.append(current_phase())
        t.add_(1.0)

    @eager_break_during_capture
    def outer(t):
        inner(t)
        t.add_(10.0)

    def step(t):
        t.add_(2.0)
        outer(t)
        t.add_(100.0)

    recorder = Recorder()
    graph = BreakableGraph(PIECEWISE, DECODE2)
    with observing(recorder):
        graph.capture(step, x)
        assert kinds(graph) == [CAPTURED, EAGER, CAPTURED]
        assert graph.num_eager_breaks == 1
        assert graph.segments[1].name.endswith("outer")
        assert torch.equal(x, torch.full((4,), 11.0))  # only the eager segment ran: 0 + 1 + 10

        x.fill_(0.0)
        graph.replay()
    assert torch.equal(x, torch.full((4,), 113.0))  # 0 + 2 + 1 + 10 + 100
    assert inner_phases == [Phase.CAPTURE, Phase.REPLAY]
    # the outer break is an eager segment (not inline); the inner one runs inline inside
    # it. ``depth`` counts enclosing *inline* breaks (protocol.BreakCall), and the outer
    # one is a segment here, so the inner call is at depth 0.
    assert recorder.entered() == [
        ("outer", Phase.CAPTURE, False, 0),
        ("inner", Phase.CAPTURE, True, 0),
        ("outer", Phase.REPLAY, False, 0),
        ("inner", Phase.REPLAY, True, 0),
    ]


@eager_break_during_capture
def _scale_in_break(t: torch.Tensor, factor: float) -> None:
    t.mul_(factor)


@torch.library.custom_op("capturelint_test::scale_in_break", mutates_args=("t",))
def _scale_op(t: torch.Tensor, factor: float) -> None:
    """A dispatched op whose implementation is an eager break, as vLLM's
    ``torch.ops.vllm.sparse_attn_indexer`` is: the break is entered from inside the
    dispatch of an op the capture's recording mode is handling."""
    _scale_in_break(t, factor)


def test_a_break_entered_from_inside_a_dispatched_op_is_an_eager_segment():
    x = torch.zeros(4)

    def step(t):
        t.add_(1.0)
        torch.ops.capturelint_test.scale_in_break(t, 3.0)  # the break runs inside the op's dispatch
        t.add_(5.0)

    recorder = Recorder()
    graph = BreakableGraph(PIECEWISE, DECODE2)
    with observing(recorder):
        graph.capture(step, x)
        # as on a GPU: the op's kernels ran eagerly between two captured segments, and
        # the captured adds did not take effect at capture
        assert kinds(graph) == [CAPTURED, EAGER, CAPTURED]
        assert torch.equal(x, torch.zeros(4))
        # the op itself is in no segment: replayed once, by its break, not by a graph too
        assert [c.func.__name__ for s in graph.segments if s.kind is CAPTURED for c in s.graph._calls] == [
            "add_.Tensor", "add_.Tensor"]
        for start in (0.0, 10.0):
            x.fill_(start)
            graph.replay()
            assert torch.equal(x, torch.full((4,), (start + 1.0) * 3.0 + 5.0))
    assert recorder.entered() == [("_scale_in_break", Phase.CAPTURE, False, 0)] + [
        ("_scale_in_break", Phase.REPLAY, False, 0)] * 2
    # the fixture checks the mode stacks are left empty: the first segment's modes, taken
    # off the stacks for the op's dispatch, recorded the second segment and were popped


@pytest.mark.parametrize("where", ["eager", "full capture"])
def test_nested_inline_breaks_count_their_depth(where):
    x = torch.zeros(2)

    @eager_break_during_capture
    def inner(t):
        return t + 1

    @eager_break_during_capture
    def outer(t):
        return inner(t) * 2

    recorder = Recorder()
    with observing(recorder):
        if where == "eager":
            result = outer(x)
            assert torch.equal(result, torch.full((2,), 2.0))
            phase = Phase.EAGER
        else:
            graph = BreakableGraph(FULL, DECODE2)
            out = graph.capture(outer, x)
            assert kinds(graph) == [CAPTURED]
            graph.replay()
            assert torch.equal(out, torch.full((2,), 2.0))
            phase = Phase.CAPTURE
    assert recorder.entered() == [("outer", phase, True, 0), ("inner", phase, True, 1)]


def test_a_break_outside_any_capture_is_a_plain_call():
    calls = []

    @eager_break_during_capture
    def f(v):
        calls.append(v)
        return v * 2

    recorder = Recorder()
    with observing(recorder):
        assert f(3) == 6
    assert calls == [3]
    ((kind, call),) = [b for b in recorder.breaks if b[0] == "enter"]
    assert (call.phase, call.inline, call.depth, call.args) == (Phase.EAGER, True, 0, (3,))
    assert call.params == ("v",)
    assert call.frame.file == THIS_FILE and call.frame.function == "test_a_break_outside_any_capture_is_a_plain_call"


# ============================================================ 5. FULL graphs capture breaks


def test_full_graph_runs_breaks_inline_and_captures_their_ops():
    x = torch.zeros(4)
    python_runs: list[tuple[Phase, bool]] = []

    @eager_break_during_capture
    def double(t):
        python_runs.append((current_phase(), is_current_stream_capturing()))
        t.mul_(2.0)

    def step(t):
        t.add_(1.0)
        double(t)
        t.add_(5.0)

    recorder = Recorder()
    graph = BreakableGraph(FULL, DECODE2)
    with observing(recorder):
        graph.capture(step, x)
    assert kinds(graph) == [CAPTURED]
    assert graph.num_eager_breaks == 0
    assert graph.info.breaks_eager is False and graph.info.mode == "FULL"
    assert not any(s.kind is EAGER for s in recorder.segments)
    assert recorder.entered() == [("double", Phase.CAPTURE, True, 0)]
    # the break ran inside the capture, so its multiply was recorded and undone too
    assert python_runs == [(Phase.CAPTURE, True)]
    assert torch.equal(x, torch.zeros(4))

    x.fill_(10.0)
    graph.replay()
    assert torch.equal(x, torch.full((4,), 27.0))  # the break's multiply replayed in place
    assert python_runs == [(Phase.CAPTURE, True)]  # its Python did not


def test_full_graph_bakes_what_a_break_reads_from_the_forward_context():
    x = torch.arange(4.0)

    @eager_break_during_capture
    def scale(t):
        return t * get_forward_context().attn_metadata["scale"]

    graph = BreakableGraph(FULL, DECODE2)
    with set_forward_context({"scale": 2.0}):
        out = graph.capture(lambda t: scale(t) + 1, x)
    with set_forward_context({"scale": 5.0}):
        graph.replay()
    assert torch.equal(out, x * 2.0 + 1)  # not x * 5 + 1: the value was frozen at capture


# ============================================================ 6. break outputs: copy or discard


@eager_break_during_capture
def scaled_by_context(t: torch.Tensor) -> torch.Tensor:
    """Returns a new tensor every call, scaled by the step's context."""
    return t * get_forward_context().attn_metadata["scale"]


@pytest.mark.parametrize("policy", list(BreakOutputs))
def test_break_return_values_are_copied_or_discarded_on_replay(policy):
    x = torch.arange(4.0)
    returned: list[torch.Tensor] = []  # values only: holding the tensors would keep them alive

    @eager_break_during_capture
    def brk(t):
        r = scaled_by_context(t)
        returned.append(r.clone())
        return r

    graph = BreakableGraph(PIECEWISE, DECODE2, break_outputs=policy)
    assert graph.info.break_outputs is policy
    with set_forward_context({"scale": 2.0}):
        out = graph.capture(lambda t: brk(t) + 1, x)
    assert torch.isnan(out).all()  # a capture computes nothing downstream
    assert torch.equal(returned[0], x * 2.0)  # the break itself ran for real
    segment = graph.segments[1]
    assert isinstance(segment, EagerSegment)

    x.copy_(torch.tensor([1.0, -2.0, 3.0, -4.0]))
    recorder = Recorder()
    with set_forward_context({"scale": 3.0}), observing(recorder):
        replayed = graph.replay()
    assert replayed is out
    assert len(returned) == 2  # the break re-ran either way
    assert torch.equal(returned[1], x * 3.0)

    if policy is BreakOutputs.COPY:
        (static,) = segment.outputs
        assert torch.equal(static, x * 3.0)  # copied into the tensor the break returned at capture
        assert torch.equal(out, x * 3.0 + 1)
        assert recorder.stale == []
    else:
        assert segment.outputs == []
        # downstream read the capture-time tensor, which nobody held after capture:
        # freed memory on a GPU, poisoned here
        assert torch.isnan(out).all()
        assert [e.segment for e in recorder.stale] == [2]


def test_discard_policy_works_for_a_break_that_writes_in_place_into_a_static_buffer():
    x = torch.arange(4.0)
    static = torch.empty(4)

    @eager_break_during_capture
    def scale_into(t, dst):
        torch.mul(t, get_forward_context().attn_metadata["scale"], out=dst)

    def forward(t):
        scale_into(t, static)
        return static + 1

    graph = BreakableGraph(PIECEWISE, DECODE2, break_outputs=BreakOutputs.DISCARD)
    with set_forward_context({"scale": 2.0}):
        out = graph.capture(forward, x)
    for scale in (3.0, -0.5):
        x.copy_(torch.randn(4))
        with set_forward_context({"scale": scale}):
            graph.replay()
        assert torch.equal(out, x * scale + 1)


# ============================================================ 7. the wrapper


def test_wrapper_captures_once_per_mode_and_descriptor_then_replays():
    lin = nn.Linear(4, 4)
    buf = torch.randn(4, 4)
    python_runs: list[tuple[CUDAGraphMode, BatchDescriptor]] = []

    def runnable(t):
        ctx = get_forward_context()
        python_runs.append((ctx.cudagraph_runtime_mode, ctx.batch_descriptor))
        return scaled_by_context(lin(t)) * 2

    wrapper = CUDAGraphWrapper(runnable)
    with set_forward_context({"scale": 2.0}, PIECEWISE, MIXED4):
        first = wrapper(buf)
    assert list(wrapper.graphs) == [(PIECEWISE, MIXED4)]
    assert torch.isnan(first).all()  # the capture's output is garbage until a replay

    for scale in (3.0, -1.0):
        buf.copy_(torch.randn(4, 4))
        with set_forward_context({"scale": scale}, PIECEWISE, BatchDescriptor(4, False)):  # an equal key
            out = wrapper(buf)
        assert out is first
        assert torch.equal(out, lin(buf) * scale * 2)
    assert python_runs == [(PIECEWISE, MIXED4)]  # captured once, replayed twice

    decode4 = BatchDescriptor(4, True)
    for mode, descriptor in ((PIECEWISE, decode4), (FULL, MIXED4), (PIECEWISE, decode4), (FULL, MIXED4)):
        with set_forward_context({"scale": 2.0}, mode, descriptor):
            wrapper(buf)
    assert python_runs == [(PIECEWISE, MIXED4), (PIECEWISE, decode4), (FULL, MIXED4)]
    assert set(wrapper.graphs) == {(PIECEWISE, MIXED4), (PIECEWISE, decode4), (FULL, MIXED4)}
    full = wrapper.graphs[(FULL, MIXED4)]
    assert full.runtime_mode is FULL and full.descriptor == MIXED4 and full.info.label == "mixed/4"
    assert kinds(full) == [CAPTURED]
    assert kinds(wrapper.graphs[(PIECEWISE, decode4)]) == [CAPTURED, EAGER, CAPTURED]


@pytest.mark.parametrize("context", ["none", "mode NONE", "no descriptor"])
def test_wrapper_runs_eagerly_without_a_capture_mode(context):
    lin = nn.Linear(4, 4)
    buf = torch.randn(4, 4)
    calls = []

    def runnable(t):
        calls.append(is_current_stream_capturing())
        return lin(t) + 1

    wrapper = CUDAGraphWrapper(runnable)
    for _ in range(2):
        if context == "none":
            out = wrapper(buf)
        elif context == "mode NONE":
            with set_forward_context(None, NONE, MIXED4):
                out = wrapper(buf)
        else:
            with set_forward_context(None, PIECEWISE, None):
                out = wrapper(buf)
        assert torch.equal(out, lin(buf) + 1)  # real values, computed now
        buf.copy_(torch.randn(4, 4))
    assert calls == [False, False]
    assert wrapper.graphs == {}


# ============================================================ 8. host sync refused at capture


def item_of(y):
    return y.sum().item()  # host-sync: item


def tolist_of(y):
    return y.tolist()  # host-sync: tolist


def nonzero_of(y):
    return torch.nonzero(y > 0)  # host-sync: nonzero


def mask_of(y):
    return y[y > 0]  # host-sync: mask


def mask_assign(y):
    y[y > 0] = 0.0  # host-sync: mask-assign
    return y


HOST_READS = [
    (item_of, "item", "_local_scalar_dense"),
    (tolist_of, "tolist", "tolist"),
    (nonzero_of, "nonzero", "nonzero"),
    (mask_of, "mask", "boolean mask"),
    (mask_assign, "mask-assign", "boolean mask"),
]


@pytest.mark.parametrize("host_read, marker, op", HOST_READS, ids=[m for _, m, _ in HOST_READS])
@pytest.mark.parametrize("after_break", [False, True], ids=["segment0", "segment2"])
def test_host_sync_inside_a_captured_segment_raises_with_where(host_read, marker, op, after_break):
    x = torch.randn(2, 4)

    @eager_break_during_capture
    def harmless(t):
        return t * 2

    def forward(t):
        h = harmless(t) if after_break else t * 2
        return host_read(h + 1)

    graph = BreakableGraph(PIECEWISE, DECODE2)
    with pytest.raises(HostSyncInCaptureError) as info:
        graph.capture(forward, x)
    event = info.value.event
    assert op in event.op
    assert isinstance(event.frame, Frame)
    assert event.frame == Frame(THIS_FILE, line_of(f"host-sync: {marker}"), host_read.__name__)
    assert isinstance(event.graph, GraphInfo)
    assert event.graph.id == graph.info.id and event.graph.label == "decode/2"
    assert event.segment == (2 if after_break else 0)
    assert str(event.frame) in str(info.value)

    # the runtime is usable again afterwards
    again = BreakableGraph(PIECEWISE, DECODE2)
    out = again.capture(lambda t: t + 1, x)
    again.replay()
    assert torch.equal(out, x + 1)


@pytest.mark.parametrize("host_read, marker, op", HOST_READS, ids=[m for _, m, _ in HOST_READS])
def test_host_sync_inside_an_eager_break_is_allowed(host_read, marker, op):
    x = torch.randn(2, 4)
    results: list[Any] = []

    @eager_break_during_capture
    def reads_host(t):
        results.append(host_read(t.clone()))
        return t * 2

    graph = BreakableGraph(PIECEWISE, DECODE2)
    graph.capture(lambda t: reads_host(t) + 1, x)
    x.copy_(torch.randn(2, 4))
    out = graph.replay()
    assert len(results) == 2
    assert torch.equal(out, x * 2 + 1)
    if host_read is item_of:
        assert results[1] == pytest.approx(x.sum().item())


def test_host_sync_inside_a_break_of_a_full_graph_raises():
    @eager_break_during_capture
    def reads_host(t):
        return t * t.max().item()  # host-sync: full

    graph = BreakableGraph(FULL, DECODE2)
    with pytest.raises(HostSyncInCaptureError) as info:
        graph.capture(lambda t: reads_host(t) + 1, torch.randn(3))
    assert info.value.event.frame == Frame(THIS_FILE, line_of("host-sync: full"), "reads_host")
    assert info.value.event.graph.mode == "FULL" and info.value.event.segment == 0


def test_host_sync_outside_a_capture_is_fine():
    y = torch.tensor([1.0, -2.0, 3.0])
    assert item_of(y) == 2.0
    assert tolist_of(y) == [1.0, -2.0, 3.0]
    assert torch.equal(mask_of(y), torch.tensor([1.0, 3.0]))


# ============================================================ capture state and errors


def test_an_exception_inside_capture_leaves_the_runtime_idle():
    graph = BreakableGraph(PIECEWISE, DECODE2)

    def boom(t):
        t = t + 1
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        graph.capture(boom, torch.zeros(2))
    assert breakable._active_capture() is None and not is_current_stream_capturing()
    fresh = BreakableGraph(PIECEWISE, DECODE2)
    ones = torch.ones(2)  # held: a graph does not own its inputs
    out = fresh.capture(lambda t: t + 1, ones)
    fresh.replay()
    assert torch.equal(out, torch.full((2,), 2.0))


def test_nested_captures_are_refused():
    inner = BreakableGraph(PIECEWISE, DECODE2)
    outer = BreakableGraph(PIECEWISE, DECODE2)
    with pytest.raises(RuntimeError, match="nested"):
        outer.capture(lambda t: inner.capture(lambda u: u + 1, t), torch.zeros(2))


def test_capture_state_is_per_thread():
    seen: dict[str, Any] = {}

    def worker():
        seen["capturing"] = is_current_stream_capturing()
        seen["phase"] = current_phase()

    def step(t):
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        seen["main"] = is_current_stream_capturing()
        return t + 1

    BreakableGraph(PIECEWISE, DECODE2).capture(step, torch.zeros(2))
    assert seen == {"capturing": False, "phase": Phase.EAGER, "main": True}


# ============================================================ 10. freed inputs are reused memory


class Holder:
    """An engine that keeps its input in an attribute; the graph reads it from there."""

    def __init__(self) -> None:
        self.weight = torch.randn(4)
        self.static = torch.randn(2, 4)

    def forward(self) -> torch.Tensor:
        a = self.weight * 2  # segment 0
        b = scaled_by_context(a)  # an eager break in PIECEWISE
        return b + self.static  # the last captured segment reads ``static``


@pytest.mark.parametrize("mode, segment", [(FULL, 0), (PIECEWISE, 2)])
def test_dropping_a_tensor_the_graph_reads_poisons_it_at_the_next_replay(mode, segment):
    engine = Holder()
    graph = BreakableGraph(mode, DECODE2)
    with set_forward_context({"scale": 1.0}):
        out = graph.capture(engine.forward)
        graph.replay()
        assert torch.equal(out, engine.forward())

        old_storage = engine.static.untyped_storage()._cdata
        engine.static = engine.static.clone()  # same values, new memory; the old one is dropped
        recorder = Recorder()
        with observing(recorder):
            graph.replay()
            assert torch.isnan(out).all()  # the graph read memory nobody holds
            eager = engine.forward()
            assert torch.isfinite(eager).all()
            graph.replay()
            assert torch.isnan(out).all()
    (event,) = recorder.stale  # once, not at every replay
    assert event.storage == old_storage
    assert event.graph.id == graph.info.id
    assert event.segment == segment
    assert event.dtype == "float32"


@pytest.mark.parametrize("mode", [FULL, PIECEWISE])
def test_refreshing_an_input_in_place_keeps_replay_correct(mode):
    engine = Holder()
    graph = BreakableGraph(mode, DECODE2)
    recorder = Recorder()
    with set_forward_context({"scale": 1.0}), observing(recorder):
        out = graph.capture(engine.forward)
        for _ in range(3):
            engine.static.copy_(torch.randn(2, 4))
            graph.replay()
            assert torch.equal(out, engine.forward())
    assert recorder.stale == []


def test_dropping_a_break_argument_poisons_it_for_the_replayed_break():
    holder = Holder()
    seen: list[torch.Tensor] = []

    @eager_break_during_capture
    def brk(t):
        seen.append(t.clone())
        return t * 2

    graph = BreakableGraph(PIECEWISE, DECODE2)
    out = graph.capture(lambda: brk(holder.static) + 1)
    graph.replay()
    assert torch.equal(out, holder.static * 2 + 1)

    old_storage = holder.static.untyped_storage()._cdata
    holder.static = holder.static.clone()  # the break's frozen argument is dropped
    recorder = Recorder()
    with observing(recorder):
        graph.replay()
    assert torch.isnan(seen[-1]).all()
    assert torch.isnan(out).all()
    (event,) = recorder.stale
    assert (event.storage, event.segment, event.graph.id) == (old_storage, 1, graph.info.id)


_HOST = {"scale": 2.0}  # a host value the op's Python reads, as vLLM's ops read the forward context


@torch.library.custom_op("capturelint_test::scale_by_host", mutates_args=("out",))
def _scale_by_host(x: torch.Tensor, out: torch.Tensor) -> None:
    """Python around kernels, as ``torch.ops.vllm.unified_kv_cache_update`` is."""
    out.copy_(x * _HOST["scale"])


protocol.register_wrapper_op("capturelint_test::scale_by_host")


@pytest.mark.parametrize("mode", [FULL, PIECEWISE])
def test_a_capture_records_the_ops_a_wrapper_op_runs_not_the_op(mode):
    # On a GPU the capture records the kernels the op's Python launched, with the host
    # value of the capture baked in; re-running the op's Python on replay would read the
    # host value of the replay instead (and, without a forward context, fail).
    x, out = torch.ones(3), torch.zeros(3)

    def step(t):
        torch.ops.capturelint_test.scale_by_host(t, out)

    graph = BreakableGraph(mode, DECODE2)
    _HOST["scale"] = 2.0
    graph.capture(step, x)
    assert [c.func.__name__ for s in graph.segments for c in s.graph._calls] == ["mul.Tensor", "copy_.default"]
    _HOST["scale"] = 5.0
    x.fill_(3.0)
    graph.replay()
    assert torch.equal(out, torch.full((3,), 6.0))  # the capture's scale, the replay's input
