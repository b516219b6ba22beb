"""A plain PyTorch program that re-binds its graph's static input while the old one lives on.

Written for a GPU, using nothing of capturelint but ``Target``: warm up, capture with
``torch.cuda.graph``, replay once per batch. ``targets_bug`` keeps each step's input
in a debug log and feeds the graph by re-binding the static input,
``self.static_x = batch.clone()``. The first step logs the captured tensor, so it is
never freed (CL104 stays silent) and every replay keeps computing on it: the outputs are
the first batch's, over and over. ``targets_fixed`` refreshes the static input in place.

    capturelint check --target examples/plain/stale_holder.py:targets_bug     # exit 1, CL108
    capturelint check --target examples/plain/stale_holder.py:targets_fixed   # exit 0

CL108 names the holder (``runner.static_x``), the captured op that reads it, the line
that re-binds it and the line that allocated the new tensor.
"""

from __future__ import annotations

import torch
from torch import nn

from capturelint.target import Target

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BATCH, DIM = 4, 8


class Runner:
    """A model captured once and replayed for every batch, with a log of its inputs."""

    def __init__(self, in_place: bool):
        torch.manual_seed(0)
        self.in_place = in_place
        self.model = nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()).to(DEVICE).eval()
        self.static_x = torch.zeros(BATCH, DIM, device=DEVICE)
        self.log: list[torch.Tensor] = []

    @torch.no_grad()
    def capture(self) -> None:
        for _ in range(3):  # warm-up before capture
            self.model(self.static_x)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_y = self.model(self.static_x)

    @torch.no_grad()
    def step(self, batch: torch.Tensor) -> torch.Tensor:
        if self.in_place:
            self.log.append(self.static_x.clone())
            self.static_x.copy_(batch)
        else:
            self.log.append(self.static_x)  # the first step logs the captured tensor: it stays alive
            self.static_x = batch.clone()  # the graph still reads the captured tensor
        self.graph.replay()
        return self.static_y.clone()

    def serve(self, steps: int = 3) -> list[torch.Tensor]:
        self.capture()
        g = torch.Generator().manual_seed(1)
        return [self.step(torch.randn(BATCH, DIM, generator=g).to(DEVICE)) for _ in range(steps)]


def _targets(in_place: bool) -> list[Target]:
    runner = Runner(in_place)
    return [Target(run=runner.serve, runner="plain", mode="cudagraph")]


def targets_bug() -> list[Target]:
    """The static input re-bound while a log keeps the captured one alive: CL108."""
    return _targets(in_place=False)


def targets_fixed() -> list[Target]:
    """The static input refreshed in place: clean."""
    return _targets(in_place=True)
