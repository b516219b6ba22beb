"""The toy engine's options: it reads ``--engine``, ``--runner``, ``--mode`` (PIECEWISE or
FULL) and ``--steps``, and has one of its own, ``--toy-fixed``."""

from __future__ import annotations

import dataclasses
from typing import Any

from capturelint.options import Kind, OptionSpec, switch_value

READS = ("engine", "runner", "mode", "steps")
DEFAULTS = {"runner": "all", "mode": "PIECEWISE,FULL", "steps": "4"}
OPTIONS = (
    OptionSpec("toy_fixed", switch_value, "Every runner refreshes its metadata in place (no CL104).", "",
               kind=Kind.SWITCH, default=False),
)


@dataclasses.dataclass(frozen=True)
class Knobs:
    toy_fixed: bool = False

    def recorded(self) -> dict[str, Any]:
        return {}
