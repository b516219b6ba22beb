"""The bundled engine's own options, and what it reads of the shared ones.

Declared here, read by the adapter registry when a command builds its options (``check
--help`` lists them under "Engine options (bundled)"), by the settings reader (their keys)
and by the Python API (their keywords); resolved by ``plan.make_plan`` into ``Knobs``.
Nothing here imports torch.

- ``--fresh-metadata``: Model Runner V1's metadata builders allocate new tensors every
  step (the bug class of CL104);
- ``--kernels torch|triton``: the engine's kernel implementations;
- ``--break-outputs copy|discard``: what the capture runtime does with an eager break's
  return values on replay (vLLM 0.33.0 discards them);
- ``--platform cuda|rocm|cpu``: the platform whose default runner applies.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from capturelint.options import CAPTURE_MODES, BreakOutputs, Kind, OptionSpec, choice_value, switch_value, text_choice

KERNELS = ("torch", "triton")
PLATFORMS = ("cuda", "rocm", "cpu")
DEFAULT_LAYERS = 4  # capturelint.engine.config.EngineConfig's num_layers (a test keeps them equal)
DEFAULT_STEPS = 24  # and its steps

READS = ("engine", "runner", "mode", "eager_region", "layers", "steps", "seed", "reuse")
"""The shared engine options it reads (``capturelint.common_options.ENGINE``)."""

DEFAULTS = {"runner": "the platform's default runner", "mode": ", ".join(map(str, CAPTURE_MODES)),
            "layers": str(DEFAULT_LAYERS), "steps": str(DEFAULT_STEPS)}
"""What ``--help`` says of its defaults of the shared options."""

OPTIONS = (
    OptionSpec("fresh_metadata", switch_value, "Model Runner V1's metadata builders allocate new tensors every step.",
               "", kind=Kind.SWITCH, default=False),
    OptionSpec("kernels", text_choice(KERNELS), "Kernel implementations.", "", choices=KERNELS, default="torch"),
    OptionSpec("break_outputs", choice_value(BreakOutputs, "break-outputs policy"), "What the capture runtime does "
               "with eager-break return values on replay: copy them into static buffers, or discard them, as vLLM "
               "0.33.0 does.", "", choices=tuple(b.value for b in BreakOutputs), default=BreakOutputs.COPY),
    OptionSpec("platform", text_choice(PLATFORMS), "Platform whose default runner applies.", "", choices=PLATFORMS,
               default="cuda"),
)


@dataclasses.dataclass(frozen=True)
class Knobs:
    """The bundled engine's own options, resolved (command line over settings over these
    defaults): what ``plan.engine_config`` hands the engine beyond the shared options."""

    fresh_metadata: bool = False
    kernels: str = "torch"
    platform: str = "cuda"
    break_outputs: BreakOutputs = BreakOutputs.COPY

    def recorded(self) -> dict[str, Any]:
        """What a region map records of them (``capturelint.snapshot.EngineParams``)."""
        return {"kernels": self.kernels, "fresh_metadata": self.fresh_metadata, "break_outputs": self.break_outputs}


__all__ = ["DEFAULTS", "DEFAULT_LAYERS", "DEFAULT_STEPS", "KERNELS", "Knobs", "OPTIONS", "PLATFORMS", "READS"]
