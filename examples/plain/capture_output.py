"""A plain PyTorch program that captures lazily and returns the capture's "result".

Written for a GPU: the first call of ``step`` captures the model into a CUDA graph,
later calls replay it. ``targets_bug`` returns the output of the capturing call as the
first step's result; but a capture records kernels without running them, so on a GPU
that output is uninitialised memory (here the emulator fills it with NaN).
``targets_fixed`` replays the graph right after capturing it and returns the replay's
output.

    capturelint check --target examples/plain/capture_output.py:targets_bug     # exit 1, CL110
    capturelint check --target examples/plain/capture_output.py:targets_fixed   # exit 0

CL110 names the op that reads the capture's output, the captured op that produced it
and the line that read it.
"""

from __future__ import annotations

import torch
from torch import nn

from capturelint.target import Target

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BATCH, DIM = 4, 8


class LazyRunner:
    """Captures on its first step, replays on the others."""

    def __init__(self, replay_after_capture: bool):
        torch.manual_seed(0)
        self.replay_after_capture = replay_after_capture
        self.model = nn.Sequential(nn.Linear(DIM, DIM), nn.GELU()).to(DEVICE).eval()
        self.static_x = torch.zeros(BATCH, DIM, device=DEVICE)
        self.graph: torch.cuda.CUDAGraph | None = None

    @torch.no_grad()
    def step(self, batch: torch.Tensor) -> torch.Tensor:
        self.static_x.copy_(batch)
        if self.graph is None:
            for _ in range(3):  # warm-up before capture
                self.model(self.static_x)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.static_y = self.model(self.static_x)
            if not self.replay_after_capture:
                return self.static_y.clone()  # the capture ran no kernel: uninitialised memory
        self.graph.replay()
        return self.static_y.clone()

    def serve(self, steps: int = 3) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(1)
        return [self.step(torch.randn(BATCH, DIM, generator=g).to(DEVICE)) for _ in range(steps)]


def _targets(replay_after_capture: bool) -> list[Target]:
    runner = LazyRunner(replay_after_capture)
    return [Target(run=runner.serve, runner="plain", mode="cudagraph")]


def targets_bug() -> list[Target]:
    """The capturing call's output returned as a result: CL110."""
    return _targets(replay_after_capture=False)


def targets_fixed() -> list[Target]:
    """A replay right after the capture: clean."""
    return _targets(replay_after_capture=True)
