"""Engines whose eager breaks keep host state, for ``tests/test_shadow_host_state.py``:
a counter advanced on every call of a break, as vLLM's FlashMLA backend plans its
per-step scheduling object inside the break."""

from __future__ import annotations

import torch

from capture_engines import SIZE, DIM, Sampling, Served, Target
from capturelint.runtime.breakable import eager_break_during_capture
from capturelint.runtime.forward_context import CUDAGraphMode

ENGINES: list["Counting"] = []  # every engine the factories made, to read back after a check


class Counting(Served):
    """A break advances ``calls`` and writes it into ``stamp``, which the graph adds."""

    def __init__(self, mode: CUDAGraphMode = CUDAGraphMode.PIECEWISE):
        super().__init__(mode)
        self.calls = 0
        self.stamp = torch.zeros(SIZE, DIM)
        self.outputs: list[torch.Tensor] = []

    def middle(self, h: torch.Tensor, step: int) -> torch.Tensor:
        self.tick()
        return h + self.stamp

    @eager_break_during_capture
    def tick(self) -> None:
        self.calls += 1
        self.stamp.fill_(float(self.calls))

    def run(self, graphs: bool) -> list[torch.Tensor]:
        self.outputs = super().run(graphs)
        return self.outputs


class Rebinding(Counting):
    """Host state that makes the replay differ: the break binds a new stamp tensor per
    call, and the captured segment after it keeps reading the one bound at capture."""

    def __init__(self, mode: CUDAGraphMode = CUDAGraphMode.PIECEWISE):
        super().__init__(mode)
        self.kept: list[torch.Tensor] = []  # every stamp stays alive: the replay reads a stale one, not freed memory

    @eager_break_during_capture
    def tick(self) -> None:
        self.calls += 1
        self.kept.append(self.stamp)
        self.stamp = torch.full((SIZE, DIM), float(self.calls))


def _target(cls: type) -> list[Target]:
    graphs, eager = cls(), cls()
    eager.calls = 1  # the twin makes no capture pass, whose call of the break the graph run counts
    ENGINES[:] = [graphs, eager]
    return [Target(lambda: graphs.run(True), {"model": graphs}, runner="test", mode="PIECEWISE",
                   eager=lambda: eager.run(False))]


class Drawing(Sampling):
    """A break that draws from the engine's generator and the global one (host state
    the shadow rewinds): the draws continue across steps as in an untraced run."""

    def run(self, graphs: bool) -> list[torch.Tensor]:
        self.outputs = super().run(graphs)
        return self.outputs


def drawing():
    engine = Drawing(CUDAGraphMode.PIECEWISE)
    ENGINES[:] = [engine]
    return [Target(lambda: engine.run(True), {"model": engine}, runner="test", mode="PIECEWISE")]


def counting():
    return _target(Counting)


def rebinding():
    return _target(Rebinding)
