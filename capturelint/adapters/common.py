"""What every adapter shares: the plan of a check, its resolution from options and
settings, running its configurations, and capturelint's forward-context conventions.

``CheckPlan`` is what a command's options and ``[tool.capturelint]`` settings resolve
into (command line over settings over defaults), once, here (``resolve_plan``): runners,
CUDA-graph modes, the eager region, the workload counts, the rules selected and the
invariants in force. Its values are those of ``capturelint.options``, parsed by the
command line and the settings reader; nothing here parses a string. An adapter adds
what only it knows (its defaults, the options it refuses) and builds its
configurations; ``run_plan`` runs them through the check pipeline, ``slots`` hands them
to ``capturelint suggest``. This module imports no adapter, and nothing heavy when it is
imported (the commands' ``-h`` stays free of torch).

**Forward-context conventions** (capturelint's runtime; vLLM's are the same, so they
live here and not in any rule): ``attn_metadata`` is a dict keyed by layer-cache prefix
on real steps and ``None`` on profile and dummy runs; module scopes ``...layers.N...``
own the metadata entries ``attn_metadata['layers.N....']``. ``forward_context_probe`` and
``layer_scope_group`` encode them; ``--target`` engines built on capturelint's runtime use
them too.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

from capturelint.errors import CapturelintError
from capturelint.limits import count_problem, seed_problem
from capturelint.options import DEFAULT_ENGINE, CUDAGraphMode, EagerRegion, EngineOptions, Runner
from capturelint.records import ContextSnapshot, ContextSummary
from capturelint.runtime.forward_context import get_forward_context, has_forward_context
from capturelint.settings import Settings, merge

if TYPE_CHECKING:
    from capturelint.report import ConfigReport, Report
    from capturelint.snapshot import RegionMap
    from capturelint.suggest import BreakDecorator, Slot

_LAYER = re.compile(r"layers\.\d+")

K = TypeVar("K")
CheckOne = Callable[..., "ConfigReport"]  # (plan, runner, mode, shadow=, static=) -> its report


# ------------------------------------------------------------- forward context


def forward_context_probe() -> ContextSnapshot:
    """Reads capturelint's forward context: whether ``attn_metadata`` is a dict (a real
    step, or a capture with metadata) or ``None`` (a dummy or profile run), and the
    metadata's tensors by path (``attn_metadata['layers.0.swa'].slot_mapping``)."""
    from capturelint.objects import named_tensors

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


def runtime_break() -> BreakDecorator:
    """capturelint's ``@eager_break_during_capture``: what makes a function an eager
    break in engines built on capturelint's runtime (``suggest`` applies it, and writes
    it in patches)."""
    from capturelint.runtime.breakable import eager_break_during_capture
    from capturelint.suggest import BreakDecorator

    return BreakDecorator(eager_break_during_capture, "eager_break_during_capture",
                          "from capturelint.runtime.breakable import eager_break_during_capture")


# ------------------------------------------------------------------ the plan


@dataclasses.dataclass(frozen=True)
class CheckPlan:
    """Every configuration a command will run, fully resolved.

    ``engine`` names the adapter that runs it (``capturelint.adapters.registry``);
    ``sources`` say where a user's targets come from (``--target SPEC``, the ``targets``
    setting, the API's objects: ``capturelint.adapters.plain.target.Source``); ``knobs`` the engine family's
    own options (its frozen record, ``resolve_knobs``), which only its adapter reads. ``configured`` holds the
    configurations an adapter found itself (a target's), where ``runners`` x ``modes``
    do not say them; ``loaded`` is what its adapter built when it loaded the plan (a
    target's factory and targets) and ``warnings`` what the command says before it runs;
    neither takes part in comparing plans or in their fingerprint.
    """

    runners: tuple[Runner, ...] = ()
    modes: tuple[CUDAGraphMode, ...] = ()
    eager_region: EagerRegion = EagerRegion.PER_RUNNER
    layers: int | None = None
    steps: int | None = None
    seed: int = 0
    codes: frozenset[str] = frozenset()
    engine: str = DEFAULT_ENGINE
    invariants: tuple[Any, ...] = ()  # declared invariants in force (capturelint.invariants.Invariant)
    shard: tuple[int, int] | None = None  # (K, N): run the K-th of N deterministic slices (1-based)
    jobs: int = 1  # configurations checked at once, in worker processes
    reuse: bool = True  # share identical work between configurations (the eager twins)
    target: str | None = None  # capturelint run's script
    sources: tuple[Any, ...] = ()  # a user's targets: where they come from (capturelint.adapters.plain.target.Source)
    knobs: Any = None  # the engine family's own options, resolved: its frozen knobs record (resolve_knobs)
    configured: tuple[tuple[str, str], ...] | None = None  # (runner, mode) as the adapter names them
    warnings: tuple[str, ...] = dataclasses.field(default=(), compare=False)
    loaded: Any = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def all_configurations(self) -> list[tuple[Any, Any]]:
        """Every configuration of the plan, in report order (runners, then modes):
        ``(Runner, CUDAGraphMode)``, or the adapter's own pairs (``str()`` of either is
        its label)."""
        if self.configured is not None:
            return list(self.configured)
        return [(r, m) for r in self.runners for m in self.modes]

    @property
    def configurations(self) -> list[tuple[Any, Any]]:
        """The configurations this run checks: all of them, or its shard's: the K-th of
        every N in report order, so the shards of one plan partition it."""
        from capturelint.shard import select

        return select(self.all_configurations, self.shard)


