"""The check: which configurations to run, and the report they give.

``CheckPlan`` is what every command resolves its options and ``[tool.capturelint]``
settings into (command line over settings over defaults); ``run_check`` runs each
configuration of the bundled engine under the tracer and returns a ``Report``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from capturelint.engine.forward_context import CUDAGraphMode
from capturelint.errors import CapturelintError
from capturelint.report import ConfigReport, Report
from capturelint.rules import select_codes
from capturelint.settings import Settings, merge

RUNNERS = ("v1", "v2")
CHECK_MODES = ("PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
REGIONS = ("narrow", "wide", "per-runner")


@dataclasses.dataclass(frozen=True)
class CheckPlan:
    """Every configuration a command will run, fully resolved."""

    runners: tuple[str, ...]
    modes: tuple[str, ...]
    eager_region: str
    fresh_metadata: bool
    layers: int | None
    steps: int | None
    seed: int
    kernels: str
    platform: str
    codes: frozenset[str]
    copy_break_outputs: bool = True

    @property
    def configurations(self) -> list[tuple[str, str]]:
        return [(r, m) for r in self.runners for m in self.modes]


def default_runner(platform: str) -> str:
    from capturelint.engine.config import EngineConfig

    return str(EngineConfig(platform=platform).resolved_runner)


def make_plan(
    settings: Settings,
    runner: str | None = None,
    modes: Sequence[str] = (),
    eager_region: str | None = None,
    fresh_metadata: bool = False,
    layers: int | None = None,
    steps: int | None = None,
    seed: int | None = None,
    kernels: str | None = None,
    platform: str = "cuda",
    select: Sequence[str] = (),
    ignore: Sequence[str] = (),
    copy_break_outputs: bool = True,
) -> CheckPlan:
    """Resolve command-line values over settings over defaults, and validate them."""
    if runner is not None:
        runners: tuple[str, ...] = RUNNERS if runner.lower() == "all" else (runner.lower(),)
    elif settings.runners:
        runners = tuple(settings.runners)
    else:
        runners = (default_runner(platform),)
    for r in runners:
        if r not in RUNNERS:
            raise CapturelintError(f"unknown runner {r!r}; use v1, v2 or all")
    chosen = tuple(modes) or tuple(settings.modes or ()) or CHECK_MODES
    parsed = []
    for m in chosen:
        try:
            mode = CUDAGraphMode.parse(m)
        except ValueError as e:
            raise CapturelintError(str(e)) from None
        parsed.append(str(mode))
    region = merge(eager_region, settings.eager_region, "per-runner")
    if region not in REGIONS:
        raise CapturelintError(f"unknown eager region {region!r}; use narrow, wide or per-runner")
    for name, value in (("layers", layers), ("steps", steps)):
        if value is not None and value <= 0:
            raise CapturelintError(f"--{name} must be a positive integer, got {value}")
    sel = list(select) or list(settings.select or ())
    ign = list(ignore) or list(settings.ignore or ())
    return CheckPlan(
        runners=tuple(dict.fromkeys(runners)),
        modes=tuple(dict.fromkeys(parsed)),
        eager_region=region,
        fresh_metadata=fresh_metadata,
        layers=merge(layers, settings.layers, None),
        steps=merge(steps, settings.steps, None),
        seed=merge(seed, settings.seed, 0),
        kernels=merge(kernels, settings.kernels, "torch"),
        platform=platform,
        codes=select_codes(sel, ign),
        copy_break_outputs=copy_break_outputs,
    )


def run_check(plan: CheckPlan, progress: Callable[[str], None] | None = None, shadow: bool = True) -> Report:
    from capturelint.bundled import run_configuration

    configs: list[ConfigReport] = []
    for runner, mode in plan.configurations:
        if progress is not None:
            progress(f"runner {runner} · {mode}")
        configs.append(run_configuration(plan, runner, mode, shadow=shadow))
    return Report(configs)
