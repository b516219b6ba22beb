"""A plain PyTorch program that serves a model from a ``torch.cuda.CUDAGraph``.

It is written for a GPU and uses nothing of capturelint: on the first request,
warm-up on a side stream and capture with ``torch.cuda.graph``; then one
``graph.replay()`` per request batch, as PyTorch's CUDA-graph documentation shows. ``capturelint check --target`` runs it
unmodified on a CPU under the emulated ``torch.cuda.CUDAGraph``:

    capturelint check --target examples/torch_cuda_graph.py:targets_stale   # exit 1, CL104
    capturelint check --target examples/torch_cuda_graph.py:targets_fixed   # exit 0

``targets_stale`` hands each batch to the graph by re-binding its static input,
``self.static_x = batch.clone()``: the graph keeps reading the tensor it captured,
which the program has just dropped. On a GPU the caching allocator hands that memory to
the next allocation and the outputs are garbage; capturelint reports CL104 naming
``server.static_x`` and the line that re-allocates it. ``targets_fixed`` refreshes the
static input in place, ``self.static_x.copy_(batch)``, and passes.
"""

from __future__ import annotations

import torch
from torch import nn

from capturelint.target import Target

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BATCH, DIM = 8, 16


class Server:
    """A model captured once into a CUDA graph and replayed for every batch."""

    def __init__(self, refresh_in_place: bool):
        torch.manual_seed(0)
        self.refresh_in_place = refresh_in_place
        self.model = nn.Sequential(nn.Linear(DIM, 32), nn.GELU(), nn.Linear(32, DIM)).to(DEVICE).eval()
        self.static_x = torch.zeros(BATCH, DIM, device=DEVICE)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_y: torch.Tensor | None = None

    def capture(self) -> None:
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):  # warm-up before capture, as PyTorch's docs ask
                    self.model(self.static_x)
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(self.graph):
                self.static_y = self.model(self.static_x)

    def step(self, batch: torch.Tensor) -> torch.Tensor:
        if self.refresh_in_place:
            self.static_x.copy_(batch)
        else:
            self.static_x = batch.clone()  # the graph still reads the tensor it captured
        self.graph.replay()
        return self.static_y.clone()

    def batches(self, steps: int) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(1)
        return [torch.randn(BATCH, DIM, generator=g).to(DEVICE) for _ in range(steps)]

    def serve(self, steps: int = 4) -> list[torch.Tensor]:
        if self.graph is None:
            self.capture()
        with torch.no_grad():
            return [self.step(b) for b in self.batches(steps)]

    def eager(self, steps: int = 4) -> list[torch.Tensor]:
        with torch.no_grad():
            return [self.model(b) for b in self.batches(steps)]


def _targets(refresh_in_place: bool) -> list[Target]:
    server = Server(refresh_in_place)
    return [Target(run=server.serve, roots={"server": server}, eager=server.eager, runner="torch", mode="cudagraph")]


def targets_stale() -> list[Target]:
    """The static input re-allocated between replays: CL104."""
    return _targets(refresh_in_place=False)


def targets_fixed() -> list[Target]:
    """The static input refreshed in place: clean."""
    return _targets(refresh_in_place=True)


if __name__ == "__main__":
    # On a GPU this runs as it is; on a CPU, under capturelint's emulated CUDA graph.
    from capturelint.runtime.emulated import emulate_cuda

    with emulate_cuda():
        for fixed in (False, True):
            server = Server(fixed)
            error = max(float((a - b).abs().max()) for a, b in zip(server.serve(), server.eager()))
            print(f"refresh in place: {fixed}; max replay-vs-eager error: {error:.3g}")
