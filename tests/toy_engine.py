"""Hand-made engines built with the capture runtime, one hazard each (and its twin).

Each toy is a tiny runner: a model wrapped in ``CUDAGraphWrapper``, a persistent input
buffer refreshed in place per step, a forward context per step. ``hazard`` picks the
bug; ``fixed=True`` builds the negative twin that must pass.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn

from capturelint.analyzer import RunLabel
from capturelint.runtime.breakable import BreakOutputs, CUDAGraphWrapper, eager_break_during_capture
from capturelint.runtime.forward_context import BatchDescriptor, CUDAGraphMode, get_forward_context, set_forward_context
from capturelint.harness import TraceResult, trace_run

SIZE = 4  # captured batch size
DIM = 8


class Toy(nn.Module):
    def __init__(self, hazard: str, fixed: bool):
        super().__init__()
        torch.manual_seed(0)
        self.hazard, self.fixed = hazard, fixed
        self.inp = nn.Linear(DIM, DIM)
        self.out = nn.Linear(DIM, DIM)
        self.register_buffer("gate", torch.zeros(SIZE, DIM))
        self.scratch: torch.Tensor | None = None
        self.calls = 0  # steps seen; a host value that changes every step

    def forward(self, x: torch.Tensor, step_tensor: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        md = get_forward_context().attn_metadata
        hz = self.hazard
        if hz == "control_flow":
            if self.fixed:
                h = self.branch(h)
            elif md is None:
                h = h * 0.0
            else:
                h = h + md["bias"]
        elif hz == "stale_input":
            h = h + md["bias"]
        elif hz == "escaped_output":
            self.route(h)
            h = h * (self.gate if self.fixed else self.scratch)
        elif hz == "host_value":
            h = h * (md["scale_t"] if self.fixed else md["scale"])
        elif hz == "host_sync":
            if self.fixed:
                h = self.sync_in_break(h)
            else:
                h = h * float(h.abs().sum().item() > 0)
        elif hz == "break_arg":
            h = self.scaled(h, md["bias"] if self.fixed else step_tensor)
        elif hz == "shape":
            h = h.relu()
        elif hz == "returned_output":
            h = h * self.route_returning(h)
        elif hz == "break_scalar":
            h = self.shifted(h, 1.0 if self.fixed else float(step_tensor.shape[0]) + self.calls)
        elif hz == "tolist":
            h = h * float(len(h.tolist()))
        elif hz == "bool_mask":
            h = h[h[:, 0] > -1e9]
        elif hz == "host_shape":
            # zero padding sized by a Python int that changes per step: the size is a baked
            # host value (CL102), and the concatenation's other shape only follows from it
            pad = h.new_zeros(SIZE + (0 if self.fixed else self.calls), DIM)
            h = torch.cat([h, pad])[:SIZE]
        return self.out(h)

    @eager_break_during_capture
    def branch(self, h: torch.Tensor) -> torch.Tensor:
        md = get_forward_context().attn_metadata
        return h * 0.0 if md is None else h + md["bias"]

    @eager_break_during_capture
    def route(self, h: torch.Tensor) -> None:
        if self.fixed:
            self.gate.copy_(torch.sigmoid(h))
        else:
            self.scratch = torch.sigmoid(h)

    @eager_break_during_capture
    def sync_in_break(self, h: torch.Tensor) -> torch.Tensor:
        return h * float(h.abs().sum().item() > 0)

    @eager_break_during_capture
    def route_returning(self, h: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(h)

    @eager_break_during_capture
    def shifted(self, h: torch.Tensor, value: float) -> torch.Tensor:
        return h + value

    @eager_break_during_capture
    def scaled(self, h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return h + t


class ToyRunner:
    """Persistent input buffer, per-step metadata, capture on the first step."""

    def __init__(self, hazard: str, fixed: bool = False, mode: CUDAGraphMode = CUDAGraphMode.PIECEWISE, steps: int = 4,
                 break_outputs: BreakOutputs = BreakOutputs.COPY):
        self.model = Toy(hazard, fixed)
        self.hazard, self.fixed, self.mode, self.steps = hazard, fixed, mode, steps
        self.wrapper = CUDAGraphWrapper(self.model, break_outputs=break_outputs)
        self.input = torch.zeros(SIZE, DIM)
        self.bias = torch.zeros(SIZE, DIM)  # persistent metadata buffer
        self.scale_t = torch.ones(())
        self.outputs: list[torch.Tensor] = []
        self.eager_outputs: list[torch.Tensor] = []

    def metadata(self, step: int) -> dict[str, Any] | None:
        g = torch.Generator().manual_seed(100 + step)
        values = torch.randn(SIZE, DIM, generator=g)
        if self.hazard == "control_flow" and step == 0:
            return None  # the capture is a dummy run without metadata
        if self.hazard in ("stale_input",) and not self.fixed:
            bias = values.clone()  # re-allocated every step
        else:
            self.bias.copy_(values)
            bias = self.bias
        self.scale_t.fill_(1.0 + step)
        return {"bias": bias, "scale": 1.0 + step, "scale_t": self.scale_t}

    def step(self, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(i)
        self.input.copy_(torch.randn(SIZE, DIM, generator=g))
        n = SIZE
        if self.hazard == "shape" and not self.fixed and i > 0:
            n = SIZE - 1  # the runner forgets to pad
        x = self.input[:n]
        step_tensor = torch.full((SIZE, DIM), float(i))
        md = self.metadata(i)
        self.model.calls = i
        desc = BatchDescriptor(SIZE, False)
        with set_forward_context(md, self.mode, desc):
            out = self.wrapper(x, step_tensor)
        with set_forward_context(md, CUDAGraphMode.NONE, None):
            ref = self.model(x, step_tensor)
        self.outputs.append(out[:n].clone())
        self.eager_outputs.append(ref.clone())
        return out

    def run(self) -> list[torch.Tensor]:
        for i in range(self.steps):
            self.step(i)
        return self.outputs

    def max_error(self) -> float:
        """Replay against eager over the replayed steps; the capture step's output is
        not computed (as on a GPU, captured kernels do not run at capture)."""
        errors = [float((a - b).abs().max()) for a, b in zip(self.outputs[1:], self.eager_outputs[1:])]
        return max(float("inf") if e != e else e for e in errors)


def check_toy(hazard: str, fixed: bool = False, mode: CUDAGraphMode = CUDAGraphMode.PIECEWISE, steps: int = 4,
              break_outputs: BreakOutputs = BreakOutputs.COPY, rules: Sequence[type] | None = None) -> tuple[TraceResult, ToyRunner]:
    from capturelint.adapters.common import forward_context_probe, layer_scope_group

    runner = ToyRunner(hazard, fixed, mode, steps, break_outputs)
    result = trace_run(runner.run, {"model": runner.model, "runner": runner}, RunLabel("toy", str(mode)),
                       probe=forward_context_probe, scope_group=layer_scope_group, rules=rules)
    return result, runner


def _targets(hazard: str, fixed: bool):
    from capturelint.target import Target

    out = []
    for mode in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL):
        runner = ToyRunner(hazard, fixed, mode)
        out.append(Target(runner.run, {"model": runner.model, "runner": runner}, runner="toy", mode=str(mode)))
    return out


def stale_targets():
    """`capturelint check --target tests/toy_engine.py:stale_targets`: a metadata tensor
    re-allocated every step, under PIECEWISE and FULL graphs."""
    return _targets("stale_input", False)


def fixed_targets():
    """The same engine refreshing its metadata buffer in place."""
    return _targets("stale_input", True)


def broken_targets():
    """An engine whose forward raises during capture (a bug, not a hazard)."""
    from capturelint.target import Target

    runner = ToyRunner("shape", False, CUDAGraphMode.PIECEWISE)

    def explode(*args, **kwargs):
        raise RuntimeError("cache not allocated")

    runner.model.inp.forward = explode
    return Target(runner.run, {"model": runner.model}, runner="toy", mode="PIECEWISE")
