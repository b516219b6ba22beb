"""The bare emulated CUDA-graph primitive (capturelint/runtime/cudagraph.py, installed
by capturelint/runtime/emulated.py): the ``torch.cuda.CUDAGraph`` surface on a CPU,
with a GPU's capture semantics, and its installation into ``torch.cuda``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from capturelint.runtime import protocol
from capturelint.runtime.emulated import (
    EmulatedCUDAGraph,
    emulate_cuda,
    graph,
    graph_pool_handle,
    is_current_stream_capturing,
    make_graphed_callables,
)
from capturelint.runtime.protocol import (
    CaptureObserver,
    Frame,
    GraphInfo,
    HostSyncInCaptureError,
    Phase,
    StaleInputEvent,
    observing,
    stream_capturing,
)

_HERE = Path(__file__).resolve()
THIS_FILE = _HERE.relative_to(_HERE.parents[2]).as_posix()

SURFACE = (
    "CUDAGraph",
    "graph",
    "graph_pool_handle",
    "make_graphed_callables",
    "is_current_stream_capturing",
    "Stream",
    "Event",
    "stream",
    "current_stream",
    "default_stream",
    "set_stream",
    "synchronize",
)


def line_of(marker: str) -> int:
    lines = _HERE.read_text(encoding="utf-8").splitlines()
    (line,) = [i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# {marker}")]
    return line


@pytest.fixture(autouse=True)
def _inference_and_clean_state():
    observers = list(protocol._observers)
    cuda_surface = {name: getattr(torch.cuda, name, None) for name in SURFACE}
    with torch.random.fork_rng():
        torch.manual_seed(4321)
        with torch.no_grad():
            yield
    assert not stream_capturing()
    assert protocol._observers == observers
    assert torch._C._len_torch_dispatch_stack() == 0
    assert torch._C._len_torch_function_stack() == 0
    assert {name: getattr(torch.cuda, name, None) for name in SURFACE} == cuda_surface


class Recorder(CaptureObserver):
    def __init__(self) -> None:
        self.graphs: list[tuple[str, GraphInfo, Phase]] = []
        self.stale: list[StaleInputEvent] = []

    def on_graph_begin(self, graph: GraphInfo, phase: Phase) -> None:
        self.graphs.append(("begin", graph, phase))

    def on_graph_end(self, graph: GraphInfo, phase: Phase, output: Any) -> None:
        self.graphs.append(("end", graph, phase))

    def on_stale_input(self, event: StaleInputEvent) -> None:
        self.stale.append(event)


# ================================================================ the primitive


def test_bare_graph_capture_replay_reset():
    x = torch.arange(4.0)
    static_out = torch.zeros(4)
    g = EmulatedCUDAGraph()
    pool = graph_pool_handle()

    assert not is_current_stream_capturing()
    g.capture_begin(pool=pool)
    try:
        assert is_current_stream_capturing()
        y = x * 2
        torch.add(y, 1, out=static_out)
        copy_during_capture = static_out.clone()
    finally:
        g.capture_end()
    assert not is_current_stream_capturing()
    assert g.pool() == pool

    # nothing computed: the new tensors are poisoned, the pre-existing buffer untouched
    assert torch.isnan(y).all() and torch.isnan(copy_during_capture).all()
    assert torch.equal(static_out, torch.zeros(4))

    for values in ([1.0, 2.0, 3.0, 4.0], [-1.0, 0.5, 0.0, 7.0]):
        x.copy_(torch.tensor(values))
        g.replay()
        assert torch.equal(y, x * 2)
        assert torch.equal(static_out, x * 2 + 1)

    g.reset()
    with pytest.raises(RuntimeError, match="before a capture"):
        g.replay()
    # a reset graph captures again
    g.capture_begin()
    z = x - 3
    g.capture_end()
    g.replay()
    assert torch.equal(z, x - 3)


def test_bare_graph_refuses_out_of_order_calls():
    g = EmulatedCUDAGraph()
    with pytest.raises(RuntimeError, match="before a capture"):
        g.replay()
    with pytest.raises(RuntimeError, match="without capture_begin"):
        g.capture_end()
    g.capture_begin()
    try:
        with pytest.raises(RuntimeError):
            g.capture_begin()  # already capturing
        with pytest.raises(RuntimeError):
            g.replay()  # during its own capture
        assert is_current_stream_capturing()
    finally:
        g.capture_end()
    assert not is_current_stream_capturing()
    with pytest.raises(RuntimeError, match="without capture_begin"):
        g.capture_end()  # ending twice


def test_pool_handles_are_distinct_and_shareable():
    a, b = graph_pool_handle(), graph_pool_handle()
    assert a != b
    x = torch.ones(3)
    g1, g2 = EmulatedCUDAGraph(), EmulatedCUDAGraph()
    with graph(g1, pool=a):
        first = x + 1
    with graph(g2, pool=g1.pool()):  # share the first graph's pool
        second = first * 3
    assert g1.pool() == a and g2.pool() == a
    g1.replay()
    g2.replay()
    assert torch.equal(second, (x + 1) * 3)


def test_graph_context_manager_captures_and_reports_to_observers():
    static_in = torch.randn(5)
    recorder = Recorder()
    g = EmulatedCUDAGraph()
    with observing(recorder):
        with graph(g):
            assert is_current_stream_capturing()
            out = static_in.sin() + 1
        assert not is_current_stream_capturing()
        assert torch.isnan(out).all()
        static_in.copy_(torch.randn(5))
        g.replay()
    assert torch.equal(out, static_in.sin() + 1)
    assert [(kind, phase) for kind, _, phase in recorder.graphs] == [
        ("begin", Phase.CAPTURE),
        ("end", Phase.CAPTURE),
        ("begin", Phase.REPLAY),
        ("end", Phase.REPLAY),
    ]
    info = recorder.graphs[0][1]
    assert all(g_info is info or g_info == info for _, g_info, _ in recorder.graphs)
    assert info.segmented is False and info.breaks_eager is False


def test_poison_values_by_dtype_in_a_bare_capture():
    x = torch.tensor([1.5, -2.0])
    g = EmulatedCUDAGraph()
    with graph(g):
        f = x * 2
        i = x.long() + 9
        b = x > 100
    assert torch.isnan(f).all()
    assert torch.equal(i, torch.zeros(2, dtype=torch.long))
    assert torch.equal(b, torch.tensor([True, True]))
    g.replay()
    assert torch.equal(f, x * 2) and torch.equal(i, x.long() + 9) and torch.equal(b, torch.tensor([False, False]))


def test_host_sync_in_a_bare_capture_raises_and_ends_the_capture():
    x = torch.randn(3)
    g = EmulatedCUDAGraph()
    with pytest.raises(HostSyncInCaptureError) as info:
        with graph(g):
            n = int(x.sum() > 0)  # host-sync: bare
    assert not is_current_stream_capturing()
    event = info.value.event
    assert "_local_scalar_dense" in event.op
    assert event.frame == Frame(THIS_FILE, line_of("host-sync: bare"), "test_host_sync_in_a_bare_capture_raises_and_ends_the_capture")
    assert event.graph is None and event.segment == 0  # a bare primitive knows no segments


# ============================================================ freed inputs (bare graph)


def test_bare_graph_poisons_an_input_the_program_dropped():
    holder = SimpleNamespace(static=torch.randn(3))
    g = EmulatedCUDAGraph()
    with graph(g):
        out = holder.static * 2
    g.replay()
    assert torch.equal(out, holder.static * 2)

    old_storage = holder.static.untyped_storage()._cdata
    holder.static = holder.static.clone()  # equal values, new memory; the old memory is dropped
    recorder = Recorder()
    with observing(recorder):
        g.replay()
        g.replay()
    assert torch.isnan(out).all()
    (event,) = recorder.stale
    assert event.storage == old_storage and event.segment == 0 and event.dtype == "float32"
    assert event.graph.segmented is False


def test_bare_graph_input_refreshed_in_place_is_not_poisoned():
    holder = SimpleNamespace(static=torch.randn(3))
    g = EmulatedCUDAGraph()
    with graph(g):
        out = holder.static * 2
    recorder = Recorder()
    with observing(recorder):
        for _ in range(3):
            holder.static.copy_(torch.randn(3))
            g.replay()
            assert torch.equal(out, holder.static * 2)
    assert recorder.stale == []


# ================================================================ emulate_cuda


def test_emulate_cuda_installs_the_surface_and_restores_it():
    originals = {name: getattr(torch.cuda, name, None) for name in SURFACE}
    import torch.cuda.graphs as graphs_module

    graphs_originals = {name: getattr(graphs_module, name, None) for name in ("CUDAGraph", "graph", "graph_pool_handle")}

    x = torch.randn(4)
    with emulate_cuda(force=True) as on:
        assert on is True
        assert torch.cuda.CUDAGraph is EmulatedCUDAGraph
        assert graphs_module.CUDAGraph is EmulatedCUDAGraph

        # GPU-style code, unmodified: side stream warm-up, then capture and replay
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            assert torch.cuda.current_stream() is side
            for _ in range(2):
                x * 3
        torch.cuda.current_stream().wait_stream(side)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream())
        done.synchronize()
        torch.cuda.synchronize()

        g = torch.cuda.CUDAGraph()
        assert isinstance(g, EmulatedCUDAGraph)
        assert not torch.cuda.is_current_stream_capturing()
        with torch.cuda.graph(g, pool=torch.cuda.graph_pool_handle()):
            assert torch.cuda.is_current_stream_capturing()
            out = x * 3
        assert not torch.cuda.is_current_stream_capturing()
        x.copy_(torch.randn(4))
        g.replay()
        assert torch.equal(out, x * 3)

        lin = nn.Linear(4, 2)
        graphed = torch.cuda.make_graphed_callables(lin, (torch.randn(3, 4),))
        new = torch.randn(3, 4)
        assert torch.equal(graphed(new), lin(new))

    assert {name: getattr(torch.cuda, name, None) for name in SURFACE} == originals
    assert {name: getattr(graphs_module, name, None) for name in graphs_originals} == graphs_originals
    assert torch.cuda.CUDAGraph is not EmulatedCUDAGraph


def test_emulate_cuda_restores_the_surface_after_an_error():
    originals = {name: getattr(torch.cuda, name, None) for name in SURFACE}
    with pytest.raises(KeyError):
        with emulate_cuda(force=True):
            assert torch.cuda.graph is graph
            raise KeyError("x")
    assert {name: getattr(torch.cuda, name, None) for name in SURFACE} == originals


# ======================================================= make_graphed_callables


class Counted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.net(x)


def test_make_graphed_callables_matches_the_eager_module():
    module = Counted()
    sample = torch.randn(3, 8)
    graphed = make_graphed_callables(module, (sample,))
    runs_at_build = module.calls
    assert runs_at_build == 4  # three warm-up runs and the capture

    outputs = []
    for _ in range(3):
        x = torch.randn(3, 8)
        y = graphed(x)
        assert torch.equal(y, module.net(x))
        outputs.append(y)
    assert module.calls == runs_at_build  # replays run no Python
    assert outputs[0] is outputs[1] is outputs[2]  # the static output, refreshed each call


def test_make_graphed_callables_on_a_tuple_with_a_shared_pool():
    first, second = nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 2), nn.Tanh())
    pool = graph_pool_handle()
    a, b = make_graphed_callables((first, second), ((torch.randn(2, 4),), (torch.randn(2, 4),)), pool=pool)
    x = torch.randn(2, 4)
    assert torch.equal(a(x), first(x))
    assert torch.equal(b(x), second(x))


def test_make_graphed_callables_in_training_replays_forward_and_backward_graphs():
    torch.manual_seed(0)
    module, twin = nn.Linear(4, 3), nn.Linear(4, 3)
    twin.load_state_dict(module.state_dict())
    x = torch.randn(2, 4, requires_grad=True)
    with torch.enable_grad():
        graphed = make_graphed_callables(module, (x,))
        for _ in range(2):
            module.zero_grad(set_to_none=True)
            twin.zero_grad(set_to_none=True)
            a = torch.randn(2, 4, requires_grad=True)
            b = a.detach().clone().requires_grad_()
            graphed(a).pow(2).sum().backward()
            twin(b).pow(2).sum().backward()
            assert torch.equal(a.grad, b.grad)
            assert torch.equal(module.weight.grad, twin.weight.grad) and torch.equal(module.bias.grad, twin.bias.grad)
        # As in PyTorch (pytorch/pytorch#181723): a .grad that autograd took from the
        # backward graph's static gradient is that graph's memory, so the next replay
        # overwrites it before accumulating into it: twice the second step's gradient.
        module.zero_grad(set_to_none=True)
        graphed(torch.randn(2, 4)).pow(2).sum().backward()
        graphed(second := torch.randn(2, 4)).pow(2).sum().backward()
        twin.zero_grad(set_to_none=True)
        twin(second).pow(2).sum().backward()
        assert torch.allclose(module.weight.grad, 2 * twin.weight.grad)
