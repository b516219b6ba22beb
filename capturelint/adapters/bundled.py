"""The adapter for the bundled DeepSeek V4 engine, and capturelint's forward-context
conventions.

``CheckPlan`` is what every command resolves its options and ``[tool.capturelint]``
settings into (command line over settings over defaults); ``configurations`` builds one
``Configuration`` per runner and mode; ``run_check`` runs them through the check
pipeline. This is the only module of the checker that knows the bundled engine's API
(the ``Engine``, its config and its runner's ``named_state_tensors``). It never reaches
into the model's code: what the checker knows of the model, it learns from traces.

**Forward-context conventions** (shared with vLLM, so they live here and not in any
rule): ``attn_metadata`` is a dict keyed by layer-cache prefix on real steps and
``None`` on profile and dummy runs; module scopes ``...layers.N...`` own the metadata
entries ``attn_metadata['layers.N....']``. ``forward_context_probe`` and
``layer_scope_group`` encode them; ``--target`` engines built on capturelint's runtime
use them too.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Sequence

from capturelint.adapters.bundled_invariants import default_invariants as bundled_defaults
from capturelint.analyzer import RunLabel
from capturelint.errors import CapturelintError
from capturelint.harness import TwinResult
from capturelint.limits import count_problem, seed_problem
from capturelint.objects import named_tensors
from capturelint.pipeline import Configuration, check_configuration
from capturelint.records import ContextSnapshot, ContextSummary
from capturelint.report import ConfigReport, Report
from capturelint.rules import select_codes
from capturelint.runtime.forward_context import CUDAGraphMode, get_forward_context, has_forward_context
from capturelint.runtime.protocol import BreakOutputs
from capturelint.settings import Settings, merge

RUNNERS = ("v1", "v2")
CHECK_MODES = ("PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
REGIONS = ("narrow", "wide", "per-runner")
_LAYER = re.compile(r"layers\.\d+")


# ------------------------------------------------------------- forward context


def forward_context_probe() -> ContextSnapshot:
    """Reads capturelint's forward context: whether ``attn_metadata`` is a dict (a real
    step, or a capture with metadata) or ``None`` (a dummy or profile run), and the
    metadata's tensors by path (``attn_metadata['layers.0.swa'].slot_mapping``)."""
    if not has_forward_context():
        return ContextSnapshot(ContextSummary("none", "no forward context was set"))
    md = get_forward_context().attn_metadata
    if not isinstance(md, dict):
        summary = ContextSummary("none", "attn_metadata was None (a dummy or profile run: no attention metadata)")
        return ContextSnapshot(summary)
    summary = ContextSummary("metadata", f"attn_metadata held {len(md)} entries")
    tensors: list[tuple[str, Any]] = []
    for key, value in md.items():
        tensors.extend(named_tensors(f"attn_metadata[{key!r}]", value, sep=""))
    return ContextSnapshot(summary, tuple(tensors))


def layer_scope_group(scope: str) -> str | None:
    """``model.layers.3.attn`` -> ``layers.3``: a tensor shared by every layer's
    metadata is named after the layer whose op read it."""
    m = _LAYER.search(scope)
    return m.group(0) if m else None


# ------------------------------------------------------------------ the plan


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
    engine: str = "bundled"
    invariants: tuple[Any, ...] = ()  # declared invariants in force (capturelint.invariants.Invariant)
    shard: tuple[int, int] | None = None  # (K, N): run the K-th of N deterministic slices (1-based)
    jobs: int = 1  # configurations checked at once, in worker processes
    reuse: bool = True  # share identical work between configurations (the eager twins)

    @property
    def all_configurations(self) -> list[tuple[str, str]]:
        """Every configuration of the plan, in report order (runners, then modes)."""
        return [(r, m) for r in self.runners for m in self.modes]

    @property
    def configurations(self) -> list[tuple[str, str]]:
        """The configurations this run checks: all of them, or its shard's: the K-th of
        every N in report order, so the shards of one plan partition it."""
        from capturelint.shard import select

        return select(self.all_configurations, self.shard)

    @property
    def break_outputs(self) -> BreakOutputs:
        return BreakOutputs.parse(self.copy_break_outputs)


def check_counts(layers: int | None, steps: int | None, seed: int | None) -> None:
    """``--layers``, ``--steps`` and ``--seed`` in range, or a one-line error."""
    for name, value in (("layers", layers), ("steps", steps)):
        problem = None if value is None else count_problem(name, value)
        if problem is not None:
            raise CapturelintError(f"--{name} {problem}, got {value}")
    if seed is not None and (problem := seed_problem(seed)) is not None:
        raise CapturelintError(f"--seed {problem}, got {seed}")


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
    copy_break_outputs: bool | None = None,
    break_outputs: str | None = None,
    invariants_file: str | None = None,
    default_invariants: bool = True,
) -> CheckPlan:
    """Resolve command-line values over settings over defaults, and validate them.
    Invariants: the bundled engine's defaults, then the settings file's, then those of
    ``invariants_file`` (the command line), later ones replacing earlier ones by id."""
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
    check_counts(layers, steps, seed)
    if fresh_metadata and "v1" not in runners:
        raise CapturelintError(
            "--fresh-metadata changes Model Runner V1's metadata builders, and no runner here is v1; "
            "add --runner v1 (or all), or drop --fresh-metadata"
        )
    policy = merge(break_outputs, getattr(settings, "break_outputs", None), None)
    if policy is not None:
        try:
            copy = BreakOutputs.parse(policy) is BreakOutputs.COPY
        except ValueError as e:
            raise CapturelintError(f"--break-outputs: {e}") from None
    else:
        copy = True if copy_break_outputs is None else copy_break_outputs
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
        copy_break_outputs=copy,
        invariants=resolve_invariants(settings, invariants_file, bundled_defaults() if default_invariants else ()),
    )


