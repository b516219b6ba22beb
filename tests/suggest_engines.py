"""A small engine for ``capturelint suggest`` (``tests/test_suggest.py``): two
independent branches on the forward context, in two functions, both baked into the
graph when the capture runs without metadata (as V1's PIECEWISE capture does).

Making ``block`` an eager break fixes both, at the price of every op between them;
``first`` and ``second`` as two breaks fix both with fewer eager ops per step.
"""

from __future__ import annotations

import torch
from torch import nn

from capturelint.runtime.breakable import CUDAGraphWrapper
from capturelint.runtime.forward_context import BatchDescriptor, CUDAGraphMode, get_forward_context, set_forward_context
from capturelint.target import Target

SIZE, DIM = 4, 8


class TwoBranches(nn.Module):
    def __init__(self, steps: int = 3):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(DIM, DIM)
        self.mid = nn.Linear(DIM, DIM)
        self.out = nn.Linear(DIM, DIM)
        self.steps = steps
        self.input = torch.zeros(SIZE, DIM)
        self.shift = torch.zeros(SIZE, DIM)  # persistent metadata buffers, refreshed in place
        self.scale = torch.ones(SIZE, DIM)
        self.wrapper = CUDAGraphWrapper(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.block(self.lin(x)))

    def block(self, h: torch.Tensor) -> torch.Tensor:
        h = self.first(h)
        h = torch.tanh(self.mid(h)) * 0.5 + h
        return self.second(h)

    def first(self, h: torch.Tensor) -> torch.Tensor:
        md = get_forward_context().attn_metadata
        if md is None:  # a dummy run: baked into the graph
            return h * 0.0
        return h + md["shift"]

    def second(self, h: torch.Tensor) -> torch.Tensor:
        md = get_forward_context().attn_metadata
        if md is None:
            return h - 1.0
        return h * md["scale"]

    def run(self) -> list[torch.Tensor]:
        outputs = []
        with torch.no_grad():
            desc = BatchDescriptor(SIZE, False)
            with set_forward_context(None, CUDAGraphMode.PIECEWISE, desc):  # the capture: no metadata
                self.wrapper(self.input)
            for step in range(self.steps):
                g = torch.Generator().manual_seed(step)
                self.input.copy_(torch.randn(SIZE, DIM, generator=g))
                self.shift.copy_(torch.randn(SIZE, DIM, generator=g))
                self.scale.copy_(torch.rand(SIZE, DIM, generator=g) + 0.5)
                with set_forward_context({"shift": self.shift, "scale": self.scale}, CUDAGraphMode.PIECEWISE, desc):
                    outputs.append(self.wrapper(self.input).clone())
        return outputs


def targets():
    engine = TwoBranches()
    return [Target(engine.run, {"engine": engine}, runner="two", mode="PIECEWISE")]
