"""A plain PyTorch program that graphs its sampling head with ``torch.cuda.make_graphed_callables``.

It is written for a GPU and uses nothing of capturelint but the ``Target`` that names
what to run: the head (logits, then a temperature-scaled softmax) is graphed once on a
sample batch, and every request batch calls the graphed module, as PyTorch's
partial-network capture shows. ``capturelint check --target`` runs it unmodified on a
CPU, with the CUDA device and its graphs emulated:

    capturelint check --target examples/plain/graphed_callable_baked_value.py:targets_bug    # exit 1, CL102
    capturelint check --target examples/plain/graphed_callable_baked_value.py:targets_fixed  # exit 0

``targets_bug`` sets the request's temperature on the module, ``head.temperature =
t``, and the head divides by that Python float. A CUDA graph freezes launch arguments:
the division was recorded with the capture's temperature, and every replay divides by
it, whatever the request asked for. A graphed callable keeps its Python, so capturelint
re-runs it eagerly at each call (a shadow, with no side effects) and finds the replay's
``aten.div`` recorded with ``other=1.0`` where the step passes ``other=0.7``: CL102,
with the capture's line and the step's. ``targets_fixed`` passes the temperature as a
tensor argument of the graphed callable, which copies it into its static input on every
call, and passes.
"""

from __future__ import annotations

import torch
from torch import nn

from capturelint.target import Target

BATCH, DIM, VOCAB = 4, 16, 32
TEMPERATURES = (1.0, 0.7, 1.3, 0.5)


class Head(nn.Module):
    """Logits and a temperature-scaled softmax over them."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(DIM, VOCAB)
        self.temperature = 1.0

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.proj(h) / self.temperature, dim=-1)  # the float is baked into the graph


class FixedHead(Head):
    def forward(self, h: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.proj(h) / temperature, dim=-1)  # a tensor the graph reads each replay


class Server:
    def __init__(self, fixed: bool):
        torch.manual_seed(0)
        self.fixed = fixed
        self.head = (FixedHead() if fixed else Head()).cuda().eval()

    def batches(self) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(1)
        return [torch.randn(BATCH, DIM, generator=g).cuda() for _ in TEMPERATURES]

    def serve(self) -> list[torch.Tensor]:
        with torch.no_grad():
            sample = torch.zeros(BATCH, DIM, device="cuda")
            if self.fixed:
                head = torch.cuda.make_graphed_callables(self.head, (sample, torch.ones((), device="cuda")))
            else:
                head = torch.cuda.make_graphed_callables(self.head, (sample,))
            out = []
            for h, t in zip(self.batches(), TEMPERATURES):
                if self.fixed:
                    out.append(head(h, torch.tensor(t, device="cuda")).clone())
                else:
                    head.temperature = t  # read by the graphed forward as a Python float
                    out.append(head(h).clone())
            return out


def _targets(fixed: bool) -> list[Target]:
    server = Server(fixed)
    return [Target(run=server.serve, roots={"head": server.head}, runner="plain", mode="graphed")]


def targets_bug() -> list[Target]:
    """The temperature is a Python float on the module: CL102."""
    return _targets(fixed=False)


def targets_fixed() -> list[Target]:
    """The temperature is a tensor argument of the graphed callable: clean."""
    return _targets(fixed=True)


if __name__ == "__main__":
    # On a GPU this runs as it is; on a CPU, under capturelint's emulated CUDA device.
    from capturelint.runtime.emulated import emulate_cuda

    with emulate_cuda():
        for fixed in (False, True):
            server = Server(fixed)
            outs = server.serve()
            with torch.no_grad():
                eager = [torch.softmax(server.head.proj(h) / t, dim=-1) for h, t in zip(server.batches(), TEMPERATURES)]
            error = max(float((a - b).abs().max()) for a, b in zip(outs, eager))
            print(f"temperature as a tensor argument: {fixed}; max replay-vs-eager error: {error:.3g}")
