"""The break probe (``capturelint.adapters.vllm.break_probe``) on small plain-PyTorch
modules whose eager breaks are vLLM's own ``eager_break_during_capture``: a run that
pads its batch (4 rows, 3 real) against an unpadded twin (3 rows), step by step inside
``bridge.real_rows`` as the runner loops run them. A break that branches on the real
count against the rows it is handed is named, with its definition line; one that does
not is not; a divergence that entered before any break names nothing."""

from __future__ import annotations

import torch
from torch import nn

from capturelint.adapters.vllm import bridge
from vllm_required import require_vllm  # tests/vllm/vllm_required.py

REAL = 3


def modules():
    require_vllm()
    from vllm.compilation.breakable_cudagraph import eager_break_during_capture

    class Attention(nn.Module):
        """``forward`` pre-scales in captured code, then its break writes ``out``."""

        def __init__(self, branches: bool, pre: float = 1.0):
            super().__init__()
            self.branches, self.pre = branches, pre

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.shape[0] > REAL:  # the padded run's captured code
                x = x * self.pre
            out = torch.empty_like(x)
            self.attend(x, out)
            return out + 1

        @eager_break_during_capture
        def attend(self, x: torch.Tensor, out: torch.Tensor) -> None:
            self.inner(x, out)

        @eager_break_during_capture
        def inner(self, x: torch.Tensor, out: torch.Tensor) -> None:
            if self.branches and REAL < x.shape[0]:  # a branch on the real count: padded batches only
                out.copy_(x * 0.5)
            else:
                out.copy_(x * 2.0)

    return Attention


def runs(model_graph: nn.Module, model_eager: nn.Module):
    from capturelint.adapters.vllm.break_probe import BreakProbe

    x = torch.arange(12.0).reshape(4, 3)

    def run(model, rows):
        def go():
            outs = []
            for step in range(2):
                with bridge.real_rows(REAL):  # the runner loops step inside it (looked up at call time)
                    outs.append(model(x[:rows] + step)[:REAL])
            return torch.stack(outs)
        return go

    probe = BreakProbe()
    with probe.recording([model_graph, model_eager]):
        graph_out, graph_calls = probe.run(run(model_graph, 4))
        eager_out, eager_calls = probe.run(run(model_eager, REAL))
    return graph_out, eager_out, graph_calls, eager_calls


def test_a_break_branching_on_the_real_count_is_where_the_padded_run_diverges():
    from capturelint.adapters.vllm.break_probe import divergence

    Attention = modules()
    graph_out, eager_out, graph_calls, eager_calls = runs(Attention(True), Attention(True))
    assert not torch.equal(graph_out, eager_out)
    # two steps, each the break and the break it calls; the padded run's tensors have 4 rows
    assert [(c.name.rsplit(".", 1)[-1], c.step, c.depth, c.rows) for c in graph_calls] == [
        ("attend", 0, 0, 4), ("inner", 0, 1, 4), ("attend", 1, 0, 4), ("inner", 1, 1, 4)]
    found = divergence(graph_calls, eager_calls)
    assert found is not None and found.name.endswith("Attention.inner")  # the nested break, not the one around it
    assert (found.step, found.real, found.rows, found.padded) == (0, REAL, 4, True)
    assert found.frame.file.endswith("test_break_probe.py") and found.frame.function == "inner"
    assert found.frame.line == Attention.inner.__wrapped__.__code__.co_firstlineno + 1  # its def, under the decorator


def test_a_break_that_computes_the_real_rows_alike_is_not_named():
    from capturelint.adapters.vllm.break_probe import divergence

    Attention = modules()
    graph_out, eager_out, graph_calls, eager_calls = runs(Attention(False), Attention(False))
    assert torch.equal(graph_out, eager_out)
    assert divergence(graph_calls, eager_calls) is None


def test_a_divergence_entering_before_the_break_names_none():
    """The padded run's captured code scales its input: the break is handed other values
    than the twin's, so it is not where the divergence enters."""
    from capturelint.adapters.vllm.break_probe import divergence

    Attention = modules()
    graph_out, eager_out, graph_calls, eager_calls = runs(Attention(False, pre=3.0), Attention(False, pre=3.0))
    assert not torch.equal(graph_out, eager_out)
    assert divergence(graph_calls, eager_calls) is None


def test_the_probe_puts_everything_back():
    from vllm.compilation import breakable_cudagraph as bc

    Attention = modules()
    before = (Attention.attend, Attention.inner, bc.BreakableCUDAGraphCapture.add_eager, bridge.real_rows)
    runs(Attention(True), Attention(True))
    assert (Attention.attend, Attention.inner, bc.BreakableCUDAGraphCapture.add_eager, bridge.real_rows) == before
