"""The adapters, keyed by engine name, and what the commands ask of them.

Every engine family capturelint checks is one adapter: ``bundled`` (the bundled DeepSeek
V4 engine, the default), ``vllm`` (vLLM's own attention), ``target`` (a user's
engine, ``--target SPEC``) and ``script`` (a plain program, ``capturelint run
SCRIPT.py``). An adapter is a module (or any object) with the members of
``Adapter``; the registry maps an engine's name to it and loads adapter modules when a
command first asks for one (vLLM's adapter imports vLLM, which takes seconds, and
``capturelint -h`` imports no torch). This is the one module that knows the names: the
commands hand it their options (``capturelint.options.EngineOptions``) and get a plan
back, then hand it the plan to run. Adding an engine family is one adapter module and
one entry in ``_ADAPTERS`` (or ``register(name, adapter)``).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import TYPE_CHECKING, Callable, Protocol

from capturelint.adapters.common import CheckPlan
from capturelint.errors import CapturelintError
from capturelint.limits import default_jobs, jobs_problem
from capturelint.options import DEFAULT_ENGINE, EngineOptions
from capturelint.settings import Settings, merge, shown

if TYPE_CHECKING:
    from capturelint.invariants import Invariant
    from capturelint.report import Report
    from capturelint.snapshot import RegionMap
    from capturelint.suggest import Slot

Progress = Callable[[str], None]


class Adapter(Protocol):
    """What an adapter provides.

    - ``NAME``: its engine's name (``--engine NAME``);
    - ``OPTIONS``: the engine options it reads (flags of ``capturelint.options.ENGINE_OPTIONS``);
      one of the others given on the command line is an error that reads
      ``"{flag} {OTHER_OPTIONS}, so {flag} would be ignored; drop {flag}"``;
    - ``UNIT``: what its configurations are called in messages (``configuration``, ``target``);
    - ``make_plan(settings, options)``: its options resolved over the settings (the
      helpers of ``capturelint.adapters.common``), validated: a one-line error otherwise;
    - ``load(plan)``: what the plan needs built before it runs (a target's engines);
    - ``run_check(plan, progress, shadow, static, keep_captures)``: its configurations
      checked through the check pipeline (``plan.shard``'s, ``plan.jobs`` at once);
    - ``record_regions(plan, progress)``: the region map of its captures (no shadow);
    - ``suggest_slots(plan)``: its configurations for ``capturelint suggest``, each slot
      carrying the break decorator of its runtime;
    - ``default_invariants()``: the declared invariants it ships.
    """

    NAME: str
    OPTIONS: frozenset[str]
    OTHER_OPTIONS: str
    UNIT: str

    def make_plan(self, settings: Settings, options: EngineOptions) -> CheckPlan: ...

    def load(self, plan: CheckPlan) -> CheckPlan: ...

    def run_check(self, plan: CheckPlan, progress: Progress | None = None, shadow: bool = True, static: bool = False,
                  keep_captures: bool = False) -> Report: ...

    def record_regions(self, plan: CheckPlan, progress: Progress | None = None) -> RegionMap: ...

    def suggest_slots(self, plan: CheckPlan) -> list[Slot]: ...

    def default_invariants(self) -> tuple[Invariant, ...]: ...


TARGET = "target"  # the adapter ``--target SPEC`` chooses; ``--engine`` names the others
SCRIPT = "script"  # the adapter ``capturelint run SCRIPT.py`` chooses

# name -> the adapter, or the module that is one (imported when first asked for)
_ADAPTERS: dict[str, str | Adapter] = {
    "bundled": "capturelint.adapters.bundled.plan",
    "vllm": "capturelint.adapters.vllm.plan",
    TARGET: "capturelint.adapters.target",
    SCRIPT: "capturelint.adapters.script",
}
_BUILT_IN = frozenset(_ADAPTERS)


def names() -> tuple[str, ...]:
    """The engines ``--engine`` may name, in registry order (the default first)."""
    return tuple(n for n in _ADAPTERS if n not in (TARGET, SCRIPT))


def adapter(name: str) -> Adapter:
    """The adapter of engine ``name``, or a one-line error listing the engines."""
    entry = _ADAPTERS.get(name)
    if entry is None:
        raise CapturelintError(f"unknown engine {name!r}; use {' or '.join(names())}")
    if isinstance(entry, str):
        return importlib.import_module(entry)  # type: ignore[return-value]  # a module with Adapter's members
    return entry


def register(name: str, new: Adapter) -> None:
    """Add an engine (a plug-in, a test's toy engine); ``unregister`` takes it out."""
    if name in _ADAPTERS:
        raise ValueError(f"an engine named {name!r} is registered already")
    _ADAPTERS[name] = new


def unregister(name: str) -> None:
    if name in _BUILT_IN or name not in _ADAPTERS:
        raise ValueError(f"engine {name!r} is not a registered plug-in")
    del _ADAPTERS[name]


# --------------------------------------------------------------- the commands' door


def make_plan(settings: Settings, options: EngineOptions) -> CheckPlan:
    """The plan of the engine asked for: a script (``capturelint run``) chooses the
    script adapter, ``--target`` the target adapter, else
    ``--engine`` over the settings over ``DEFAULT_ENGINE``; engine options it does not
    read are refused; ``plan.jobs`` is ``--jobs`` over the setting over the usable cores,
    ``plan.reuse`` false with ``--no-reuse``."""
    if options.script is not None:
        name = SCRIPT
    elif options.target is not None:
        name = TARGET
    else:
        name = merge(options.engine, settings.engine, DEFAULT_ENGINE)
        if name not in names() and options.engine is None and settings.source is not None:
            raise CapturelintError(f"{shown(settings.source)}: [tool.capturelint] engine {name!r} is no engine; use "
                                   f"{' or '.join(names())}")
        if name not in names():
            raise CapturelintError(f"unknown engine {name!r}; use {' or '.join(names())}")
    chosen = adapter(name)
    for flag in options.given:
        if flag not in chosen.OPTIONS:
            raise CapturelintError(f"{flag} {chosen.OTHER_OPTIONS}, so {flag} would be ignored; drop {flag}")
    jobs = resolve_jobs(options.jobs, settings)
    return dataclasses.replace(chosen.make_plan(settings, options), jobs=jobs, reuse=options.reuse)


def resolve_jobs(jobs: int | None, settings: Settings) -> int:
    """``--jobs`` over the setting over the usable cores, or a one-line error."""
    n = merge(jobs, settings.jobs, None)
    if n is not None and (problem := jobs_problem(n)) is not None:
        raise CapturelintError(f"--jobs {problem}, got {n}")
    return n if n is not None else default_jobs()


def load(plan: CheckPlan) -> CheckPlan:
    """The plan with what it needs built (a target's engines: its configurations known)."""
    return adapter(plan.engine).load(plan)


def unit(plan: CheckPlan) -> str:
    """What the plan's configurations are called in messages."""
    return adapter(plan.engine).UNIT


def run_check(plan: CheckPlan, progress: Progress | None = None, shadow: bool = True, static: bool = False,
              keep_captures: bool = False) -> Report:
    """Check every configuration of the plan (its shard's; ``plan.jobs`` at once);
    ``static`` checks the captures only; ``keep_captures`` keeps the capture streams in
    the reports (they are then run in this process)."""
    return adapter(plan.engine).run_check(plan, progress, shadow, static, keep_captures)


def record_regions(plan: CheckPlan, progress: Progress | None = None) -> RegionMap:
    """Every configuration's captures, recorded without the shadow: the region map that
    ``snapshot`` writes and ``diff`` compares."""
    return adapter(plan.engine).record_regions(plan, progress)


def suggest_slots(plan: CheckPlan) -> list[Slot]:
    """The plan's configurations for ``capturelint suggest``."""
    return adapter(plan.engine).suggest_slots(plan)


__all__ = ["Adapter", "CheckPlan", "EngineOptions", "SCRIPT", "TARGET", "adapter", "load", "make_plan", "names", "record_regions",
           "register", "resolve_jobs", "run_check", "suggest_slots", "unit", "unregister"]
