"""Runs an engine under the tracer and turns what it saw into findings.

``trace_run`` works on any engine whose captures a capture runtime announces
(capturelint's breakable runtime, the emulated ``torch.cuda.CUDAGraph``, or an
adapter's bridge to another runtime): give it a callable that captures and replays
(e.g. a generation loop) and the objects that hold the engine's tensors, and it returns
the findings and the numerical oracle for that configuration, and what it checked: the
rules that had something to check, the replay steps shadowed and the bare-graph replays
that were not. The check pipeline
(``capturelint.pipeline``) uses it for every adapter.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from typing import Any, Callable, Iterator, Sequence

import torch

from capturelint.analyzer import Analyzer, EnteredAt, RunLabel, RunOutcome
from capturelint.errors import CapturelintError
from capturelint.hosting import called, exit_call, hosted
from capturelint.findings import Finding
from capturelint.records import ContextProbe, MalformedStream, ScopeGroup, Stream, linting
from capturelint.rules import RULES
from capturelint.runtime import frames
from capturelint.runtime.protocol import HostSyncEvent, HostSyncInCaptureError, StreamCaptureError
from capturelint.tracer import Tracer

frames.register_runtime_file(__file__)


@dataclasses.dataclass(frozen=True)
class TwinResult:
    """An eager twin's verdict on a run's output: token agreement (engines that
    generate tokens) and the largest difference of compared values."""

    token_agreement: float | None
    max_error: float | None
    entered: EnteredAt | None = None  # the break where a divergence from the twin enters (CL901's location)


@dataclasses.dataclass
class TraceResult:
    """What one traced run of one configuration produced."""

    label: RunLabel
    findings: list[Finding]
    captures: list[Stream]
    replay_steps: int
    max_step_error: float
    output: Any = None
    capture_failed: bool = False
    twin: TwinResult | None = None
    invariant_selected: dict[str, int] = dataclasses.field(default_factory=dict)
    shadowed_steps: int = 0  # replay steps compared with their eager shadow
    bare_replays: int = 0  # replays of bare graphs: no shadow, freed inputs checked only
    rules_checked: tuple[str, ...] = ()  # structural rules that had something to check (Analyzer.rules_checked)
    rules_unchecked: tuple[str, ...] = ()  # selected structural rules that had nothing to check
    failure: str = "a host synchronisation"  # what the capture failed on, when it did
    replayed_graphs: tuple[tuple[str, int], ...] = ()  # shadowed replay steps per graph label (Tracer.replayed_graphs)
    unchecked_graphs: tuple[str, ...] = ()  # runtimes that captured CUDA graphs on their own, and where


@contextlib.contextmanager
def quiet_gc() -> Iterator[None]:
    """A traced run makes a record object per op; Python's cyclic collector would walk
    every object alive (torch, the engine, the records so far) each time enough of them
    accumulate, and that grows with the run. For the run, what was alive before it is
    frozen (never walked; vLLM freezes it for capture too) and the youngest generation
    is collected 50x less often; both are restored after."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(thresholds[0], 1) * 50, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def _linted(on_step: Callable[[Stream, Stream, float], None]) -> Callable[[Stream, Stream, float], None]:
    """``on_step`` after linting the step's shadow (``Stream.lint``), before the tracer
    lets go of it."""
    def step(capture: Stream, shadow: Stream, error: float) -> None:
        shadow.lint()
        on_step(capture, shadow, error)

    return step


