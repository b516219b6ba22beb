"""Small engines for the capture-semantics tests (``tests/test_capture_semantics.py``):
each is a ``Target`` factory, checked with ``capturelint check --target``.

Every engine captures in a warm-up pass before it serves (as vLLM's ``capture_model``
does), because a capture computes nothing: its outputs are poisoned.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from capturelint.runtime.breakable import CUDAGraphWrapper, eager_break_during_capture
from capturelint.runtime.forward_context import BatchDescriptor, CUDAGraphMode, set_forward_context
from capturelint.target import Target

SIZE, DIM = 4, 8


class Served(nn.Module):
    """``lin -> [variant] -> out``; ``serve()`` captures once, then replays per step."""

    def __init__(self, mode: CUDAGraphMode = CUDAGraphMode.PIECEWISE, steps: int = 4):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(DIM, DIM)
        self.out = nn.Linear(DIM, DIM)
        self.mode, self.steps = mode, steps
        self.input = torch.zeros(SIZE, DIM)
        self.wrapper = CUDAGraphWrapper(self)

    def middle(self, h: torch.Tensor, step: int) -> torch.Tensor:
        return h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.middle(self.lin(x), self.step_index))

    step_index = 0

    def prepare(self, step: int) -> None:
        """What a runner does before each step (refresh persistent buffers in place)."""

    def batch(self, step: int) -> torch.Tensor:
        return torch.randn(SIZE, DIM, generator=torch.Generator().manual_seed(step))

    def run(self, graphs: bool) -> list[torch.Tensor]:
        outputs = []
        with torch.no_grad():
            if graphs:  # the capture pass: a dummy step, output discarded
                self.input.zero_()
                self.prepare(-1)
                self.step_index = -1
                with set_forward_context({}, self.mode, BatchDescriptor(SIZE, False)):
                    self.wrapper(self.input)
            for step in range(self.steps):
                self.input.copy_(self.batch(step))
                self.prepare(step)
                self.step_index = step
                mode = self.mode if graphs else CUDAGraphMode.NONE
                with set_forward_context({}, mode, BatchDescriptor(SIZE, False) if graphs else None):
                    outputs.append(self.wrapper(self.input).clone())
        return outputs


def _targets(engine_cls: type, *args) -> list[Target]:
    out = []
    for mode in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL):
        graphs, eager = engine_cls(mode, *args), engine_cls(mode, *args)
        out.append(Target(lambda g=graphs: g.run(True), {"model": graphs}, runner="test", mode=str(mode),
                          eager=lambda e=eager: e.run(False)))
    return out


# ------------------------------------------------ branch on is_current_stream_capturing


class CapturingBranch(Served):
    """Takes a "graph-safe" path when capturing, as vLLM's DSV4 indexer does."""

    def __init__(self, mode: CUDAGraphMode, same_values: bool):
        super().__init__(mode)
        self.same_values = same_values

    def middle(self, h: torch.Tensor, step: int) -> torch.Tensor:
        if torch.cuda.is_current_stream_capturing():
            return h * 2.0
        return h + h if self.same_values else h * 3.0  # an eager-only shortcut


def capturing_branch_same():
    return _targets(CapturingBranch, True)


def capturing_branch_different():
    return _targets(CapturingBranch, False)


# ------------------------------------------------------ a sampler inside a break


class Sampling(Served):
    """An eager break that draws noise from the engine's own generator every step."""

    def __init__(self, mode: CUDAGraphMode):
        super().__init__(mode)
        self.gen = torch.Generator().manual_seed(7)
        self.noise = torch.zeros(SIZE, DIM)

    def middle(self, h: torch.Tensor, step: int) -> torch.Tensor:
        self.sample()
        return h + self.noise

    @eager_break_during_capture
    def sample(self) -> None:
        self.noise.copy_(torch.randn(SIZE, DIM, generator=self.gen))
        self.noise.add_(torch.rand(SIZE, DIM))  # and the global CPU generator


def sampler():
    engine = Sampling(CUDAGraphMode.PIECEWISE)
    return [Target(lambda: engine.run(True), {"model": engine}, runner="test", mode="PIECEWISE")]


# ------------------------------------------- a per-step tensor inside a dataclass


@dataclasses.dataclass
class StepMeta:
    scale: torch.Tensor
    label: str = "meta"


class DataclassArgument(Served):
    def __init__(self, mode: CUDAGraphMode, persistent: bool):
        super().__init__(mode)
        self.persistent = persistent
        self.scale = torch.ones(SIZE, 1)
        self.meta = StepMeta(self.scale)

    def prepare(self, step: int) -> None:
        values = torch.full((SIZE, 1), 1.0 + max(step, 0))
        if self.persistent:
            self.scale.copy_(values)
        else:
            self.meta = StepMeta(values)  # a new tensor in a new object every step

    def middle(self, h: torch.Tensor, step: int) -> torch.Tensor:
        return self.scaled(h, self.meta)

    @eager_break_during_capture
    def scaled(self, h: torch.Tensor, meta: StepMeta) -> torch.Tensor:
        return h * meta.scale


def dataclass_argument(persistent: bool = False):
    engine = DataclassArgument(CUDAGraphMode.PIECEWISE, persistent)
    return [Target(lambda: engine.run(True), {"model": engine}, runner="test", mode="PIECEWISE")]


def dataclass_argument_fixed():
    return dataclass_argument(True)


# ----------------------------------- an input re-allocated with the same values


class SameValues(Served):
    """Re-allocates its input buffer every step, copying the same values."""

    def prepare(self, step: int) -> None:
        if step >= 0:
            self.input = self.input.clone()

    def run(self, graphs: bool) -> list[torch.Tensor]:
        return super().run(graphs)


def same_values():
    return _targets(SameValues)


# ---------------------------- one stale object with many per-step tensors inside


@dataclasses.dataclass
class WideMeta:
    """Attention metadata in small: several per-step tensors in one object."""

    a: torch.Tensor
    b: torch.Tensor
    c: torch.Tensor
    d: torch.Tensor
    e: torch.Tensor
    f: torch.Tensor


class WideArgument(Served):
    """Hands its break a metadata object built anew every step: every tensor inside is
    a stale break argument (CL107), and all of them are one problem, the argument."""

    def __init__(self, mode: CUDAGraphMode):
        super().__init__(mode)
        self.meta = self.made(0)

    @staticmethod
    def made(step: int) -> WideMeta:
        return WideMeta(*(torch.full((SIZE, 1), 1.0 + max(step, 0) + i / 8) for i in range(len(dataclasses.fields(WideMeta)))))

    def prepare(self, step: int) -> None:
        self.meta = self.made(step)  # a new object of new tensors every step

    def middle(self, h: torch.Tensor, step: int) -> torch.Tensor:
        return self.scaled(h, meta=self.meta)

    @eager_break_during_capture
    def scaled(self, h: torch.Tensor, meta: WideMeta) -> torch.Tensor:
        for field in dataclasses.fields(meta):
            h = h * getattr(meta, field.name)
        return h


def wide_argument():
    engine = WideArgument(CUDAGraphMode.PIECEWISE)
    return [Target(lambda: engine.run(True), {"model": engine}, runner="test", mode="PIECEWISE")]
