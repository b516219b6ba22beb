"""The check pipeline: one function for every adapter.

An adapter (``capturelint.adapters``) turns what the user asked for into
``Configuration``\\ s: how to run one configuration of an engine, which objects hold its
tensors, how to read its forward context, how to name scopes, and optionally an eager
twin. ``check_configuration`` traces it, runs the rules, and returns its
``ConfigReport``; ``check_all`` does it for a sequence. Nothing here knows an engine.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Iterable, Sequence

from capturelint.analyzer import RunLabel
from capturelint.errors import CapturelintError
from capturelint.findings import Numerical
from capturelint.harness import TwinResult, trace_run
from capturelint.regions import graph_map
from capturelint.report import ConfigReport, Report
from capturelint.runtime.emulated import emulate_cuda
from capturelint.records import ContextProbe, ScopeGroup


@dataclasses.dataclass(frozen=True)
class Configuration:
    """One configuration of an engine, ready to trace.

    ``run()`` captures and replays (a generation loop) and returns the output that an
    eager twin compares; ``roots`` name the engine's tensors (modules, objects with
    tensor attributes, ``(name, tensor)`` lists); ``probe`` reads its forward context;
    ``scope_group`` maps a module scope to the name prefix of its tensors; ``twin``
    compares ``run()``'s output with an eager run of the same workload.
    ``require_replays`` makes a configuration that replayed nothing an error: a check
    that compared no step proves nothing, and must not read as a pass.
    ``eager_region_option`` is what the user asked for when it differs in kind from the
    region in effect (``per-runner``, which is ``wide`` under V1), for titles.
    ``invariants`` are the declared invariants in force (``capturelint.invariants``);
    ``capture_only()``, where the adapter can give one, captures every graph and
    replays none: static mode runs it instead of ``run()``.
    """

    label: RunLabel
    run: Callable[[], Any]
    roots: dict[str, Any] = dataclasses.field(default_factory=dict)
    eager_region: str = "-"
    probe: ContextProbe | None = None
    scope_group: ScopeGroup | None = None
    twin: Callable[[Any], TwinResult] | None = None
    require_replays: bool = False
    eager_region_option: str | None = None
    invariants: tuple[Any, ...] = ()
    capture_only: Callable[[], Any] | None = None


STATIC_NOTE = ("static mode: only the captures were checked (declared invariants, host syncs); replay "
               "equivalence was NOT checked (no shadow, no eager twin): run check without --static for that")


def check_configuration(config: Configuration, codes: frozenset[str], shadow: bool = True,
                        static: bool = False) -> ConfigReport:
    """Trace one configuration; with ``shadow`` also check every replay step and run
    the eager twin. Without it, only the captures are recorded (what region maps need).
    ``static`` checks captures only, with the rules that need nothing else
    (``capturelint.rules.STATIC_CODES``), running ``capture_only()`` where the adapter
    has one. Runs under the emulated ``torch.cuda`` surface where no CUDA device is
    usable."""
    from capturelint.rules import STATIC_CODES

    label = config.label
    if static:
        shadow = False
        codes = codes & STATIC_CODES
    run = config.capture_only if static and config.capture_only is not None else config.run
    with emulate_cuda():
        result = trace_run(run, config.roots, label, codes, shadow=shadow, probe=config.probe,
                           scope_group=config.scope_group, twin=config.twin, invariants=config.invariants)
    numerical = None
    note = STATIC_NOTE if static else None
    if result.capture_failed:
        note = "the capture failed on a host synchronisation; replay and the numerical oracle did not run"
    elif shadow:
        if result.replay_steps == 0 and config.require_replays:
            raise CapturelintError(
                f"runner {label.runner}, mode {label.mode} captured {len(result.captures)} graph(s) but replayed none, "
                "so no step could be checked and the check would prove nothing; use a mode that captures graphs and "
                "a workload that replays them (more steps)"
            )
        twin = result.twin
        numerical = Numerical(label.runner, label.mode, twin.token_agreement if twin else None, result.max_step_error,
                              twin.max_error if twin else None, result.replay_steps)
    graphs = [graph_map(c) for c in result.captures]
    return ConfigReport(label.runner, label.mode, config.eager_region, result.findings, numerical, graphs,
                        captures=result.captures, note=note, eager_region_option=config.eager_region_option,
                        invariant_selected=result.invariant_selected, static=static)


def check_all(configs: Iterable[Configuration], codes: frozenset[str], shadow: bool = True,
              progress: Callable[[str], None] | None = None, static: bool = False,
              invariants: tuple[Any, ...] = (), jobs: int = 1) -> Report:
    configs = list(configs)
    tasks = [Task(f"{c.label.runner} · {c.label.mode}", functools.partial(check_configuration, c, codes, shadow, static))
             for c in configs]
    return Report(run_all(tasks, jobs, progress), invariants=invariants, static=static)


# ------------------------------------------------------------------ parallel runs


@dataclasses.dataclass(frozen=True)
class Task:
    """One configuration's check, to run here or in a worker process: ``run()`` returns
    its ``ConfigReport``; ``label`` is what the progress bar shows."""

    label: str
    run: Callable[[], ConfigReport]


_JOBS: list[Callable[[], Any]] = []  # what forked workers run, by index (inherited, never pickled)


def _run_job(index: int) -> Any:
    return _JOBS[index]()


def parallel_map(fns: Sequence[Callable[[], Any]], jobs: int, done: Callable[[int], None] | None = None) -> list[Any]:
    """``[fn() for fn in fns]``, in ``min(jobs, len(fns))`` worker processes forked from
    this one when ``jobs > 1``; results (pickled back) in order. ``done(i)`` is called
    as result ``i`` arrives. The functions are inherited by the fork, never pickled, so
    closures over engines and plans work. A worker's exception (a ``CapturelintError``,
    an interrupt) is raised here, and the other workers are stopped. With more than one
    intra-op torch thread (``CAPTURELINT_THREADS``) the functions run here, one after
    another: forking a process whose OpenMP pool has run is not safe."""
    global _JOBS
    import torch

    # A process that has run torch on several intra-op threads (CAPTURELINT_THREADS > 1)
    # has an OpenMP pool that a forked child can deadlock on: run here instead.
    if jobs <= 1 or len(fns) <= 1 or torch.get_num_threads() > 1:
        out = []
        for i, fn in enumerate(fns):
            out.append(fn())
            if done is not None:
                done(i)
        return out
    import multiprocessing

    _JOBS = list(fns)
    pool = multiprocessing.get_context("fork").Pool(min(jobs, len(fns)))
    try:
        out = []
        for i, result in enumerate(pool.imap(_run_job, range(len(fns)))):
            out.append(result)
            if done is not None:
                done(i)
        pool.close()
        return out
    finally:
        pool.terminate()
        pool.join()
        _JOBS = []


def _without_captures(task: Task) -> Callable[[], ConfigReport]:
    # A configuration's capture streams hold the engine's storages; reports and region
    # maps need its findings, numerical oracle and graph maps, not them.
    return lambda: dataclasses.replace(task.run(), captures=[])


def run_all(tasks: Sequence[Task], jobs: int = 1, progress: Callable[[str], None] | None = None,
            keep_captures: bool = False) -> list[ConfigReport]:
    """Run ``tasks`` and return their reports in task order, whatever ``jobs`` is.

    With ``jobs > 1`` (and more than one task) they run in worker processes forked from
    this one (``parallel_map``), which has already imported torch and the engine (workers
    do not import them again) and runs torch on one intra-op thread
    (``CAPTURELINT_THREADS``). Reports come back without their capture streams, in
    serial runs too, unless ``keep_captures`` (``show`` draws them; the tasks then run
    here, since streams hold storages that do not cross processes).
    """
    if keep_captures:
        jobs = 1
    fns = [t.run if keep_captures else _without_captures(t) for t in tasks]
    if progress is not None and tasks:
        progress(tasks[0].label)

    def done(i: int) -> None:
        if progress is not None and i + 1 < len(tasks):
            progress(tasks[i + 1].label)

    return parallel_map(fns, jobs, done)


__all__ = ["Configuration", "Task", "check_all", "check_configuration", "parallel_map", "run_all"]
