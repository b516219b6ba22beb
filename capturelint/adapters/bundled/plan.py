"""The adapter for the bundled DeepSeek V4 engine (``--engine bundled``, the default).

``make_plan`` resolves the engine's options (``capturelint.adapters.common``) with its
defaults (the platform's default runner, all four capturing modes, its own declared
invariants); ``configuration`` builds one ``Configuration`` per runner and mode;
``run_check`` runs them through the check pipeline. This is the only module of the
checker that knows the bundled engine's API (the ``Engine``, its config and its runner's
``named_state_tensors``). It never reaches into the model's code: what the checker knows
of the model, it learns from traces. Its forward context is capturelint's own
(``common.forward_context_probe``, ``common.layer_scope_group``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from capturelint.adapters.bundled.invariants import default_invariants
from capturelint.adapters.bundled.options import Knobs
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
from capturelint.errors import CapturelintError
from capturelint.options import CAPTURE_MODES, CUDAGraphMode, EngineOptions, Runner
from capturelint.settings import Settings

if TYPE_CHECKING:
    from capturelint.pipeline import Configuration
    from capturelint.report import ConfigReport, Report
    from capturelint.snapshot import RegionMap
    from capturelint.suggest import Slot

NAME = "bundled"
UNIT = "configuration"
CHECK_MODES = tuple(str(m) for m in CAPTURE_MODES)  # their names, for scripts (examples/)


# ------------------------------------------------------------------ the plan


def default_runner(platform: str) -> Runner:
    from capturelint.engine.config import EngineConfig

    return EngineConfig(platform=platform).resolved_runner


def make_plan(settings: Settings, options: EngineOptions | None = None, **spelled: Any) -> CheckPlan:
    """Command-line values over settings over the engine's defaults, validated; the
    invariants in force start from the bundled engine's own (``invariants``), its own
    options resolve into ``options.Knobs``. Scripts may spell the options as keywords
    instead, as the Python API takes them (``registry.engine_options``):
    ``make_plan(Settings(), runner="v1", mode="PIECEWISE")``."""
    if options is None:
        from capturelint.adapters.registry import engine_options

        options = engine_options(caller="make_plan", **spelled)
    knobs = resolve_knobs(Knobs, settings, options)

    def fresh_needs_v1(runners: tuple[Runner, ...]) -> None:
        if knobs.fresh_metadata and Runner.V1 not in runners:
            raise CapturelintError(
                "--fresh-metadata changes Model Runner V1's metadata builders, and no runner here is v1; "
                "add --runner v1 (or all), or drop --fresh-metadata"
            )

    return resolve_plan(
        settings, options, NAME, default_runners=lambda: (default_runner(knobs.platform),),
        default_modes=CAPTURE_MODES, invariants=default_invariants, check_runners=fresh_needs_v1, knobs=knobs,
    )


def load(plan: CheckPlan) -> CheckPlan:
    """Nothing to load: the engine is built per configuration."""
    return plan


# ------------------------------------------------------------ configurations


def engine_config(plan: CheckPlan, runner: Runner, mode: CUDAGraphMode) -> Any:
    from capturelint.engine.config import EngineConfig

    knobs: Knobs = plan.knobs
    kw: dict = dict(
        runner=runner,
        platform=knobs.platform,
        cudagraph_mode=mode,
        eager_region=plan.eager_region,
        fresh_metadata=knobs.fresh_metadata,
        kernels=knobs.kernels,
        seed=plan.seed,
        break_outputs=knobs.break_outputs,
    )
    if plan.layers is not None:
        kw["num_layers"] = plan.layers
    if plan.steps is not None:
        kw["steps"] = plan.steps
    return EngineConfig(**kw).validate()


def configuration(plan: CheckPlan, runner: Runner, mode: CUDAGraphMode) -> Configuration:
    """Build the engine for one runner and mode, and describe it to the pipeline."""
    from capturelint.engine.llm import Engine, compare
    from capturelint.harness import TwinResult
    from capturelint.pipeline import Configuration

    cfg = engine_config(plan, runner, mode)
    engine = Engine(cfg)

    def twin(output: Any) -> TwinResult:
        eager = eager_run(cfg.eager_twin()) if plan.reuse else Engine(cfg.eager_twin()).generate()
        agreement, logit_error = compare(output, eager)
        return TwinResult(agreement, logit_error)

    roots = {"model": engine.model, "state": list(engine.runner.named_state_tensors())}
    return Configuration(RunLabel(str(runner), str(mode)), engine.generate, roots, str(cfg.effective_eager_region),
                         forward_context_probe, layer_scope_group, twin, require_replays=True,
                         eager_region_option=str(plan.eager_region), invariants=plan.invariants,
                         capture_only=engine.capture_model, exercised=exercised)


def exercised(result: Any) -> tuple[str, ...]:
    """The steps of a generation (``GenerationResult.steps``) in words: per kind of step
    (prefill, decode, or mixed: decodes and prefills in one batch) and how it ran
    (eagerly, or a replay of which mode's graph), in order of first appearance, the
    batch sizes in tokens, ``real->padded`` where the batch was padded to a captured size
    (``xN``: that many steps of that size)::

        prefill: 7 tokens (eager), decode: 2->4 x3 tokens (replayed FULL), mixed: 5->8, 12->16 tokens (replayed PIECEWISE)
    """
    groups: dict[tuple[str, str], dict[str, int]] = {}
    for s in result.steps:
        kind = "decode" if s.uniform_decode else "prefill" if s.num_prefills == len(s.req_ids) else "mixed"
        how = "eager" if s.descriptor is None else f"replayed {getattr(s.runtime_mode, 'name', s.runtime_mode)}"
        padded = s.descriptor is not None and s.num_padded != s.num_tokens
        size = f"{s.num_tokens}->{s.num_padded}" if padded else str(s.num_tokens)
        sizes = groups.setdefault((kind, how), {})
        sizes[size] = sizes.get(size, 0) + 1
    return tuple(f"{kind}: {', '.join(size + (f' x{n}' if n > 1 else '') for size, n in sizes.items())} tokens ({how})"
                 for (kind, how), sizes in groups.items())


_eager_runs: dict[Any, Any] = {}


def eager_run(config: Any) -> Any:
    """The generation of an eager twin, run once per process and engine config: every
    mode of a runner has the same eager twin (``EngineConfig.eager_twin`` sets mode
    NONE), and the engine is deterministic, so the four modes of a runner share it."""
    from capturelint.engine.llm import Engine

    result = _eager_runs.get(config)
    if result is None:
        result = _eager_runs[config] = Engine(config).generate()
    return result


def _prepare_twins(plan: CheckPlan) -> None:
    """Before configurations fork into workers: run their distinct eager twins (in
    parallel too), so that every worker inherits them instead of running its own."""
    from capturelint.pipeline import parallel_map

    wanted = list(dict.fromkeys(engine_config(plan, r, m).eager_twin() for r, m in plan.configurations))
    missing = [c for c in wanted if c not in _eager_runs]
    if not missing:
        return
    from capturelint.engine.llm import Engine

    results = parallel_map([lambda c=c: Engine(c).generate() for c in missing], plan.jobs,
                           names=[f"the eager twin of runner {c.runner}" for c in missing])
    _eager_runs.update(zip(missing, results))


def run_configuration(plan: CheckPlan, runner: Runner, mode: CUDAGraphMode, shadow: bool = True,
                      static: bool = False) -> ConfigReport:
    """Trace one runner and mode; with ``shadow`` also check every replay step and run
    the eager twin for the numerical oracle. Without it, only the captures are
    recorded (what region maps and diffs need). ``static`` captures every graph
    (``Engine.capture_model``, no generation) and checks the invariants and host syncs."""
    from capturelint.pipeline import check_configuration

    return check_configuration(configuration(plan, runner, mode), plan.codes, shadow=shadow, static=static)


def run_check(plan: CheckPlan, progress: Callable[[str], None] | None = None, shadow: bool = True,
              static: bool = False, keep_captures: bool = False) -> Report:
    """Run the plan's configurations (``plan.jobs`` at once, in worker processes), their
    distinct eager twins first when they would otherwise run once per worker."""
    if plan.reuse and shadow and not static and plan.jobs > 1 and len(plan.configurations) > 1 and not keep_captures:
        _prepare_twins(plan)
    return run_plan(plan, run_configuration, progress, shadow, static, keep_captures)


def _fresh_check(plan: CheckPlan, runner: Runner, mode: CUDAGraphMode) -> ConfigReport:
    from capturelint.pipeline import check_configuration

    return check_configuration(configuration(plan, runner, mode), plan.codes)


def suggest_slots(plan: CheckPlan) -> list[Slot]:
    """``capturelint suggest``: every check builds a fresh engine, so it picks up the
    functions made eager breaks (capturelint's runtime's) at that moment."""
    return slots(plan, _fresh_check, runtime_break())


def record_regions(plan: CheckPlan, progress: Callable[[str], None] | None = None) -> RegionMap:
    """Run every configuration of the plan recording captures only (no shadow)."""
    return region_map_of(run_check(plan, progress, shadow=False), plan)


__all__ = [
    "CHECK_MODES", "NAME", "configuration", "default_invariants", "default_runner", "engine_config", "load",
    "make_plan", "record_regions", "run_check", "run_configuration", "suggest_slots",
]
