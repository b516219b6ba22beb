"""capturelint from Python: ``check``, ``show`` and ``suggest`` with the options of the
command line, returning the report instead of printing it.

The click commands (``capturelint.commands``) are a thin layer over these functions: they
parse the command line, call the function and render what it returns, so a script, a
notebook or a test suite gets the same verdicts as ``capturelint check``::

    >>> from capturelint import api
    >>> report = api.check(runner="v1", eager_region="narrow", modes="PIECEWISE", layers=1, steps=6)
    >>> sorted({f.code for f in report.findings})  # a replay of another branch; an op outside its region
    ['CL101', 'CL201']
    >>> api.check(runner="v2", modes="PIECEWISE", layers=1, steps=6).assert_clean()  # passes

Options are the command line's, by their Python names (``eager_region`` for
``--eager-region``; ``modes`` is read as ``mode``), spelled as on the command line
(``runner="v1"`` or ``"all"``, ``mode="PIECEWISE,FULL"`` or ``("PIECEWISE", "FULL")``,
``eager_region="narrow"``) or given as the parsed values (``capturelint.options``); an
engine family's own options too (``capture_sizes=[2, 4]`` for ``--engine vllm``). Each is
parsed by the function the command line and the settings use
(``capturelint.options.parse_option``). Bad input (an unknown keyword, a value of the
wrong type or out of range) raises ``capturelint.errors.CapturelintError`` with one line
naming the keyword as given here.
Warnings go to stderr, as the CLI says them. Nothing here imports torch until a function
runs an engine.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from capturelint import __version__
from capturelint.adapters import registry
from capturelint.errors import CapturelintError
from capturelint.common_options import BY_NAME
from capturelint.options import CUDAGraphMode, EngineOptions, OptionProblem, OptionSpec, Surface, parse_option
from capturelint.output import stderr_console
from capturelint.settings import Settings

if TYPE_CHECKING:
    from capturelint.adapters.registry import CheckPlan
    from capturelint.report import Report
    from capturelint.suggest import SuggestReport


def say(text: str) -> None:
    """One line on stderr (summaries, what was written)."""
    stderr_console().print(text, highlight=False, soft_wrap=True, markup=False)


def warn(text: str) -> None:
    say(f"capturelint: warning: {text}")


class ProgressReporter:
    """Progress on stderr over the configurations of a run, where people wait (a
    configuration takes from seconds to minutes); never on stdout, which carries the
    report alone.

    - On a terminal, a Rich bar (transient) that names every configuration running (all
      of them under ``--jobs``), with the count finished and the time elapsed.
    - Off a terminal (a CI log) while a command runs (``capturelint.output.TERMINAL``),
      one plain line per configuration finished: what, its verdict, its seconds::

          capturelint: runner v1 · PIECEWISE: 2 findings, replay DIFFERS (12.3 s) [1/4]

    - ``unbounded`` (``suggest``, whose number of runs is not known ahead): a spinner
      naming the run and the candidate being tried instead of a bar with a total, and off
      a terminal a line per run started.
    - Nothing with ``--quiet`` (or ``CAPTURELINT_QUIET=1``), and from the Python API
      nothing off a terminal.

    The check pipeline calls ``running(labels)`` and ``finished(label, report, seconds)``
    (``capturelint.pipeline.run_all``); ``__call__(label)`` is the older protocol of a
    callable that hears each configuration as it starts."""

    def __init__(self, total: int, unbounded: bool = False):
        from capturelint.output import TERMINAL

        tty = sys.stderr.isatty()
        self.bar = not TERMINAL.quiet and tty and total >= 1
        self.lines = not TERMINAL.quiet and not tty and TERMINAL.lines and total >= 1
        self.enabled = self.bar or self.lines
        self.unbounded = unbounded
        self.progress: Any = None
        self.total = total
        self.finished_count = 0
        self.runs = 0
        self.task: Any = None

    def __enter__(self) -> "ProgressReporter":
        if self.bar:
            from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            if self.unbounded:
                columns: tuple[Any, ...] = (SpinnerColumn(), TextColumn("[bold]capturelint[/] {task.description}"),
                                            TimeElapsedColumn())
            else:
                columns = (TextColumn("[bold]capturelint[/] {task.description}"), BarColumn(),
                           TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn())
            self.progress = Progress(*columns, console=stderr_console(), transient=True)
            self.progress.__enter__()
            self.task = self.progress.add_task("", total=None if self.unbounded else self.total)
        return self

    def running(self, labels: list[str]) -> None:
        """The configurations running now (one, or ``--jobs`` of them)."""
        if self.progress is not None and labels:
            self.progress.update(self.task, description="checking " + ", ".join(labels))

    def finished(self, label: str, report: Any, seconds: float) -> None:
        """A configuration is done: ``report`` its ``ConfigReport``."""
        self.finished_count += 1
        if self.progress is not None:
            self.progress.advance(self.task)
        elif self.lines:
            say(f"capturelint: {label}: {config_verdict(report)} ({seconds:.1f} s) "
                f"[{self.finished_count}/{self.total}]")

    def __call__(self, description: str) -> None:
        if self.progress is not None:
            if self.progress.tasks[0].description:
                self.progress.advance(self.task)
            self.progress.update(self.task, description=description)

    def trying(self, description: str, total: int | None = None) -> None:
        """``suggest``: a run starts (``total``, the runs planned so far, grows as
        candidates appear, so it is not shown)."""
        self.runs += 1
        if self.progress is not None:
            self.progress.update(self.task, description=f"suggest run {self.runs}: {description}")
        elif self.lines:
            say(f"capturelint: suggest run {self.runs}: {description}")

    def __exit__(self, *exc: Any) -> None:
        if self.progress is not None:
            self.progress.__exit__(*exc)


def config_verdict(report: Any) -> str:
    """A configuration's verdict in a few words (a progress line): its findings, and
    whether replay was compared with eager execution and matched."""
    n = len(report.findings)
    differs = report.diverged
    if n:
        return f"{n} finding{'s' * (n != 1)}" + (", replay DIFFERS from eager" if differs else "")
    if differs:
        return "replay DIFFERS from eager"
    if report.static:
        return "no findings (static: replay not compared)"
    if not report.checked.with_eager:
        return "no findings, replay NOT compared with eager"
    return "no findings, replay matches eager"


# --------------------------------------------------------------------- options

def engine_options(**options: Any) -> EngineOptions:
    """The ``EngineOptions`` of the keyword arguments, spelled or parsed (module
    docstring); an option given a value other than its default is "given" (an engine
    that does not read it says so). ``capturelint.adapters.registry.engine_options``."""
    return registry.engine_options(Surface.API, "engine_options()", **options)


def _checked(caller: str, **values: Any) -> dict[str, Any]:
    """``values`` (keywords of ``caller`` that are no engine's) parsed by their specs;
    ``None`` stays ``None``."""
    return {name: None if value is None else parse_option(BY_NAME[name], value, Surface.API)
            for name, value in values.items()}


def _max_candidates(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000:
        raise OptionProblem("must be an integer from 1 to 1000", "12")
    return value


CHECK_OWN = {"config": None, "static": False, "strict": False, "require_oracle": False, "baseline": None,
             "max_eager_growth": None, "shard": None, "accept_findings": None,
             "update_accepted": False}  # check's own keywords, and their defaults


def check_options(caller: str, **options: Any) -> tuple[dict[str, Any], EngineOptions]:
    """``check``'s keywords, parsed: its own (``CHECK_OWN``) and the engine options; an
    unknown keyword or a bad value is a one-line ``CapturelintError`` naming it as
    ``caller`` takes it (the pytest plugin checks its markers with this)."""
    own = _checked(caller, **{k: options.pop(k, default) for k, default in CHECK_OWN.items()})
    targets = options.pop("targets", None)
    parsed = registry.engine_options(Surface.API, caller, (*CHECK_OWN, "targets"), **options)
    return own, with_targets(parsed, targets, caller)


def with_targets(options: EngineOptions, targets: Any, caller: str) -> EngineOptions:
    """``options`` with the API's ``targets=``: ``Target`` objects, a function returning
    them, or ``FILE.py:FUNCTION`` specs (relative to the project root); ``None``: not
    given. The target adapter takes them apart (``capturelint.adapters.plain.target.sources_of``:
    a kind of value none of these is a one-line error there)."""
    if targets is None:
        return options
    if isinstance(targets, (list, tuple)) and not targets:
        raise CapturelintError(f"{caller} got targets=[]; give Target objects (capturelint.target.Target), a function "
                               "returning them, or FILE.py:FUNCTION specs")
    if options.target is not None:
        raise CapturelintError(f"{caller} got target= and targets=; give one of them")
    return dataclasses.replace(options, targets=targets)


MAX_CANDIDATES = OptionSpec("max_candidates", _max_candidates, "Try at most N regions.", "", key=None)


def plan_for(settings: Settings, options: EngineOptions) -> CheckPlan:
    """The plan of ``options`` over ``settings``, from the adapter registry; the plan's
    warnings are said here."""
    plan = registry.make_plan(settings, options)
    for text in plan.warnings:
        warn(text)
    return plan


# ------------------------------------------------------------------------ check

def check(*, config: str | None = None, static: bool = False, strict: bool = False, require_oracle: bool = False,
          baseline: str | None = None, max_eager_growth: float | None = None, shard: str | None = None,
          accept_findings: str | None = None, update_accepted: bool = False, **options: Any) -> Report:
    """Check that CUDA-graph replay computes what eager execution computes, as
    ``capturelint check`` does, and return the ``capturelint.report.Report``: its
    ``findings``, its ``configs`` (runner, mode, region, numerical evidence and
    ``checked``: what each compared), ``region_changes`` against ``baseline`` and
    ``summary_line()``. ``report.assert_clean()`` raises ``AssertionError`` with the
    findings when it ``failed``.

    ``options`` are the engine options of ``engine_options`` (``engine``, ``target``,
    ``runner``, ``mode``, ``eager_region``, ``layers``, ``steps``, ``seed``, ``select``,
    ``ignore``, ``invariants``, ``jobs``, ``reuse``, and the engine families' own:
    ``capture_sizes``, ``kernels``, ...); ``config`` is the pyproject.toml to read
    ``[tool.capturelint]`` from (default: the nearest one). ``targets=`` checks your own
    engine: ``Target`` objects, a function returning them, or ``FILE.py:FUNCTION`` specs
    (``with_targets``); in a project whose settings name ``targets``, a call with no
    engine option checks those. Relative paths (``target=``, ``baseline=``) are read
    against the project root (``from_root``)::

        report = check(runner="v1", eager_region="narrow", modes="PIECEWISE", layers=1, steps=6)
        for f in report.findings:
            print(f.code, f.capture_frame, f.message)
        check(target="tests/my_engine.py:targets").assert_clean()
        check(targets=make_targets).assert_clean()      # a function returning Target objects
        check(runner="all", baseline="regions.json", max_eager_growth=5).assert_clean()

    ``accept_findings`` is the accepted-findings file (``capturelint.waivers``: a file
    that does not exist is recorded with the check's findings, ``update_accepted``
    rewrites it); inline ``# capturelint: ignore[CODE]`` comments always apply. The
    report's ``waived`` lists the findings they accepted.
    """
    own, parsed = check_options("check()", config=config, static=static, strict=strict, require_oracle=require_oracle,
                                baseline=baseline, max_eager_growth=max_eager_growth, shard=shard,
                                accept_findings=accept_findings, update_accepted=update_accepted, **options)
    settings = registry.load_settings(own["config"])
    return check_with(settings, parsed, static=own["static"], strict=own["strict"],
                      require_oracle=own["require_oracle"], baseline=from_root(own["baseline"], settings),
                      max_eager_growth=own["max_eager_growth"], shard=own["shard"],
                      accept_findings=own["accept_findings"], update_accepted=own["update_accepted"])


def from_root(path: str | None, settings: Settings) -> str | None:
    """A relative path given to the API, read against the project root (the folder of
    the settings file), as the settings' own paths are: a test then finds its files
    from wherever pytest was started. Without a settings file, against the working
    directory."""
    if path is None or settings.root is None or Path(path).is_absolute():
        return path
    return str(settings.root / path)


def check_with(settings: Settings, options: EngineOptions, *, static: bool = False, strict: bool = False,
               require_oracle: bool = False, baseline: str | None = None, max_eager_growth: float | None = None,
               shard: str | None = None, keep_captures: bool = False, accept_findings: str | None = None,
               update_accepted: bool = False) -> Report:
    """``check`` over loaded ``settings`` and parsed ``options`` (the CLI's entry);
    ``keep_captures`` keeps each configuration's capture streams in the report, for a
    format that draws them (``--format html``; the configurations then run in this
    process, as ``show``'s do)."""
    from capturelint.acceptance import accepted_path, apply, check_writable, whole_check
    from capturelint.shard import ShardInfo, fingerprint, parse_shard, require_selection

    shard_of = parse_shard(shard) if shard is not None else None
    if shard_of is not None and (baseline is not None or max_eager_growth is not None):
        raise CapturelintError(
            "--baseline gates the region map of the whole matrix of configurations, and --shard runs part of it: run "
            "check --baseline without --shard (e.g. in a job of its own), or drop --baseline"
        )
    if max_eager_growth is not None and not (math.isfinite(max_eager_growth) and max_eager_growth >= 0):
        raise CapturelintError(f"--max-eager-growth must be a percentage >= 0, got {max_eager_growth}; e.g. 10")
    baseline_path = baseline or (str(settings.baseline) if settings.baseline else None)
    if static and require_oracle:
        raise CapturelintError("--require-oracle asks for replay compared with eager execution, which --static skips; "
                               "drop one of them")
    if static and (baseline is not None or max_eager_growth is not None):
        raise CapturelintError("--baseline gates the regions of a full check; drop --static, or drop --baseline")
    accept_file = accepted_path(accept_findings, settings.accept_findings)
    if update_accepted and accept_file is None:
        raise CapturelintError("--update-accepted rewrites the accepted-findings file, and none is given; add "
                               "--accept-findings FILE (or accept-findings in settings)")
    if accept_file is not None:
        check_writable(accept_file, update_accepted, shard_of is not None)
    if max_eager_growth is not None and baseline_path is None:
        raise CapturelintError("--max-eager-growth is the budget of --baseline, and no baseline is given; "
                               "add --baseline FILE (or baseline in settings), or drop it")
    plan = plan_for(settings, options)
    if CUDAGraphMode.NONE in plan.modes:
        capturing = ", ".join(str(m) for m in plan.modes if m is not CUDAGraphMode.NONE)
        raise CapturelintError(
            "mode NONE captures no CUDA graph, so there is no replay to compare with eager execution; choose "
            f"modes that capture ({capturing or 'PIECEWISE, FULL, ...'}) or leave --mode out for all of them"
        )
    if static:
        require_static_rules(plan.codes)
    growth = max_eager_growth if max_eager_growth is not None else settings.max_eager_growth
    gate = None
    if baseline_path is not None and shard_of is not None and not static:
        warn(f"the baseline of the settings ({baseline_path}) is not checked by a shard: the gate compares the whole "
             "matrix; run check --baseline without --shard for it")
    elif baseline_path is not None and not static:
        from capturelint.snapshot import load_snapshot

        gate = load_snapshot(baseline_path)  # fail on a bad baseline before running anything
    plan = registry.load(plan)  # a target's engines are built here: its configurations are theirs
    if shard_of is not None:
        labels = [f"{r}/{m}" for r, m in plan.all_configurations]
        require_selection(shard_of, labels, registry.unit(plan))
        plan = dataclasses.replace(plan, shard=shard_of)
    with ProgressReporter(len(plan.configurations)) as progress:
        report = registry.run_check(plan, progress, static=static, keep_captures=keep_captures)
    report.subject = registry.subject(plan)
    if shard_of is not None:
        # everything that shapes the report (not how many jobs ran it), so that merge
        # joins only the shards of one check
        shaped = dataclasses.replace(plan, shard=None, jobs=1, reuse=True)
        check_id = fingerprint(__version__, shaped, static, fallback_uri(settings))
        report.shard = ShardInfo(shard_of[0], shard_of[1], tuple(labels), check_id)
    recorded = apply(report, plan.codes, whole=whole_check(options, static), accept_file=accept_file,
                     update=update_accepted)
    if recorded is not None:
        say(f"capturelint: {recorded.message()}")
    empty = report.empty_invariants
    if empty:
        text = (f"invariant(s) {', '.join(empty)} applied to captured graphs but selected no op: the selector "
                "probably does not say what was meant; see capturelint invariants --explain ID")
        if strict:
            raise CapturelintError(text + " (an error with --strict)")
        warn(text)
    missing = report.oracle_missing("--require-oracle" if require_oracle else "[tool.capturelint] require-oracle")
    if missing is not None and (require_oracle or settings.require_oracle):
        raise CapturelintError(missing)
    if gate is not None:
        from capturelint.baseline import compare_report

        report.region_changes = compare_report(gate, report, plan, growth or 0.0)
    return report


def fallback_uri(settings: Settings) -> str:
    """A result without a location is rejected by GitHub's upload; CL901 has no source
    line, so SARIF points it at the configuration file that asked for the check."""
    return str(settings.source.name) if settings.source else "pyproject.toml"


def require_static_rules(codes: frozenset[str]) -> None:
    """``--static`` runs only the rules a capture alone can check; a selection of none of
    them would check nothing and pass."""
    from capturelint.rules import STATIC_CODES

    if not codes & STATIC_CODES:
        chosen = ", ".join(sorted(codes)) or "none"
        raise CapturelintError(
            f"nothing to check: check --static runs only {', '.join(sorted(STATIC_CODES))} (host syncs at capture and "
            f"declared invariants), and the rules selected are {chosen}; select some of those, or drop --static for "
            "the full check"
        )


# ------------------------------------------------------------------ show, suggest

def show(*, config: str | None = None, no_check: bool = False, **options: Any) -> Report:
    """Record the regions of each runner and mode, as ``capturelint show`` does, and
    return the report with its captures kept (``no_check``: captures only, no findings);
    ``capturelint.render.view.report_views(report)`` turns it into the views drawn::

        report = show(runner="v1", modes="PIECEWISE", layers=1, steps=6)
        print([g.label for c in report.configs for g in c.graphs])
    """
    own = _checked("show", config=config)
    no_check = parse_option(dataclasses.replace(BY_NAME["static"], name="no_check"), no_check, Surface.API)
    targets = options.pop("targets", None)
    parsed = with_targets(registry.engine_options(Surface.API, "show()", ("config", "no_check", "targets"), **options),
                          targets, "show()")
    return show_with(registry.load_settings(own["config"]), parsed, no_check=no_check)


def show_with(settings: Settings, options: EngineOptions, *, no_check: bool = False) -> Report:
    """``show`` over loaded ``settings`` and parsed ``options`` (the CLI's entry)."""
    plan = plan_for(settings, options)
    with ProgressReporter(len(plan.configurations)) as progress:
        report = registry.run_check(plan, progress, shadow=not no_check, keep_captures=True)  # drawn from the captures
    report.subject = registry.subject(plan)
    return report


def suggest(*, config: str | None = None, max_candidates: int = 12,  # capturelint.suggest.DEFAULT_MAX_CANDIDATES
            **options: Any) -> SuggestReport:
    """Find the smallest eager region that makes replay equal eager, as ``capturelint
    suggest`` does, and return the ``capturelint.suggest.SuggestReport`` (``found``,
    ``suggestions`` ranked best first, ``failing``)::

        report = suggest(runner="v1", eager_region="narrow", modes="PIECEWISE", layers=1, steps=6)
        best = report.suggestions[0]
    """
    own = _checked("suggest", config=config)
    max_candidates = parse_option(MAX_CANDIDATES, max_candidates, Surface.API)
    targets = options.pop("targets", None)
    parsed = with_targets(registry.engine_options(Surface.API, "suggest()", ("config", "max_candidates", "targets"),
                                                  **options), targets, "suggest()")
    return suggest_with(registry.load_settings(own["config"]), parsed, max_candidates=max_candidates)


def suggest_with(settings: Settings, options: EngineOptions, *, max_candidates: int = 12) -> SuggestReport:
    """``suggest`` over loaded ``settings`` and parsed ``options`` (the CLI's entry)."""
    if max_candidates < 1 or max_candidates > 1000:
        raise CapturelintError(f"--max-candidates must be from 1 to 1000, got {max_candidates}")
    plan = plan_for(settings, options)
    if CUDAGraphMode.NONE in plan.modes:
        raise CapturelintError("mode NONE captures no CUDA graph, so there is nothing to suggest; choose modes that "
                               "capture, or leave --mode out for all of them")
    slots = registry.suggest_slots(registry.load(plan))
    from capturelint.suggest import suggest as find

    with ProgressReporter(len(slots), unbounded=True) as progress:
        return find(slots, max_candidates, progress.trying, jobs=plan.jobs)


__all__ = ["check", "check_options", "check_with", "engine_options", "show", "show_with", "suggest", "suggest_with"]
