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
from capturelint.adapters.common import (
    CheckPlan,
    forward_context_probe,
    layer_scope_group,
    region_map_of,
    resolve_plan,
    run_plan,
    runtime_break,
    slots,
)
from capturelint.analyzer import RunLabel
from capturelint.errors import CapturelintError
from capturelint.harness import TwinResult
from capturelint.options import CAPTURE_MODES, ENGINE_OPTIONS, BreakOutputs, CUDAGraphMode, EngineOptions, Runner
from capturelint.pipeline import Configuration, check_configuration
from capturelint.report import ConfigReport, Report
from capturelint.settings import Settings, merge

if TYPE_CHECKING:
    from capturelint.snapshot import RegionMap
    from capturelint.suggest import Slot

NAME = "bundled"
OPTIONS = frozenset(ENGINE_OPTIONS) - {"--capture-sizes", "--batch-sizes"}
OTHER_OPTIONS = "sets the workload of --engine vllm (the bundled engine's is its scheduler's)"
UNIT = "configuration"
CHECK_MODES = tuple(str(m) for m in CAPTURE_MODES)  # their names, for scripts (examples/)


# ------------------------------------------------------------------ the plan


def default_runner(platform: str) -> Runner:
    from capturelint.engine.config import EngineConfig

    return EngineConfig(platform=platform).resolved_runner


def make_plan(settings: Settings, options: EngineOptions | None = None, **spelled: Any) -> CheckPlan:
    """Command-line values over settings over the engine's defaults, validated; the
    invariants in force start from the bundled engine's own (``invariants``).
    Scripts may spell the options as keywords instead (``EngineOptions.of``):
    ``make_plan(Settings(), runner="v1", modes=("PIECEWISE",))``."""
    options = options if options is not None else EngineOptions.of(**spelled)
    if options.spec is not None:
        raise CapturelintError(f"--spec {options.spec} checks vLLM's speculative decoding; the bundled engine has no "
                               "draft model: use --engine vllm, or drop --spec")

    def fresh_needs_v1(runners: tuple[Runner, ...]) -> None:
        if options.fresh_metadata and Runner.V1 not in runners:
            raise CapturelintError(
                "--fresh-metadata changes Model Runner V1's metadata builders, and no runner here is v1; "
                "add --runner v1 (or all), or drop --fresh-metadata"
            )

    return resolve_plan(
        settings, options, NAME, default_runners=lambda: (default_runner(options.platform),),
        default_modes=CAPTURE_MODES, invariants=default_invariants, check_runners=fresh_needs_v1,
        fresh_metadata=options.fresh_metadata, kernels=merge(options.kernels, settings.kernels, "torch"),
        platform=options.platform,
        break_outputs=merge(options.break_outputs, settings.break_outputs, BreakOutputs.COPY),
    )


def load(plan: CheckPlan) -> CheckPlan:
    """Nothing to load: the engine is built per configuration."""
    return plan


# ------------------------------------------------------------ configurations


def engine_config(plan: CheckPlan, runner: Runner, mode: CUDAGraphMode) -> Any:
    from capturelint.engine.config import EngineConfig

    kw: dict = dict(
        runner=runner,
        platform=plan.platform,
        cudagraph_mode=mode,
        eager_region=plan.eager_region,
        fresh_metadata=plan.fresh_metadata,
        kernels=plan.kernels,
        seed=plan.seed,
        break_outputs=plan.break_outputs,
    )
    if plan.layers is not None:
        kw["num_layers"] = plan.layers
    if plan.steps is not None:
        kw["steps"] = plan.steps
    return EngineConfig(**kw).validate()


def configuration(plan: CheckPlan, runner: Runner, mode: CUDAGraphMode) -> Configuration:
    """Build the engine for one runner and mode, and describe it to the pipeline."""
    from capturelint.engine.llm import Engine, compare

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
                         capture_only=engine.capture_model)


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
    return check_configuration(configuration(plan, runner, mode), plan.codes, shadow=shadow, static=static)


def run_check(plan: CheckPlan, progress: Callable[[str], None] | None = None, shadow: bool = True,
              static: bool = False, keep_captures: bool = False) -> Report:
    """Run the plan's configurations (``plan.jobs`` at once, in worker processes), their
    distinct eager twins first when they would otherwise run once per worker."""
    if plan.reuse and shadow and not static and plan.jobs > 1 and len(plan.configurations) > 1 and not keep_captures:
        _prepare_twins(plan)
    return run_plan(plan, run_configuration, progress, shadow, static, keep_captures)


def _fresh_check(plan: CheckPlan, runner: Runner, mode: CUDAGraphMode) -> ConfigReport:
    return check_configuration(configuration(plan, runner, mode), plan.codes)


def suggest_slots(plan: CheckPlan) -> list[Slot]:
    """``capturelint suggest``: every check builds a fresh engine, so it picks up the
    functions made eager breaks (capturelint's runtime's) at that moment."""
    return slots(plan, _fresh_check, runtime_break())


def record_regions(plan: CheckPlan, progress: Callable[[str], None] | None = None) -> RegionMap:
    """Run every configuration of the plan recording captures only (no shadow)."""
    return region_map_of(run_check(plan, progress, shadow=False), plan)


__all__ = [
    "CHECK_MODES", "NAME", "OPTIONS", "configuration", "default_invariants", "default_runner", "engine_config", "load",
    "make_plan", "record_regions", "run_check", "run_configuration", "suggest_slots",
]