def resolve_invariants(settings: Settings, invariants_file: str | None = None,
                       defaults: Sequence[Any] = ()) -> tuple[Any, ...]:
    """The invariants in force: the engine's ``defaults``, the settings file's, then
    ``--invariants FILE``'s; by id, later replacing earlier."""
    from capturelint.invariants import in_force, read_invariants_file

    cli = read_invariants_file(invariants_file) if invariants_file is not None else ()
    return in_force(tuple(defaults), settings.invariants or (), cli)


# ------------------------------------------------------------ configurations


def engine_config(plan: CheckPlan, runner: str, mode: str) -> Any:
    from capturelint.engine.config import EngineConfig

    kw: dict = dict(
        runner=runner,
        platform=plan.platform,
        cudagraph_mode=CUDAGraphMode.parse(mode),
        eager_region=plan.eager_region,
        fresh_metadata=plan.fresh_metadata,
        kernels=plan.kernels,
        seed=plan.seed,
        copy_break_outputs=plan.copy_break_outputs,
    )
    if plan.layers is not None:
        kw["num_layers"] = plan.layers
    if plan.steps is not None:
        kw["steps"] = plan.steps
    return EngineConfig(**kw).validate()


def configuration(plan: CheckPlan, runner: str, mode: str) -> Configuration:
    """Build the engine for one runner and mode, and describe it to the pipeline."""
    from capturelint.engine.llm import Engine, compare

    cfg = engine_config(plan, runner, mode)
    engine = Engine(cfg)

    def twin(output: Any) -> TwinResult:
        eager = eager_run(cfg.eager_twin()) if plan.reuse else Engine(cfg.eager_twin()).generate()
        agreement, logit_error = compare(output, eager)
        return TwinResult(agreement, logit_error)

    roots = {"model": engine.model, "state": list(engine.runner.named_state_tensors())}
    return Configuration(RunLabel(runner, mode), engine.generate, roots, str(cfg.effective_eager_region),
                         forward_context_probe, layer_scope_group, twin, require_replays=True,
                         eager_region_option=plan.eager_region, invariants=plan.invariants,
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


def run_configuration(plan: CheckPlan, runner: str, mode: str, shadow: bool = True, static: bool = False) -> ConfigReport:
    """Trace one runner and mode; with ``shadow`` also check every replay step and run
    the eager twin for the numerical oracle. Without it, only the captures are
    recorded (what region maps and diffs need). ``static`` captures every graph
    (``Engine.capture_model``, no generation) and checks the invariants and host syncs."""
    return check_configuration(configuration(plan, runner, mode), plan.codes, shadow=shadow, static=static)


def run_check(plan: CheckPlan, progress: Callable[[str], None] | None = None, shadow: bool = True,
              static: bool = False, keep_captures: bool = False) -> Report:
    """Run the plan's configurations (``plan.jobs`` at once, in worker processes)."""
    from capturelint.pipeline import Task, run_all

    def task(runner: str, mode: str) -> Task:
        def run() -> ConfigReport:
            if static:
                return run_configuration(plan, runner, mode, shadow=False, static=True)
            return run_configuration(plan, runner, mode, shadow=shadow)

        return Task(f"runner {runner} · {mode}", run)

    tasks = [task(r, m) for r, m in plan.configurations]
    if plan.reuse and shadow and not static and plan.jobs > 1 and len(tasks) > 1 and not keep_captures:
        _prepare_twins(plan)
    return Report(run_all(tasks, plan.jobs, progress, keep_captures), invariants=plan.invariants, static=static)


def suggest_slots(plan: CheckPlan) -> list[Any]:
    """``capturelint suggest``: the plan's configurations, then the same modes under the
    runners the plan leaves out (checked only to cross-check a suggestion: a region
    right under one runner can be wrong under the other). Each check builds a fresh
    engine, so it picks up the functions made eager breaks at that moment."""
    from capturelint.suggest import Slot

    slots = []
    for runner in plan.runners + tuple(r for r in RUNNERS if r not in plan.runners):
        for mode in plan.modes:
            def check(runner: str = runner, mode: str = mode) -> ConfigReport:
                return check_configuration(configuration(plan, runner, mode), plan.codes)

            slots.append(Slot(f"{runner}/{mode}", runner, mode, check, requested=runner in plan.runners))
    return slots


def record_regions(plan: CheckPlan, progress: Callable[[str], None] | None = None) -> Any:
    """Run every configuration of the plan recording captures only (no shadow): the
    region map that ``snapshot`` writes and ``diff`` compares."""
    from capturelint.snapshot import region_map

    return region_map(run_check(plan, progress, shadow=False), plan)


__all__ = [
    "CHECK_MODES", "CheckPlan", "REGIONS", "RUNNERS", "configuration", "default_runner", "engine_config",
    "forward_context_probe", "layer_scope_group", "make_plan", "record_regions", "run_check", "run_configuration",
    "suggest_slots",
]
