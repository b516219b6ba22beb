"""The toy engine's adapter: the ``Adapter`` members of ``capturelint.adapters.registry``,
mostly the shared helpers of ``capturelint.adapters.common``; no rule, command or
pipeline changes."""

from __future__ import annotations

from typing import Any, Callable

from capturelint.adapters.common import (
    CheckPlan,
    forward_context_probe,
    layer_scope_group,
    region_map_of,
    resolve_knobs,
    resolve_plan,
    run_plan,
    runtime_break,
    slots,
)
from capturelint.analyzer import RunLabel
from capturelint.options import CUDAGraphMode, Runner
from capturelint_toy.options import Knobs

NAME = "toy"
UNIT = "configuration"
MODES = (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL)


def make_plan(settings: Any, options: Any) -> CheckPlan:
    def refused(mode: CUDAGraphMode) -> str | None:
        return None if mode in MODES else f"the toy engine captures PIECEWISE or FULL graphs, not {mode}"

    return resolve_plan(settings, options, NAME, default_runners=lambda: tuple(Runner), default_modes=MODES,
                        invariants=default_invariants, mode_refused=refused,
                        knobs=resolve_knobs(Knobs, settings, options))


def load(plan: CheckPlan) -> CheckPlan:
    return plan


def configuration(plan: CheckPlan, runner: Runner, mode: CUDAGraphMode) -> Any:
    from toy_engine import ToyRunner

    from capturelint.pipeline import Configuration

    fixed = runner is Runner.V2 or plan.knobs.toy_fixed
    toy = ToyRunner("stale_input", fixed=fixed, mode=mode, steps=plan.steps or 4)
    return Configuration(RunLabel(str(runner), str(mode)), toy.run, {"model": toy.model, "runner": toy}, "-",
                         forward_context_probe, layer_scope_group, require_replays=True, invariants=plan.invariants)


def check_one(plan: CheckPlan, runner: Runner, mode: CUDAGraphMode, shadow: bool = True, static: bool = False) -> Any:
    from capturelint.pipeline import check_configuration

    return check_configuration(configuration(plan, runner, mode), plan.codes, shadow=shadow, static=static)


def run_check(plan: CheckPlan, progress: Callable[[str], None] | None = None, shadow: bool = True,
              static: bool = False, keep_captures: bool = False) -> Any:
    return run_plan(plan, check_one, progress, shadow, static, keep_captures, title="toy · ")


def record_regions(plan: CheckPlan, progress: Callable[[str], None] | None = None) -> Any:
    return region_map_of(run_check(plan, progress, shadow=False), plan)


def suggest_slots(plan: CheckPlan) -> list[Any]:
    return slots(plan, check_one, runtime_break())


def default_invariants() -> tuple[Any, ...]:
    return ()
