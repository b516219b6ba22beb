"""The runner: captures the model's forward once into a CUDA graph, then serves every
batch by replaying it.

A CUDA graph reads the addresses it captured. The captured input, ``static_x``, must
therefore be refreshed in place before each replay. A refactor that re-binds it
(``self.static_x = ...``) makes the graph read the old tensor, freed memory on a GPU,
and the outputs go wrong without an error. capturelint points at that line (CL104).
"""

import torch

from myserve.model import TinyModel

DEVICE = "cuda"


class GraphRunner:
    def __init__(self, batch: int = 2, dim: int = 8):
        torch.manual_seed(0)
        self.model = TinyModel(dim).to(DEVICE).eval()
        self.static_x = torch.zeros(batch, dim, device=DEVICE)
        self.graph: torch.cuda.CUDAGraph | None = None

    @torch.no_grad()
    def capture(self) -> None:
        self.model(self.static_x)  # warm up before the capture
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_y = self.model(self.static_x)

    @torch.no_grad()
    def serve(self, batches: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.graph is None:
            self.capture()
        outputs = []
        for x in batches:
            self.static_x = x.to(DEVICE)
            self.graph.replay()
            outputs.append(self.static_y.clone())
        return outputs

    @torch.no_grad()
    def serve_eager(self, batches: list[torch.Tensor]) -> list[torch.Tensor]:
        """The same work without the graph: what replay must compute."""
        return [self.model(x.to(DEVICE)) for x in batches]
