"""A plain PyTorch program whose captured forward stores its hidden state on the model.

Written for a GPU: a small recurrent cell is captured once into a CUDA graph and
replayed for every step of a sequence. Its ``forward`` keeps the step's hidden state as
an attribute (``self.hidden = h``), as eager code often does. ``targets_bug`` resets that
attribute at the start of each sequence (``cell.hidden = torch.zeros(...)``) and logs it
after each step; but a replay runs the captured kernels, not the Python: the assignment
in ``forward`` ran once, at capture, so no replay stores anything on ``cell.hidden`` again,
the graph keeps writing the capture's tensor, and the log holds the reset zeros
(PyTorch issue #114844). ``targets_fixed`` resets the captured tensor in place
(``cell.hidden.zero_()``), so the log reads what each replay wrote.

    capturelint check --target examples/plain/host_state.py:targets_bug     # exit 1, CL116
    capturelint check --target examples/plain/host_state.py:targets_fixed   # exit 0

CL116 names the attribute, the line in ``forward`` that stored it inside the capture and
the line that re-bound it after.
"""

from __future__ import annotations

import torch
from torch import nn

from capturelint.target import Target

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BATCH, DIM = 4, 8


class Cell(nn.Module):
    """A step of a recurrent model that keeps its hidden state on itself."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(DIM, DIM)
        self.hidden: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.lin(x))
        self.hidden = h  # the step's state, kept for the caller
        return h * 2


class Runner:
    """The cell captured once and replayed for every step, with a log of its state."""

    def __init__(self, in_place: bool):
        torch.manual_seed(0)
        self.in_place = in_place
        self.cell = Cell().to(DEVICE).eval()
        self.static_x = torch.zeros(BATCH, DIM, device=DEVICE)
        self.log: list[torch.Tensor] = []

    @torch.no_grad()
    def capture(self) -> None:
        for _ in range(3):  # warm-up before capture
            self.cell(self.static_x)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_y = self.cell(self.static_x)

    @torch.no_grad()
    def step(self, batch: torch.Tensor) -> torch.Tensor:
        if self.in_place:
            self.cell.hidden.zero_()
        else:
            self.cell.hidden = torch.zeros(BATCH, DIM, device=DEVICE)  # a fresh state per step
        self.static_x.copy_(batch)
        self.graph.replay()
        self.log.append(self.cell.hidden.clone())
        return self.static_y.clone()

    def serve(self, steps: int = 3) -> list[torch.Tensor]:
        self.capture()
        g = torch.Generator().manual_seed(1)
        return [self.step(torch.randn(BATCH, DIM, generator=g).to(DEVICE)) for _ in range(steps)]


def _targets(in_place: bool) -> list[Target]:
    runner = Runner(in_place)
    return [Target(run=runner.serve, runner="plain", mode="cudagraph")]


def targets_bug() -> list[Target]:
    """The captured state re-bound each step: CL116."""
    return _targets(in_place=False)


def targets_fixed() -> list[Target]:
    """The captured state reset in place: clean."""
    return _targets(in_place=True)
