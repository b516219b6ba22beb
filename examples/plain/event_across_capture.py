"""A side stream forked inside a CUDA-graph capture and joined outside it (CL112).

A plain PyTorch program written for a GPU: a mixture-of-experts block runs its shared
expert on a side stream, overlapped with the routed experts, and signals the side
stream's completion with an event. Eagerly it is correct either way; the buggy version
leaves the join to the caller (``current_stream().wait_event(block.shared_done)`` after
the forward), which, once the forward is captured with ``torch.cuda.graph``, happens
after the capture ended. A capture cannot end with a forked stream not joined back:
``cudaStreamEndCapture`` fails with ``cudaErrorStreamCaptureUnjoined`` on a GPU, and the
emulated capture fails the same way:

    capturelint check --target examples/plain/event_across_capture.py:targets_bug     # exit 1, CL112
    capturelint check --target examples/plain/event_across_capture.py:targets_fixed   # exit 0

``targets_bug`` reports CL112 with the line that forked the side stream and the line
where the capture ended; ``targets_fixed`` joins the side stream inside the forward
(``current_stream().wait_event(self.shared_done)``) and passes.
"""

from __future__ import annotations

import torch
from torch import nn

from capturelint.target import Target

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOKENS, DIM = 4, 16


class MoEBlock(nn.Module):
    """Routed experts on the current stream, the shared expert on a side stream."""

    def __init__(self, join_inside: bool):
        super().__init__()
        self.join_inside = join_inside
        self.routed = nn.Linear(DIM, DIM)
        self.shared = nn.Linear(DIM, DIM)
        self.side = torch.cuda.Stream()
        self.shared_done = torch.cuda.Event()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.side.wait_stream(torch.cuda.current_stream())  # fork: the side stream sees x
        with torch.cuda.stream(self.side):
            shared = self.shared(x)
            self.shared_done.record()
        routed = self.routed(x)
        if self.join_inside:
            torch.cuda.current_stream().wait_event(self.shared_done)  # join before the forward returns
        return routed, shared


class Runner:
    def __init__(self, join_inside: bool):
        torch.manual_seed(0)
        self.block = MoEBlock(join_inside).to(DEVICE).eval()
        self.static_x = torch.zeros(TOKENS, DIM, device=DEVICE)
        self.graph: torch.cuda.CUDAGraph | None = None

    def join(self) -> None:
        if not self.block.join_inside:
            torch.cuda.current_stream().wait_event(self.block.shared_done)  # the caller joins, after the forward

    def capture(self) -> None:
        self.block(self.static_x)  # warm-up
        self.join()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.routed, self.shared = self.block(self.static_x)
        self.join()

    def serve(self, steps: int = 3) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            if self.graph is None:
                self.capture()
            outs = []
            for _ in range(steps):
                self.static_x.copy_(torch.randn(TOKENS, DIM, generator=g).to(DEVICE))
                self.graph.replay()
                self.join()
                outs.append(self.routed + self.shared)
            return outs


def _targets(join_inside: bool) -> list[Target]:
    runner = Runner(join_inside)
    return [Target(run=runner.serve, roots={"runner": runner}, runner="torch", mode="cudagraph")]


def targets_bug() -> list[Target]:
    """The side stream joined by the caller, after the capture ended: CL112."""
    return _targets(join_inside=False)


def targets_fixed() -> list[Target]:
    """The side stream joined inside the captured forward: clean."""
    return _targets(join_inside=True)
