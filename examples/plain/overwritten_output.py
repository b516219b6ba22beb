"""A plain PyTorch program that keeps views of its graph's output across replays.

Written for a GPU: warm up, capture once, then per batch refresh the static input in
place and replay. The runner returns the rows of the output that the batch fills,
``self.static_y[:n]``, as serving runners do. ``targets_bug`` collects those views and
stacks them at the end: each is a view of graph memory that the next replay rewrites,
so every entry holds the last batch's values. ``targets_fixed`` copies the rows right
after the replay, ``self.static_y[:n].clone()``.

    capturelint check --target examples/plain/overwritten_output.py:targets_bug     # exit 1, CL109
    capturelint check --target examples/plain/overwritten_output.py:targets_fixed   # exit 0

CL109 names the op that reads the stale view (``torch.stack``), the line that took the
view, and the replay that overwrote it.
"""

from __future__ import annotations

import torch
from torch import nn

from capturelint.target import Target

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MAX_BATCH, DIM = 8, 8


class Runner:
    """A model captured at the largest batch size; smaller batches use the first rows."""

    def __init__(self, copy_out: bool):
        torch.manual_seed(0)
        self.copy_out = copy_out
        self.model = nn.Sequential(nn.Linear(DIM, DIM), nn.ReLU()).to(DEVICE).eval()
        self.static_x = torch.zeros(MAX_BATCH, DIM, device=DEVICE)

    @torch.no_grad()
    def capture(self) -> None:
        for _ in range(3):  # warm-up before capture
            self.model(self.static_x)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_y = self.model(self.static_x)

    @torch.no_grad()
    def run(self, batch: torch.Tensor) -> torch.Tensor:
        n = batch.shape[0]
        self.static_x[:n].copy_(batch)
        self.graph.replay()
        if self.copy_out:
            return self.static_y[:n].clone()
        return self.static_y[:n]  # a view of graph memory: the next replay rewrites it

    def serve(self, steps: int = 3) -> torch.Tensor:
        self.capture()
        g = torch.Generator().manual_seed(1)
        outs = [self.run(torch.randn(MAX_BATCH // 2, DIM, generator=g).to(DEVICE)) for _ in range(steps)]
        return torch.stack(outs)


def _targets(copy_out: bool) -> list[Target]:
    runner = Runner(copy_out)
    return [Target(run=runner.serve, runner="plain", mode="cudagraph")]


def targets_bug() -> list[Target]:
    """Views of the graph's output kept across replays and stacked later: CL109."""
    return _targets(copy_out=False)


def targets_fixed() -> list[Target]:
    """The rows copied right after each replay: clean."""
    return _targets(copy_out=True)
