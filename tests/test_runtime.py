"""The breakable capture runtime (capturelint/runtime/breakable.py), emulated backend, with
hand-made engines: an nn.Linear plus eager breaks that read the forward context."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import nn

from capturelint.runtime import breakable as rt
from capturelint.runtime.breakable import (
    BreakOutputs,
    BreakableGraph,
    BreakCall,
    CaptureObserver,
    CUDAGraphWrapper,
    HostSyncInCaptureError,
    Phase,
    SegmentInfo,
    SegmentKind,
    eager_break_during_capture,
    observing,
)
from capturelint.engine.dispatcher import CudagraphDispatcher
from capturelint.runtime import protocol
from capturelint.runtime.schema import ReplayKind
from capturelint.runtime.forward_context import BatchDescriptor, CUDAGraphMode, get_forward_context, set_forward_context

PIECEWISE, FULL, NONE = CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL, CUDAGraphMode.NONE
THIS_FILE = "tests/test_runtime.py"


def _line_of(marker: str) -> int:
    """Line number of the line of this file that ends with ``# <marker>``."""
    lines = Path(__file__).read_text(encoding="utf-8").splitlines()
    (line,) = [i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# {marker}")]
    return line


@pytest.fixture(autouse=True)
def _no_grad_and_clean_runtime():
    observers = list(protocol._observers)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        with torch.no_grad():
            yield
    # the runtime leaves no capture, mode or observer behind, even after an error
    assert rt._active_capture() is None
    assert rt.current_phase() is Phase.EAGER
    assert protocol._observers == observers
    assert torch._C._len_torch_function_stack() == 0
    assert torch._C._len_torch_dispatch_stack() == 0


# ------------------------------------------------------------------ the tiny engine


@eager_break_during_capture
def scale_by_context(x: torch.Tensor) -> torch.Tensor:
    """Reads the forward context: the kind of code that must be an eager break."""
    return x * get_forward_context().attn_metadata["scale"]


@eager_break_during_capture
def outer_break(x: torch.Tensor) -> torch.Tensor:
    return scale_by_context(x) + 1


class TinyEngine:
    """lin -> scale_by_context (a break) -> relu + 1, on a persistent input buffer."""

    def __init__(self, brk: Callable[[torch.Tensor], torch.Tensor] = scale_by_context):
        self.lin = nn.Linear(4, 4)
        self.inputs = torch.randn(2, 4)
        self.brk = brk

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        h = self.brk(h)
        return torch.relu(h) + 1

    def refresh(self) -> None:
        """What a runner does between steps: new values into the same buffer."""
        self.inputs.copy_(torch.randn_like(self.inputs))


def capture(engine: TinyEngine, mode: CUDAGraphMode, scale: float = 2.0, **options: Any) -> BreakableGraph:
    graph = BreakableGraph(mode, BatchDescriptor(2, True), **options)
    with set_forward_context({"scale": scale}):
        graph.capture(engine.forward, engine.inputs)
    return graph


def replay_and_eager(engine: TinyEngine, graph: BreakableGraph, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    with set_forward_context({"scale": scale}):
        eager = engine.forward(engine.inputs).clone()
        replayed = graph.replay().clone()
    return replayed, eager


class Recorder(CaptureObserver):
    def __init__(self, call_shadow: bool = False):
        self.events: list[tuple] = []
        self.call_shadow = call_shadow
        self.shadow_outputs: list[torch.Tensor] = []

    def on_graph_begin(self, graph, phase):
        self.events.append(("graph_begin", phase))

    def on_graph_end(self, graph, phase, output):
        self.events.append(("graph_end", phase))

    def on_segment_begin(self, segment: SegmentInfo):
        self.events.append(("segment_begin", segment.index, segment.kind, segment.name, segment.phase))

    def on_segment_end(self, segment: SegmentInfo):
        self.events.append(("segment_end", segment.index, segment.kind, segment.name, segment.phase))

    def on_break_enter(self, call: BreakCall):
        self.events.append(("break_enter", call.name, call.phase, call.inline, call.depth))

    def on_break_exit(self, call: BreakCall, result):
        self.events.append(("break_exit", call.name, call.phase, call.inline, call.depth))

    def before_replay(self, graph, shadow):
        self.events.append(("before_replay", graph.mode))
        if self.call_shadow:
            self.shadow_outputs.append(shadow().clone())


# ------------------------------------------------------------------ PIECEWISE and FULL


def test_piecewise_splits_into_captured_eager_captured_and_replays_like_eager():
    engine = TinyEngine()
    graph = capture(engine, PIECEWISE, scale=2.0)
    assert [s.kind for s in graph.segments] == [SegmentKind.CAPTURED, SegmentKind.EAGER, SegmentKind.CAPTURED]
    assert [s.index for s in graph.segments] == [0, 1, 2]
    assert graph.num_eager_breaks == 1
    assert graph.segments[1].name == "scale_by_context"
    assert graph.summary() == "captured(1 calls) -> eager(scale_by_context) -> captured(2 calls)"

    for scale in (3.0, -1.0):
        engine.refresh()
        replayed, eager = replay_and_eager(engine, graph, scale)
        assert torch.equal(replayed, eager)


def test_replay_returns_the_capture_time_output_tensor():
    engine = TinyEngine()
    graph = BreakableGraph(PIECEWISE)
    with set_forward_context({"scale": 2.0}):
        out = graph.capture(engine.forward, engine.inputs)
    engine.refresh()
    with set_forward_context({"scale": 2.0}):
        assert graph.replay() is out


def test_full_runs_breaks_inline_and_bakes_the_context():
    engine = TinyEngine()
    graph = capture(engine, FULL, scale=2.0)
    assert [s.kind for s in graph.segments] == [SegmentKind.CAPTURED]
    assert graph.num_eager_breaks == 0

    engine.refresh()
    replayed, eager = replay_and_eager(engine, graph, scale=2.0)
    assert torch.equal(replayed, eager)  # same context: the baked value is right

    engine.refresh()
    replayed, eager = replay_and_eager(engine, graph, scale=-3.0)
    assert not torch.allclose(replayed, eager)  # the hazard is real: replay still scales by 2
    with set_forward_context({"scale": 2.0}):
        assert torch.equal(replayed, engine.forward(engine.inputs))


def test_nested_breaks_run_inline():
    engine = TinyEngine(brk=outer_break)
    recorder = Recorder()
    with observing(recorder):
        graph = capture(engine, PIECEWISE)
        engine.refresh()
        replayed, eager = replay_and_eager(engine, graph, scale=5.0)
    assert [s.name for s in graph.segments] == [None, "outer_break", None]
    breaks = [e for e in recorder.events if e[0].startswith("break")]
    assert breaks == [
        # capture: the outer break is an eager segment, the inner one runs inside it
        ("break_enter", "outer_break", Phase.CAPTURE, False, 0),
        ("break_enter", "scale_by_context", Phase.CAPTURE, True, 0),
        ("break_exit", "scale_by_context", Phase.CAPTURE, True, 0),
        ("break_exit", "outer_break", Phase.CAPTURE, False, 0),
        # eager forward: both inline, the inner one at depth 1
        ("break_enter", "outer_break", Phase.EAGER, True, 0),
        ("break_enter", "scale_by_context", Phase.EAGER, True, 1),
        ("break_exit", "scale_by_context", Phase.EAGER, True, 1),
        ("break_exit", "outer_break", Phase.EAGER, True, 0),
        # replay: the eager segment re-runs, the inner break inline inside it
        ("break_enter", "outer_break", Phase.REPLAY, False, 0),
        ("break_enter", "scale_by_context", Phase.REPLAY, True, 0),
        ("break_exit", "scale_by_context", Phase.REPLAY, True, 0),
        ("break_exit", "outer_break", Phase.REPLAY, False, 0),
    ]
    assert torch.equal(replayed, eager)


def test_nested_breaks_in_a_full_capture_count_depth():
    engine = TinyEngine(brk=outer_break)
    recorder = Recorder()
    with observing(recorder):
        capture(engine, FULL)
    assert [e for e in recorder.events if e[0] == "break_enter"] == [
        ("break_enter", "outer_break", Phase.CAPTURE, True, 0),
        ("break_enter", "scale_by_context", Phase.CAPTURE, True, 1),
    ]


# ------------------------------------------------------------------------ observers


def test_observers_see_segments_breaks_and_a_working_shadow():
    engine = TinyEngine()
    wrapper = CUDAGraphWrapper(engine.forward)
    recorder = Recorder(call_shadow=True)
    descriptor = BatchDescriptor(2, False)
    with observing(recorder):
        with set_forward_context({"scale": 2.0}, PIECEWISE, descriptor):
            wrapper(engine.inputs)
        engine.refresh()
        with set_forward_context({"scale": 4.0}, PIECEWISE, descriptor):
            replayed = wrapper(engine.inputs).clone()

    C, E = SegmentKind.CAPTURED, SegmentKind.EAGER
    cap, rep, eag = Phase.CAPTURE, Phase.REPLAY, Phase.EAGER
    assert recorder.events == [
        ("graph_begin", cap),
        ("segment_begin", 0, C, None, cap),
        ("segment_end", 0, C, None, cap),
        ("segment_begin", 1, E, "scale_by_context", cap),
        ("break_enter", "scale_by_context", cap, False, 0),
        ("break_exit", "scale_by_context", cap, False, 0),
        ("segment_end", 1, E, "scale_by_context", cap),
        ("segment_begin", 2, C, None, cap),
        ("segment_end", 2, C, None, cap),
        ("graph_end", cap),
        ("before_replay", "PIECEWISE"),
        ("break_enter", "scale_by_context", eag, True, 0),  # the shadow, run by the observer
        ("break_exit", "scale_by_context", eag, True, 0),
        ("graph_begin", rep),
        ("segment_begin", 0, C, None, rep),
        ("segment_end", 0, C, None, rep),
        ("segment_begin", 1, E, "scale_by_context", rep),
        ("break_enter", "scale_by_context", rep, False, 0),
        ("break_exit", "scale_by_context", rep, False, 0),
        ("segment_end", 1, E, "scale_by_context", rep),
        ("segment_begin", 2, C, None, rep),
        ("segment_end", 2, C, None, rep),
        ("graph_end", rep),
    ]
    (shadow,) = recorder.shadow_outputs
    assert torch.equal(shadow, replayed)
    with set_forward_context({"scale": 4.0}):
        assert torch.equal(shadow, engine.forward(engine.inputs))


def test_wrapper_captures_once_per_descriptor_and_runs_mode_none_eagerly():
    engine = TinyEngine()
    wrapper = CUDAGraphWrapper(engine.forward)
    with set_forward_context({"scale": 2.0}, NONE, None):
        wrapper(engine.inputs)
    assert wrapper.num_graphs == 0
    for _ in range(3):
        for mode, descriptor in ((PIECEWISE, BatchDescriptor(2, False)), (FULL, BatchDescriptor(2, True))):
            with set_forward_context({"scale": 2.0}, mode, descriptor):
                wrapper(engine.inputs)
    assert wrapper.num_graphs == 2
    assert wrapper.num_eager_breaks == 1  # the PIECEWISE graph's; the FULL graph has none
    assert sorted(str(d) for _, d in wrapper.graphs) == ["decode/2", "mixed/2"]


# ------------------------------------------------------------ host synchronisation


def _item(y: torch.Tensor) -> Any:
    return y.sum().item()  # host-sync: item


def _tolist(y: torch.Tensor) -> Any:
    return y.tolist()  # host-sync: tolist


def _nonzero(y: torch.Tensor) -> Any:
    return torch.nonzero(y > 0)  # host-sync: nonzero


def _mask(y: torch.Tensor) -> Any:
    return y[y > 0]  # host-sync: mask


@pytest.mark.parametrize(
    "host_read, marker, op",
    [
        (_item, "item", "aten._local_scalar_dense.default"),
        (_tolist, "tolist", "Tensor.tolist()"),
        (_nonzero, "nonzero", "aten.nonzero.default"),
        (_mask, "mask", "aten.index.Tensor with a boolean mask"),
    ],
)
def test_host_sync_inside_a_captured_segment_raises(host_read, marker, op):
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4)

    @eager_break_during_capture
    def harmless(t):
        return t * 2

    def forward(t):
        return host_read(harmless(lin(t)))

    graph = BreakableGraph(PIECEWISE)
    with pytest.raises(HostSyncInCaptureError) as info:
        graph.capture(forward, x)
    error = info.value
    assert error.event.op == op
    assert str(error.event.frame) == f"{THIS_FILE}:{_line_of(f'host-sync: {marker}')} in {host_read.__name__}"
    assert error.event.segment == 2  # the captured segment after the break
    assert str(error).startswith(f"host synchronisation {op} inside captured segment 2 of graph {error.event.graph.label} at {THIS_FILE}:")

    # the runtime is usable again
    engine = TinyEngine()
    assert [s.kind for s in capture(engine, PIECEWISE).segments][1] is SegmentKind.EAGER


@pytest.mark.parametrize("host_read", [_item, _tolist, _nonzero, _mask])
def test_host_sync_inside_an_eager_break_is_allowed(host_read):
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    seen = []

    @eager_break_during_capture
    def reads_host(t):
        seen.append(host_read(t))
        return t * 2

    graph = BreakableGraph(PIECEWISE)
    graph.capture(lambda t: reads_host(lin(t)) + 1, x)
    graph.replay()
    assert len(seen) == 2


def test_host_sync_in_a_full_capture_raises_even_inside_a_break():
    engine = TinyEngine()

    @eager_break_during_capture
    def reads_host(t):
        t.sum().item()  # host-sync: full
        return t

    engine.brk = reads_host
    with pytest.raises(HostSyncInCaptureError) as info:
        capture(engine, FULL)
    assert str(info.value.event.frame) == f"{THIS_FILE}:{_line_of('host-sync: full')} in reads_host"


def test_host_sync_check_does_not_fire_outside_capture():
    engine = TinyEngine()
    assert isinstance(_item(engine.lin(engine.inputs)), float)
    assert len(_tolist(engine.inputs)) == 2


# ---------------------------------------------------------------- break outputs


@eager_break_during_capture
def fresh_output(x: torch.Tensor) -> torch.Tensor:
    """Returns a tensor allocated inside the break, every call a new one."""
    return x * get_forward_context().attn_metadata["scale"]


@pytest.mark.parametrize("policy", list(BreakOutputs))
def test_copy_break_outputs(policy):
    engine = TinyEngine(brk=fresh_output)
    graph = capture(engine, PIECEWISE, scale=2.0, break_outputs=policy)
    captured_output = graph.output.clone()
    engine.refresh()
    replayed, eager = replay_and_eager(engine, graph, scale=3.0)
    if policy is BreakOutputs.COPY:
        assert torch.equal(replayed, eager)
    else:
        # downstream captured ops read the capture-time break output, a tensor nobody
        # holds after capture: freed memory on a GPU, poisoned here
        assert torch.isnan(replayed).all()
        assert torch.isnan(captured_output).all()  # a capture computes nothing


def test_break_must_return_the_same_structure_every_step():
    x = torch.randn(2, 4)

    @eager_break_during_capture
    def shape_shifter(t):
        if get_forward_context().attn_metadata["pair"]:
            return t * 2, t * 3
        return t * 2

    graph = BreakableGraph(PIECEWISE)
    with set_forward_context({"pair": True}):
        graph.capture(lambda t: shape_shifter(t)[0] + 1, x)
    with set_forward_context({"pair": False}), pytest.raises(RuntimeError, match="returned 1 tensors on replay but 2 at capture"):
        graph.replay()


# ------------------------------------------------------------- re-issued mutations


def test_in_place_and_out_ops_are_reissued_on_replay():
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    static_out = torch.empty(2, 4)
    counter = torch.zeros(1)

    def forward(t):
        y = lin(t)
        y.mul_(2)
        torch.add(y, 1, out=static_out)
        counter.add_(1)  # an in-place write into external state, as in `kv_lens += 1`
        return static_out

    graph = BreakableGraph(FULL)
    out = graph.capture(forward, x)
    assert out is static_out
    kinds = [(c.func._schema.name, c.kind) for c in graph.segments[0].graph._calls]
    assert kinds == [
        ("aten::addmm", ReplayKind.COPY_OUT),
        ("aten::mul_", ReplayKind.REISSUE),
        ("aten::add", ReplayKind.REISSUE),
        ("aten::add_", ReplayKind.REISSUE),
    ]
    assert graph.segments[0].graph._calls[2].func._overloadname == "out"

    assert counter.item() == 0  # as on a GPU, the capture's write did not take effect
    for step in range(1, 3):
        x.copy_(torch.randn(2, 4))
        static_out.zero_()
        graph.replay()
        assert torch.equal(static_out, lin(x) * 2 + 1)
        assert counter.item() == step  # every replay adds once


@pytest.mark.parametrize(
    "forward",
    [
        lambda a, b: sum(torch._foreach_mul([a, b], 2.0)),
        lambda a, b: sum(torch.split_with_sizes_copy(torch.cat([a, b]), [3, 3])),
    ],
    ids=["_foreach_mul", "split_with_sizes_copy"],
)
def test_every_tensor_of_a_list_return_is_refreshed(forward):
    a, b = torch.randn(3), torch.randn(3)
    graph = BreakableGraph(FULL)
    graph.capture(forward, a, b)
    a.copy_(torch.randn(3))
    b.copy_(torch.randn(3))
    assert torch.equal(graph.replay(), forward(a, b))


# ---------------------------------------------------------------------- dispatcher


def test_dispatcher_full_decode_only():
    d = CudagraphDispatcher(CUDAGraphMode.FULL_DECODE_ONLY, [4, 1, 2, 8, 4])
    assert d.capture_sizes == [1, 2, 4, 8]
    assert d.dispatch(3, True) == (FULL, BatchDescriptor(4, True))
    assert d.dispatch(3, False) == (NONE, BatchDescriptor(3, False))
    assert d.capture_descriptors() == [(FULL, BatchDescriptor(s, True)) for s in (8, 4, 2, 1)]


def test_dispatcher_full_and_piecewise():
    d = CudagraphDispatcher(CUDAGraphMode.FULL_AND_PIECEWISE, [1, 2, 4, 8])
    assert d.dispatch(5, True) == (FULL, BatchDescriptor(8, True))
    assert d.dispatch(5, False) == (PIECEWISE, BatchDescriptor(8, False))
    assert d.capture_descriptors()[:2] == [(FULL, BatchDescriptor(8, True)), (PIECEWISE, BatchDescriptor(8, False))]
    assert len(d.capture_descriptors()) == 8


def test_dispatcher_piecewise_drops_the_uniform_flag_and_pads():
    d = CudagraphDispatcher(PIECEWISE, [1, 2, 4, 8])
    assert d.dispatch(4, True) == (PIECEWISE, BatchDescriptor(4, False))
    assert d.dispatch(1, False) == (PIECEWISE, BatchDescriptor(1, False))
    assert [d.padded_size(n) for n in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, None]
    assert d.capture_descriptors() == [(PIECEWISE, BatchDescriptor(s, False)) for s in (8, 4, 2, 1)]


def test_dispatcher_oversize_batch_runs_eagerly():
    d = CudagraphDispatcher(FULL, [1, 2, 4])
    assert d.max_capture_size == 4
    assert d.dispatch(4, True) == (FULL, BatchDescriptor(4, True))
    assert d.dispatch(5, True) == (NONE, BatchDescriptor(5, True))
    assert d.dispatch(17, False) == (NONE, BatchDescriptor(17, False))


def test_dispatcher_none_and_bad_sizes():
    d = CudagraphDispatcher(NONE, [])
    assert d.dispatch(3, True) == (NONE, BatchDescriptor(3, True))
    assert d.capture_descriptors() == []
    with pytest.raises(ValueError, match="capture sizes are empty"):
        CudagraphDispatcher(FULL, [])
    with pytest.raises(ValueError, match="capture sizes must be positive"):
        CudagraphDispatcher(FULL, [0, 2])
