"""What capturelint checks in this project (pyproject.toml: [tool.capturelint] targets).

One Target per configuration worth checking: here one runner, serving three batches
from its CUDA graph, with an eager twin that serves the same batches without it, so
the check compares the outputs as well as running its rules.
"""

import torch

from capturelint.target import Target
from myserve import GraphRunner


def batches() -> list[torch.Tensor]:
    return [torch.full((2, 8), float(i)) + torch.arange(8.0) for i in range(3)]


def targets() -> list[Target]:
    runner = GraphRunner()
    return [Target(run=lambda: runner.serve(batches()), eager=lambda: GraphRunner().serve_eager(batches()),
                   roots={"runner": runner, "model": runner.model}, runner="graph", mode="FULL")]
