"""The check pipeline: one function for every adapter.

An adapter (``capturelint.adapters``) turns what the user asked for into
``Configuration``\\ s: how to run one configuration of an engine, which objects hold its
tensors, how to read its forward context, how to name scopes, and optionally an eager
twin. ``check_configuration`` traces it, runs the rules, and returns its
``ConfigReport``; ``check_all`` does it for a sequence. Nothing here knows an engine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import multiprocessing
import multiprocessing.context
import os
import pickle
import signal
import sys
import time
import traceback
from typing import Any, Callable, Iterable, Iterator, Sequence

from capturelint.analyzer import RunLabel
from capturelint.errors import CapturelintError
from capturelint.findings import Numerical
from capturelint.harness import TwinResult, trace_run
from capturelint.hosting import hosted
from capturelint.regions import graph_map
from capturelint.report import Checked, ConfigReport, Report
from capturelint.runtime.emulated import emulate_cuda
from capturelint.records import ContextProbe, ScopeGroup
from capturelint.waivers import traced_files


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
    replays none: static mode runs it instead of ``run()``. ``subject`` names the
    configuration in errors where "runner R, mode M" does not (``the script prog.py``).
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
    subject: str | None = None
    exercised: Callable[[Any], tuple[str, ...]] | None = None  # run()'s output -> its steps in words (Checked.exercised)


STATIC_NOTE = ("static mode: only the captures were checked (declared invariants, host syncs); replay "
               "equivalence was NOT checked (no shadow, no eager twin): run check without --static for that")


def unchecked_note(where: tuple[str, ...]) -> str:
    """The line that names the graphs a runtime captured on its own (``runtime.unchecked``)."""
    return (f"graphs NOT checked: {', '.join(where)} captures CUDA graphs on its own (CUDA-graph trees), which "
            "capturelint does not trace; their replays were neither checked by the rules nor compared with eager")


def check_configuration(config: Configuration, codes: frozenset[str], shadow: bool = True,
                        static: bool = False) -> ConfigReport:
    """Trace one configuration; with ``shadow`` also check every replay step and run
    the eager twin. Without it, only the captures are recorded (what region maps need).
    ``static`` checks captures only, with the rules that need nothing else
    (``capturelint.rules.STATIC_CODES``), running ``capture_only()`` where the adapter
    has one. Runs under the emulated ``torch.cuda`` surface where no CUDA device is
    usable. The report's ``checked`` says what was looked at and compared; its
    numerical oracle is ``None`` where nothing was compared (no shadowed step, no eager
    twin: a bare graph's replays), rather than an error of 0 over steps never compared."""
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
        note = f"the capture failed on {result.failure}; replay and the numerical oracle did not run"
    elif shadow:
        who = config.subject or f"runner {label.runner}, mode {label.mode}"
        if result.replay_steps == 0 and config.require_replays and not result.captures and result.unchecked_graphs:
            raise CapturelintError(
                f"{who} captured no CUDA graph capturelint can check: {unchecked_note(result.unchecked_graphs)}"
            )
        if result.replay_steps == 0 and config.require_replays and not result.captures:
            raise CapturelintError(
                f"{who} captured no CUDA graph, so nothing was compared and the check would prove nothing; capture "
                "with torch.cuda.CUDAGraph, torch.cuda.graph or torch.cuda.make_graphed_callables, and replay"
            )
        if result.replay_steps == 0 and config.require_replays:
            raise CapturelintError(
                f"{who} captured {len(result.captures)} graph(s) but replayed none, "
                "so no step could be checked and the check would prove nothing; use a mode that captures graphs and "
                "a workload that replays them: steps after the capture (more steps) that fit a captured graph's size"
            )
        twin = result.twin
        if twin is not None or result.shadowed_steps:  # otherwise nothing was compared: no oracle to report
            numerical = Numerical(label.runner, label.mode, twin.token_agreement if twin else None,
                                  result.max_step_error, twin.max_error if twin else None, result.replay_steps)
    if result.unchecked_graphs:  # said in one line, never left out of "matches"
        note = "; ".join(n for n in (note, unchecked_note(result.unchecked_graphs)) if n)
    graphs = [graph_map(c) for c in result.captures]
    checked = Checked(result.rules_checked, result.rules_unchecked, result.shadowed_steps, result.bare_replays,
                      result.twin is not None, _exercised(config, result) if shadow else (),
                      unchecked_graphs=result.unchecked_graphs)
    return ConfigReport(label.runner, label.mode, config.eager_region, result.findings, numerical, graphs,
                        captures=result.captures, note=note, eager_region_option=config.eager_region_option,
                        invariant_selected=result.invariant_selected, static=static, checked=checked,
                        traced=traced_files(result.captures))


def check_all(configs: Iterable[Configuration], codes: frozenset[str], shadow: bool = True,
              progress: Callable[[str], None] | None = None, static: bool = False,
              invariants: tuple[Any, ...] = (), jobs: int = 1, keep_captures: bool = False) -> Report:
    configs = list(configs)
    tasks = [Task(f"runner {c.label.runner} · {c.label.mode}",
                  functools.partial(check_configuration, c, codes, shadow, static)) for c in configs]
    return Report(run_all(tasks, jobs, progress, keep_captures), invariants=invariants, static=static)


# ------------------------------------------------------------------ parallel runs


@dataclasses.dataclass(frozen=True)
class Task:
    """One configuration's check, to run here or in a worker process: ``run()`` returns
    its ``ConfigReport``; ``label`` is what the progress bar shows."""

    label: str
    run: Callable[[], ConfigReport]


_JOBS: list[Callable[[], Any]] = []  # what forked workers run, by index (inherited, never pickled)
_RUNNING: Any = None  # shared with the workers: the pid of the worker running job i, 0 when none
_ENDING_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
_PR_SET_PDEATHSIG = 1  # Linux prctl option: the signal a process gets when its parent dies


@dataclasses.dataclass(frozen=True)
class WorkerError:
    """What a worker sends back when its function raised: plain data, never the exception
    (an exception whose class cannot be rebuilt from its pickle would break the pool).
    A ``CapturelintError`` is raised here again with the same message; anything else is
    a bug of capturelint's, raised here as ``WorkerCrash`` with the worker's
    ``traceback`` (text) as its cause, which ``--debug`` prints."""

    kind: str
    message: str
    capturelint_error: bool
    traceback: str

    def raised_here(self, name: str) -> Exception:
        if self.capturelint_error:
            return CapturelintError(self.message)
        crash = WorkerCrash(f"{self.kind} in the worker process checking {name}: {self.message}")
        crash.__cause__ = WorkerCrash(self.traceback)
        return crash


class WorkerCrash(Exception):
    """A worker's function raised something other than a ``CapturelintError``."""


class _Worker(multiprocessing.context.ForkProcess):
    """A pool worker that never prints: whatever escapes the pool's worker loop (its
    parent gone mid-write, say) ends it silently, and the parent, which sees every dead
    worker, reports it."""

    def run(self) -> None:
        try:
            super().run()
        except BaseException:
            os._exit(1)


class _WorkerContext(multiprocessing.context.ForkContext):
    """The fork context of ``parallel_map``'s pool: it keeps the workers it makes, to
    kill them and to tell how a dead one ended."""

    def __init__(self) -> None:
        self.workers: list[_Worker] = []

    def Process(self, *args: Any, **kwargs: Any) -> _Worker:  # type: ignore[override]  # noqa: N802
        worker = _Worker(*args, **kwargs)
        self.workers.append(worker)
        return worker


def _start_worker(parent: int) -> None:
    """A worker ignores Ctrl-C (the parent takes it and stops the pool), ends on SIGTERM
    and SIGHUP whatever the parent does with them, and dies with its parent. It was
    forked with those signals blocked, so none arrives before its disposition is set."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _ENDING_SIGNALS)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the death signal was armed
        os._exit(0)


def _run_job(index: int) -> bytes | WorkerError:
    """Run job ``index`` in a worker; its result is pickled here, so that one that
    cannot be is an error of this job, not a broken pool."""
    _RUNNING[index] = os.getpid()
    try:
        with hosted():  # os._exit in the job is its error, not a dead worker
            return pickle.dumps(_JOBS[index](), protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as e:
        return WorkerError(type(e).__name__, str(e), isinstance(e, CapturelintError), traceback.format_exc())
    finally:
        _RUNNING[index] = 0


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _ENDING_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a signal that came meanwhile is delivered here


def parallel_map(fns: Sequence[Callable[[], Any]], jobs: int, done: Callable[[int], None] | None = None,
                 names: Sequence[str] | None = None, arrived: Callable[[int, Any], None] | None = None) -> list[Any]:
    """``[fn() for fn in fns]``, in ``min(jobs, len(fns))`` worker processes forked from
    this one when ``jobs > 1``; results (pickled back) in order. ``done(i)`` is called
    as result ``i`` arrives, ``arrived(i, result)`` too. The functions are inherited by the fork, never pickled, so
    closures over engines and plans work. With more than one intra-op torch thread
    (``CAPTURELINT_THREADS``) the functions run here, one after another: forking a
    process whose OpenMP pool has run is not safe.

    **Every fault ends the run, promptly and in one place.** The first error in order
    (what a serial run would raise) is raised here: a ``CapturelintError`` with its
    message (errors come back as ``WorkerError`` data), anything else as ``WorkerCrash``.
    A worker that dies (``os._exit``, a crash, the OOM killer) is a ``CapturelintError``
    naming ``names[i]``, the job it was running. Whatever ends the wait early (an error,
    Ctrl-C, an exception from a signal handler) kills the workers before it propagates.
    Workers ignore Ctrl-C, die with this process (``PR_SET_PDEATHSIG``) and print
    nothing of their own.
    """
    global _JOBS, _RUNNING
    if _workers(jobs, len(fns)) == 1:
        out = []
        for i, fn in enumerate(fns):
            out.append(fn())
            if done is not None:
                done(i)
            if arrived is not None:
                arrived(i, out[-1])
        return out
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    names = list(names) if names is not None else [f"job {i + 1}" for i in range(len(fns))]
    _JOBS, _RUNNING = list(fns), multiprocessing.RawArray("i", len(fns))
    context = _WorkerContext()
    pool = ProcessPoolExecutor(min(jobs, len(fns)), mp_context=context, initializer=_start_worker,
                               initargs=(os.getpid(),))
    out = []
    try:
        with _signals_blocked():  # the workers are forked here
            futures = [pool.submit(_run_job, i) for i in range(len(fns))]
        for i, future in enumerate(futures):
            result = future.result()
            if isinstance(result, WorkerError):
                raise result.raised_here(names[i])
            out.append(pickle.loads(result))
            if done is not None:
                done(i)
            if arrived is not None:
                arrived(i, out[-1])
    except BrokenProcessPool:
        pass  # named below, once the pool has reaped its workers
    finally:
        if len(out) < len(fns):
            for worker in context.workers:
                if worker.pid is not None:
                    worker.kill()
        pool.shutdown(wait=True, cancel_futures=True)
        running, _JOBS, _RUNNING = list(_RUNNING), [], None
    if len(out) < len(fns):
        raise CapturelintError(_dead_worker(context.workers, running, names))
    return out


def _workers(jobs: int, n: int) -> int:
    """How many of ``n`` functions ``parallel_map`` runs at once with ``jobs``."""
    import torch

    # A process that has run torch on several intra-op threads (CAPTURELINT_THREADS > 1)
    # has an OpenMP pool that a forked child can deadlock on: run here instead.
    if jobs <= 1 or n <= 1 or torch.get_num_threads() > 1:
        return 1
    return min(jobs, n)


def _dead_worker(workers: list[_Worker], running: list[int], names: Sequence[str]) -> str:
    """Which job a dead worker was running, how it ended, and what to do."""
    # Once a worker died the pool sends SIGTERM to the others: the dead one ended
    # otherwise, unless a SIGTERM killed it too.
    ended = {w.pid: w.exitcode for w in workers}
    jobs = [(f"the worker process checking {names[i]}", ended.get(pid)) for i, pid in enumerate(running) if pid]
    jobs = jobs or [("a worker process", w.exitcode) for w in workers]  # it died between jobs
    dead = [(who, code) for who, code in jobs if code != -signal.SIGTERM] or jobs
    hint = ("the system kills a process when memory runs out: run fewer --jobs"
            if any(code == -signal.SIGKILL for _, code in dead) else
            "something the check ran ended its process (os._exit, a crash in native code)")
    what = "; ".join(f"{who} {_ended(code)}" for who, code in dead)
    return f"{what} before returning its result, so the check has no verdict; {hint}"


def _ended(code: int | None) -> str:
    if code is None:
        return "died"
    if code >= 0:
        return f"exited with status {code}"
    try:
        return f"was killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"was killed by signal {-code}"


def _exercised(config: Configuration, result: Any) -> tuple[str, ...]:
    """What the run's steps were (``Checked.exercised``): the adapter's words for them
    where it has some, else each graph replayed with a shadow and how often."""
    if result.capture_failed:
        return ()
    if config.exercised is not None and result.output is not None:
        return tuple(config.exercised(result.output))
    return tuple(f"replayed {graph}" + (f" x{n}" if n > 1 else "") for graph, n in result.replayed_graphs)


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
    fns = [_timed(t.run if keep_captures else _without_captures(t)) for t in tasks]
    labels = [t.label for t in tasks]
    running, finished = getattr(progress, "running", None), getattr(progress, "finished", None)
    width = _workers(jobs, len(tasks))

    def announce(start: int) -> None:
        # the pool takes jobs in order: the next `width` unfinished ones are running
        if progress is None or start >= len(tasks):
            return
        if running is not None:
            running(labels[start:start + width])
        else:
            progress(labels[start])

    def arrived(i: int, result: tuple[ConfigReport, float]) -> None:
        if finished is not None:
            finished(labels[i], *result)
        announce(i + 1)

    announce(0)
    return [report for report, _ in parallel_map(fns, jobs, names=labels, arrived=arrived)]


def _timed(fn: Callable[[], ConfigReport]) -> Callable[[], tuple[ConfigReport, float]]:
    """``fn`` returning its result and the seconds it took (where it ran: a worker's)."""

    def run() -> tuple[ConfigReport, float]:
        start = time.monotonic()
        result = fn()
        return result, time.monotonic() - start

    return run


__all__ = ["Configuration", "Task", "WorkerCrash", "WorkerError", "check_all", "check_configuration", "parallel_map",
           "run_all"]