def trace_run(
    run: Callable[[], Any],
    roots: dict[str, Any],
    label: RunLabel,
    select: frozenset[str] | None = None,
    shadow: bool = True,
    probe: ContextProbe | None = None,
    scope_group: ScopeGroup | None = None,
    twin: Callable[[Any], TwinResult] | None = None,
    rules: Sequence[type] | None = None,
    invariants: Sequence[Any] = (),
) -> TraceResult:
    """Run ``run()`` under the tracer; analyze every replay step against its shadow.

    ``twin(output)``, when given, compares the run's output with an eager twin's after
    the traced run. A host synchronisation that makes the capture fail becomes a CL106
    finding, a wait or fork that CUDA refuses across a capture boundary a CL112 one (the
    run stops there, as it would on a GPU); any other exception from the
    engine is a ``CapturelintError`` naming the configuration. ``invariants``
    (``capturelint.invariants.Invariant``) are checked on every capture's region graph
    by the CL2xx rules.
    """
    codes = select if select is not None else frozenset(r.code for r in RULES)
    analyzer = Analyzer(label, [r for r in (rules or RULES) if r.code in codes], invariants)
    lint = linting()  # every stream checked as it is recorded (tests, --debug): Stream.lint
    tracer = Tracer(roots, on_step=_linted(analyzer.on_step) if lint else analyzer.on_step, shadow=shadow, probe=probe, scope_group=scope_group,
                    on_stale=analyzer.on_stale, on_bare=analyzer.on_bare, on_hazard=analyzer.on_hazard)
    output = None
    host_sync: HostSyncEvent | None = None
    refused = False
    try:
        with quiet_gc(), tracer, hosted():
            output = run()
    except (HostSyncInCaptureError, StreamCaptureError, CapturelintError) as raised:
        # An engine may wrap the runtime's error in its own one-line error; unwrap it.
        e = raised if isinstance(raised, (HostSyncInCaptureError, StreamCaptureError)) else raised.__cause__
        if isinstance(e, StreamCaptureError):
            analyzer.on_hazard(e.event, tracer.captures)
            refused = True
        elif isinstance(e, HostSyncInCaptureError):
            host_sync = dataclasses.replace(e.event, stack=frames.capture_stack(e.event.stack, tracer.entry_stack))
        else:
            raise
    except SystemExit as e:  # a check that did not finish has no verdict, whatever the code
        raise CapturelintError(
            f"the engine called {called(e)} under runner {label.runner}, mode {label.mode}, so the check could "
            f"not finish and has no verdict; remove the {exit_call(e)} call"
        ) from None
    except MalformedStream:  # the tracer's bug, not the engine's
        raise
    except Exception as e:  # an engine bug: say which configuration and what, no traceback
        limit = frames.limit_of(e)
        if limit is not None:  # not the engine's: say which limit of capturelint it met
            raise CapturelintError(
                f"under runner {label.runner}, mode {label.mode} the check met a limit of capturelint, not a bug of the "
                f"engine: {limit}"
            ) from e
        raise CapturelintError(
            f"the engine raised {type(e).__name__} under runner {label.runner}, mode {label.mode} at "
            f"{frames.traceback_frame(e)}: {e}; this is a bug of the engine, not a replay hazard: fix it and run again"
        ) from e
    if tracer.unseen:
        labels = ", ".join(sorted(set(tracer.unseen.values())))
        raise CapturelintError(
            f"under runner {label.runner}, mode {label.mode} the engine replayed graph(s) {labels} captured before "
            "tracing began, so their replays cannot be checked; capture inside the traced run (a Target's run())"
        )
    for capture in tracer.captures.values():
        if lint:
            capture.lint()
        analyzer.check_capture(capture)
    steps = analyzer.steps or tracer.replays
    failed = host_sync is not None or refused
    verdict = twin(output) if twin is not None and not failed and shadow else None
    outcome = RunOutcome(
        label, tuple(analyzer.findings.sorted()), host_sync, steps, analyzer.max_step_error,
        verdict.token_agreement if verdict else None, verdict.max_error if verdict else None,
        verdict.entered if verdict else None,
    )
    findings = analyzer.finish(outcome)
    checked, unchecked = analyzer.rules_checked(("check_stale", "check_bare", "check_hazard") if tracer.bare_replays else ())
    return TraceResult(label, findings, list(tracer.captures.values()), steps, analyzer.max_step_error, output,
                       failed, verdict, dict(analyzer.invariant_selected), analyzer.steps,
                       tracer.bare_replays, checked, unchecked,
                       "a stream or event crossing a capture boundary" if refused else "a host synchronisation",
                       tuple(tracer.replayed_graphs.items()), tuple(tracer.unchecked_graphs))


__all__ = ["TraceResult", "TwinResult", "trace_run"]
