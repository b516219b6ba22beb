"""Runs an engine under the tracer and turns what it saw into findings.

``trace_run`` works on any engine built with capturelint's capture runtime
(``CUDAGraphWrapper`` or ``BreakableGraph`` plus ``@eager_break_during_capture``): give
it a callable that captures and replays (e.g. a generation loop) and the objects that
hold the engine's tensors, and it returns the findings and the numerical oracle for that
configuration. ``capturelint check`` uses it on the bundled engine.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from capturelint.analyzer import Analyzer, FindingSet, RunLabel
from capturelint.engine import cudagraph as rt
from capturelint.engine.cudagraph import HostSyncInCaptureError
from capturelint.errors import CapturelintError
from capturelint.findings import Finding, Frame
from capturelint.rules import BY_CODE, STEP_RULES
from capturelint.rules.cl106_host_sync_in_capture import HostSyncInCapture
from capturelint.rules.cl901_unexplained_divergence import STEP_TOLERANCE, UnexplainedDivergence
from capturelint.tracer import Stream, Tracer

rt.register_runtime_file(__file__)


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


def trace_run(
    run: Callable[[], Any],
    roots: dict[str, Any],
    label: RunLabel,
    select: frozenset[str] | None = None,
    shadow: bool = True,
) -> TraceResult:
    """Run ``run()`` under the tracer; analyze every replay step against its shadow.

    A host synchronisation that makes the capture fail becomes a CL106 finding (the run
    stops there, as it would on a GPU); any other exception from the engine is a
    ``CapturelintError`` naming the configuration.
    """
    codes = select if select is not None else frozenset(BY_CODE)
    analyzer = Analyzer(label, [r for r in STEP_RULES if r.code in codes])
    tracer = Tracer(roots, on_step=analyzer.on_step, shadow=shadow)
    output = None
    failed = False
    try:
        with torch.no_grad(), tracer:
            output = run()
    except (HostSyncInCaptureError, CapturelintError) as raised:
        # An engine may wrap the runtime's error in its own one-line error; unwrap it.
        e = raised if isinstance(raised, HostSyncInCaptureError) else raised.__cause__
        if not isinstance(e, HostSyncInCaptureError):
            raise
        failed = True
        if HostSyncInCapture.code in codes:
            file, _, rest = e.frame.partition(":")
            line, _, function = rest.partition(" in ")
            frame = Frame(file, int(line) if line.isdigit() else 0, function)
            analyzer.findings.add(
                HostSyncInCapture().make(
                    label, e.graph, e.runtime_mode, f"{e.graph} #{e.segment} captured", e.segment, e.op, "", frame
                )
            )
    except Exception as e:  # an engine bug: say which configuration and what, no traceback
        where = rt.format_frame(_innermost_user_frame(e))
        raise CapturelintError(
            f"the engine raised {type(e).__name__} under runner {label.runner}, mode {label.mode} at {where}: "
            f"{e}; this is a bug of the engine, not a replay hazard: fix it and run again"
        ) from e
    if HostSyncInCapture.code in codes:
        for capture in tracer.captures.values():
            analyzer.check_capture(capture)
    return TraceResult(
        label, analyzer.findings.sorted(), list(tracer.captures.values()), analyzer.steps,
        analyzer.max_step_error, output, failed,
    )


def coverage_gap(
    label: RunLabel, findings: list[Finding], token_agreement: float | None, max_step_error: float, codes: frozenset[str]
) -> Finding | None:
    """CL901 when the numerical oracle diverges and no structural finding explains it."""
    if UnexplainedDivergence.code not in codes:
        return None
    diverged = (token_agreement is not None and token_agreement < 1.0) or max_step_error > STEP_TOLERANCE
    if diverged and not any(f.code != UnexplainedDivergence.code for f in findings):
        return UnexplainedDivergence().make(label, token_agreement, max_step_error)
    return None


def _innermost_user_frame(e: BaseException) -> tuple[str, int, str]:
    tb = e.__traceback__
    best = ("<unknown>", 0, "<unknown>")
    prefixes = rt._skip_dirs()
    import os

    while tb is not None:
        code = tb.tb_frame.f_code
        if not os.path.abspath(code.co_filename).startswith(prefixes):
            best = (rt._display_path(code.co_filename), tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    return best


def merge(findings: list[Finding]) -> list[Finding]:
    fs = FindingSet()
    fs.extend(findings)
    return fs.sorted()