def check_counts(layers: int | None, steps: int | None, seed: int | None) -> None:
    """``--layers``, ``--steps`` and ``--seed`` in range, or a one-line error."""
    for name, value in (("layers", layers), ("steps", steps)):
        problem = None if value is None else count_problem(name, value)
        if problem is not None:
            raise CapturelintError(f"--{name} {problem}, got {value}")
    if seed is not None and (problem := seed_problem(seed)) is not None:
        raise CapturelintError(f"--seed {problem}, got {seed}")


def resolve_knobs(knobs: type[K], settings: Settings, options: EngineOptions) -> K:
    """The engine family's knobs record (a frozen dataclass whose fields are its options'
    names): each field its option given (``options.family``) over its setting
    (``settings.family``) over the record's default."""
    values = {f.name: merge(options.value(f.name), settings.value(f.name), None) for f in dataclasses.fields(knobs)}
    return knobs(**{name: value for name, value in values.items() if value is not None})


def resolve_codes(options: EngineOptions, settings: Settings) -> frozenset[str]:
    """The rule codes selected: ``--select``/``--ignore`` over the settings'."""
    from capturelint.rules import select_codes

    return select_codes(list(options.select) or list(settings.select or ()),
                        list(options.ignore) or list(settings.ignore or ()))


def resolve_invariants(settings: Settings, invariants_file: str | None = None,
                       defaults: Sequence[Any] = ()) -> tuple[Any, ...]:
    """The invariants in force: the engine's ``defaults``, the settings file's, then
    ``--invariants FILE``'s; by id, later replacing earlier."""
    from capturelint.invariants import in_force, read_invariants_file

    cli = read_invariants_file(invariants_file) if invariants_file is not None else ()
    return in_force(tuple(defaults), settings.invariants or (), cli)


def resolve_plan(settings: Settings, options: EngineOptions, engine: str, *,
                 default_runners: Callable[[], tuple[Runner, ...]], default_modes: tuple[CUDAGraphMode, ...],
                 invariants: Callable[[], Sequence[Any]],
                 mode_refused: Callable[[CUDAGraphMode], str | None] = lambda mode: None,
                 check_runners: Callable[[tuple[Runner, ...]], None] = lambda runners: None, **fields: Any) -> CheckPlan:
    """The plan of ``engine``: runners (``--runner`` over settings over
    ``default_runners()``), modes (over ``default_modes``; ``mode_refused(mode)`` is the
    error for one the engine cannot check), the eager region (over ``per-runner``), the
    workload counts, the rules selected, and the invariants in force (``invariants()``,
    the engine's defaults unless ``options.default_invariants`` is false, then settings
    and ``--invariants FILE``). ``check_runners`` may refuse options given the runners;
    ``fields`` are the adapter's own plan values. Every value arrives parsed
    (``capturelint.options``)."""
    runners = options.runners or settings.runners or default_runners()
    modes = options.modes or settings.modes or default_modes
    for mode in modes:
        refused = mode_refused(mode)
        if refused is not None:
            raise CapturelintError(refused)
    check_counts(options.layers, options.steps, options.seed)
    check_runners(runners)
    return CheckPlan(
        runners=tuple(dict.fromkeys(runners)),
        modes=tuple(dict.fromkeys(modes)),
        eager_region=merge(options.eager_region, settings.eager_region, EagerRegion.PER_RUNNER),
        layers=merge(options.layers, settings.layers, None),
        steps=merge(options.steps, settings.steps, None),
        seed=merge(options.seed, settings.seed, 0),
        codes=resolve_codes(options, settings),
        engine=engine,
        invariants=resolve_invariants(settings, options.invariants_file,
                                      invariants() if options.default_invariants else ()),
        **fields,
    )


# ------------------------------------------------------------ running a plan


def run_plan(plan: CheckPlan, check_one: CheckOne, progress: Callable[[str], None] | None = None, shadow: bool = True,
             static: bool = False, keep_captures: bool = False, title: str = "") -> Report:
    """Check the plan's configurations with ``check_one(plan, runner, mode, shadow=,
    static=)`` (``plan.jobs`` at once, in worker processes); ``static`` checks the
    captures only; ``keep_captures`` keeps the capture streams in the reports (they are
    then run in this process). ``title`` starts each configuration's progress line."""
    from capturelint.pipeline import Task, run_all
    from capturelint.report import Report

    tasks = [Task(f"{title}runner {r} · {m}", functools.partial(check_one, plan, r, m, shadow=shadow and not static,
                                                                 static=static)) for r, m in plan.configurations]
    return Report(run_all(tasks, plan.jobs, progress, keep_captures), invariants=plan.invariants, static=static)


def region_map_of(report: Report, plan: CheckPlan) -> RegionMap:
    """The region map of a run recorded without the shadow: what ``snapshot`` writes and
    ``diff`` compares."""
    from capturelint.snapshot import region_map

    return region_map(report, plan)


def slots(plan: CheckPlan, check: Callable[[CheckPlan, Runner, CUDAGraphMode], ConfigReport],
          decorator: BreakDecorator) -> list[Slot]:
    """``capturelint suggest``: the plan's configurations, then the same modes under the
    runners the plan leaves out (checked only to cross-check a suggestion: a region
    right under one runner can be wrong under the other). ``check`` builds a fresh
    engine, so it picks up the functions made eager breaks (with ``decorator``) at that
    moment."""
    from capturelint.suggest import Slot

    out = []
    for runner in plan.runners + tuple(r for r in Runner if r not in plan.runners):
        for mode in plan.modes:
            out.append(Slot(f"{runner}/{mode}", str(runner), str(mode), functools.partial(check, plan, runner, mode),
                            decorator, requested=runner in plan.runners))
    return out


__all__ = [
    "CheckPlan", "check_counts", "forward_context_probe", "layer_scope_group", "region_map_of",
    "resolve_codes", "resolve_invariants", "resolve_knobs", "resolve_plan", "run_plan", "runtime_break", "slots",
]
