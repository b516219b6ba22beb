"""A test engine for ``check --target``: the bundled engine under Model Runner V2 with
its MoE turned into an eager break (``targets``), and unchanged (``targets_fixed``)."""

from __future__ import annotations

from capturelint.engine.config import EngineConfig
from capturelint.engine.llm import Engine
from capturelint.runtime.breakable import eager_break_during_capture
from capturelint.runtime.forward_context import CUDAGraphMode
from capturelint.target import Target


def _target(moe_eager: bool) -> Target:
    engine = Engine(EngineConfig(runner="v2", cudagraph_mode=CUDAGraphMode.PIECEWISE, num_layers=2, steps=3).validate())
    if moe_eager:
        for layer in engine.model.model.layers:
            layer.ffn.forward = eager_break_during_capture(layer.ffn.forward)  # this engine's regression
    roots = {"model": engine.model, "state": list(engine.runner.named_state_tensors())}
    return Target(run=engine.generate, roots=roots, runner="v2", mode="PIECEWISE", eager_region="narrow")


def targets() -> list[Target]:
    return [_target(moe_eager=True)]


def targets_fixed() -> list[Target]:
    return [_target(moe_eager=False)]
