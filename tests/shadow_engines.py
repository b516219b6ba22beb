"""Engines whose eager breaks keep host state, for ``tests/test_shadow_host_state.py``:
a counter advanced on every call of a break, as vLLM's FlashMLA backend plans its
per-step scheduling object inside the break."""

from __future__ import annotations

import dataclasses

import torch

from capture_engines import SIZE, DIM, Sampling, Served, Target
from capturelint.runtime.breakable import CUDAGraphWrapper, eager_break_during_capture
from capturelint.runtime.forward_context import CUDAGraphMode
from capturelint.runtime.protocol import BreakOutputs

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


class Windowed(Served):
    """A break hands back a view of a buffer the engine keeps (as DeepSeek V4's layers
    each view one shared KV buffer), and the captured code after the break accumulates
    into it: a storage the step did not make, reached first through a view an op inside
    the break took. The runtime discards break outputs, as vLLM 0.33.0's does (copied
    back, the break's value of the view would overwrite the captured write)."""

    def __init__(self, mode: CUDAGraphMode = CUDAGraphMode.PIECEWISE):
        super().__init__(mode)
        self.wrapper = CUDAGraphWrapper(self, break_outputs=BreakOutputs.DISCARD)
        self.cache = torch.zeros(2 * SIZE, DIM)
        self.outputs: list[torch.Tensor] = []

    def middle(self, h: torch.Tensor, step: int) -> torch.Tensor:
        rows = self.window()
        rows.add_(h)
        return h + rows

    @eager_break_during_capture
    def window(self) -> torch.Tensor:
        return self.cache[:SIZE]

    def run(self, graphs: bool) -> list[torch.Tensor]:
        self.outputs = super().run(graphs)
        return self.outputs


class WindowedWrite(Windowed):
    """The break itself writes the buffer through the view it takes (a cache insert)
    before handing the view back: its write is re-applied on replay, once."""

    @eager_break_during_capture
    def window(self) -> torch.Tensor:
        rows = self.cache[:SIZE]
        rows.mul_(0.5)
        return rows


def windowed():
    engine = Windowed()
    ENGINES[:] = [engine]
    return [Target(lambda: engine.run(True), {"model": engine}, runner="test", mode="PIECEWISE",
                   eager=lambda: Windowed().run(False))]


def windowed_write():
    engine = WindowedWrite()
    ENGINES[:] = [engine]
    return [Target(lambda: engine.run(True), {"model": engine}, runner="test", mode="PIECEWISE",
                   eager=lambda: WindowedWrite().run(False))]


@eager_break_during_capture
def _attend_in_break(h: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(h.tanh())


@torch.library.custom_op("capturelint_shadow::attend", mutates_args=("out",))
def _attend_op(h: torch.Tensor, out: torch.Tensor) -> None:
    """An opaque op whose implementation is an eager break that writes its ``out``
    argument, as vLLM's ``torch.ops.vllm.unified_attention_with_output`` is: the break
    runs inside the op's dispatch, where torch has taken the dispatch modes off their
    stack."""
    _attend_in_break(h, out)


class Opaque(Served):
    """The captured code allocates an output, hands it to the opaque op (its break
    fills it), and reads it after."""

    def __init__(self, mode: CUDAGraphMode = CUDAGraphMode.PIECEWISE):
        super().__init__(mode)
        self.wrapper = CUDAGraphWrapper(self, break_outputs=BreakOutputs.DISCARD)
        self.outputs: list[torch.Tensor] = []

    def middle(self, h: torch.Tensor, step: int) -> torch.Tensor:
        out = torch.empty_like(h)
        torch.ops.capturelint_shadow.attend(h, out)
        return h + out

    def run(self, graphs: bool) -> list[torch.Tensor]:
        self.outputs = super().run(graphs)
        return self.outputs


def opaque():
    engine = Opaque()
    ENGINES[:] = [engine]
    return [Target(lambda: engine.run(True), {"model": engine}, runner="test", mode="PIECEWISE",
                   eager=lambda: Opaque().run(False))]


@dataclasses.dataclass
class StepInfo:
    """A metadata object the runner makes per step, with a host value in it."""

    rows: int


class Stamped(Served):
    """The captured code hands a break the step's metadata object: replay hands it the
    capture's, whose host value is the capture's (a baked break argument)."""

    def __init__(self, mode: CUDAGraphMode = CUDAGraphMode.PIECEWISE):
        super().__init__(mode)
        self.wrapper = CUDAGraphWrapper(self, break_outputs=BreakOutputs.DISCARD)
        self.info = StepInfo(0)
        self.outputs: list[torch.Tensor] = []

    def prepare(self, step: int) -> None:
        self.info = StepInfo(step + 2)

    def middle(self, h: torch.Tensor, step: int) -> torch.Tensor:
        out = torch.empty_like(h)
        self.scale(h, out, self.info)
        return h + out

    @eager_break_during_capture
    def scale(self, h: torch.Tensor, out: torch.Tensor, info: StepInfo) -> None:
        out.copy_(h * info.rows)

    def run(self, graphs: bool) -> list[torch.Tensor]:
        self.outputs = super().run(graphs)
        return self.outputs


def stamped():
    engine = Stamped()
    ENGINES[:] = [engine]
    return [Target(lambda: engine.run(True), {"model": engine}, runner="test", mode="PIECEWISE",
                   eager=lambda: Stamped().run(False))]
