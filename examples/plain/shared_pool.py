"""Two CUDA graphs that share a memory pool, replayed out of capture order (CL111).

A plain PyTorch program written for a GPU: a small model served at two batch sizes,
each from its own ``torch.cuda.CUDAGraph``. To save memory the small graph is captured
into the large graph's pool (``pool=g_large.pool()``), as PyTorch's "Sharing memory
across captures" shows. PyTorch's caching allocator hands the small capture the blocks
the large capture freed (its intermediates), but the large graph's replays still write
them. Each step replays the small graph first and reads its output after the large
graph replayed, out of capture order:

    capturelint check --target examples/plain/shared_pool.py:targets_bug     # exit 1, CL111
    capturelint check --target examples/plain/shared_pool.py:targets_fixed   # exit 0

``targets_bug`` concatenates ``server.y_small`` after ``g_large.replay()``: the
emulated pool placed ``y_small`` in a block of the large graph's first ``Linear``
output, so the large replay overwrote it, and capturelint reports CL111 naming
``server.y_small``, both graphs, the replay line and the read. ``targets_fixed``
consumes (clones) the small graph's output before the large graph replays.
"""

from __future__ import annotations

import torch
from torch import nn

from capturelint.target import Target

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DIM, SMALL, LARGE = 16, 2, 8


class Server:
    """One model, one graph per batch size, both graphs in one memory pool."""

    def __init__(self, consume_early: bool):
        torch.manual_seed(0)
        self.consume_early = consume_early
        self.model = nn.Sequential(nn.Linear(DIM, 32), nn.GELU(), nn.Linear(32, DIM)).to(DEVICE).eval()
        self.x_small = torch.zeros(SMALL, DIM, device=DEVICE)
        self.x_large = torch.zeros(LARGE, DIM, device=DEVICE)
        self.g_small: torch.cuda.CUDAGraph | None = None
        self.g_large: torch.cuda.CUDAGraph | None = None

    def capture(self) -> None:
        self.g_large, self.g_small = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.no_grad():
            for x in (self.x_large, self.x_small):  # warm-up before capture
                self.model(x)
            with torch.cuda.graph(self.g_large):
                self.y_large = self.model(self.x_large)
            with torch.cuda.graph(self.g_small, pool=self.g_large.pool()):  # share the large graph's pool
                self.y_small = self.model(self.x_small)

    def step(self, small: torch.Tensor, large: torch.Tensor) -> torch.Tensor:
        self.x_small.copy_(small)
        self.g_small.replay()
        y_small = self.y_small.clone() if self.consume_early else self.y_small
        self.x_large.copy_(large)
        self.g_large.replay()  # rewrites the blocks its capture freed, where y_small lives
        return torch.cat([y_small, self.y_large])

    def serve(self, steps: int = 3) -> list[torch.Tensor]:
        if self.g_large is None:
            self.capture()
        g = torch.Generator().manual_seed(1)
        batches = [(torch.randn(SMALL, DIM, generator=g), torch.randn(LARGE, DIM, generator=g)) for _ in range(steps)]
        with torch.no_grad():
            return [self.step(s.to(DEVICE), b.to(DEVICE)) for s, b in batches]


def _targets(consume_early: bool) -> list[Target]:
    server = Server(consume_early)
    return [Target(run=server.serve, roots={"server": server}, runner="torch", mode="cudagraph")]


def targets_bug() -> list[Target]:
    """The small graph's output read after the large graph replayed: CL111."""
    return _targets(consume_early=False)


def targets_fixed() -> list[Target]:
    """Each output consumed before another graph of the pool replays: clean."""
    return _targets(consume_early=True)
