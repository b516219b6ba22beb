"""Which adapter runs a plan: ``--engine bundled`` (the default) or ``--engine vllm``.

The commands resolve their options here and run the plan here; each engine's adapter
builds its own configurations. The bundled adapter knows nothing of vLLM's, and
vLLM's is imported only when asked for (it imports vLLM, which takes seconds).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from capturelint.adapters.bundled import CheckPlan
from capturelint.errors import CapturelintError
from capturelint.limits import default_jobs, jobs_problem
from capturelint.report import Report
from capturelint.settings import ENGINES, Settings, merge


def make_plan(settings: Settings, engine: str | None = None, jobs: int | None = None, reuse: bool = True,
              **options: Any) -> CheckPlan:
    """The plan of ``engine`` (command line over settings over ``bundled``), checking
    ``jobs`` configurations at once (command line over settings over the usable cores);
    ``reuse=False`` computes every configuration's work from scratch."""
    name = merge(engine, settings.engine, "bundled")
    if name not in ENGINES:
        raise CapturelintError(f"unknown engine {name!r}; use {' or '.join(ENGINES)}")
    n = resolve_jobs(jobs, settings)
    if name == "vllm":
        from capturelint.adapters.vllm_plan import vllm_plan

        plan = vllm_plan(settings, **options)
    else:
        from capturelint.adapters import bundled

        plan = bundled.make_plan(settings, **options)
    return dataclasses.replace(plan, jobs=n, reuse=reuse)


def resolve_jobs(jobs: int | None, settings: Settings) -> int:
    """``--jobs`` over the setting over the usable cores, or a one-line error."""
    n = merge(jobs, settings.jobs, None)
    if n is not None and (problem := jobs_problem(n)) is not None:
        raise CapturelintError(f"--jobs {problem}, got {n}")
    return n if n is not None else default_jobs()


def run_check(plan: CheckPlan, progress: Callable[[str], None] | None = None, shadow: bool = True,
              static: bool = False, keep_captures: bool = False) -> Report:
    """Run every configuration of the plan (``plan.jobs`` at once); ``static`` checks the
    captures only; ``keep_captures`` keeps the capture streams in the reports (they are
    then run in this process)."""
    if plan.engine == "vllm":
        from capturelint.adapters.vllm_plan import run_vllm_check

        return run_vllm_check(plan, progress, shadow, static, keep_captures)
    from capturelint.adapters import bundled

    return bundled.run_check(plan, progress, shadow, static, keep_captures)


def record_regions(plan: CheckPlan, progress: Callable[[str], None] | None = None) -> Any:
    """Every configuration's captures, recorded without the shadow: the region map that
    ``snapshot`` writes and ``diff`` compares."""
    if plan.engine != "vllm":
        from capturelint.adapters import bundled

        return bundled.record_regions(plan, progress)
    from capturelint.snapshot import region_map

    return region_map(run_check(plan, progress, shadow=False), plan)


__all__ = ["make_plan", "record_regions", "resolve_jobs", "run_check"]

