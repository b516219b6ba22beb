"""Runs the bundled DeepSeek V4 engine under the tracer: one configuration at a time.

This is the only module of the checker that knows the bundled engine's API (the
``Engine``, its config and its runner's ``named_state_tensors``). It never reaches into
the model's code: what the checker knows of the model, it learns from traces.
"""

from __future__ import annotations

from capturelint.analyzer import RunLabel
from capturelint.checker import CheckPlan
from capturelint.engine.config import EngineConfig
from capturelint.engine.forward_context import CUDAGraphMode
from capturelint.findings import Numerical
from capturelint.harness import coverage_gap, merge, trace_run
from capturelint.regions import graph_map
from capturelint.report import ConfigReport


def engine_config(plan: CheckPlan, runner: str, mode: str) -> EngineConfig:
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


def run_configuration(plan: CheckPlan, runner: str, mode: str, shadow: bool = True) -> ConfigReport:
    """Trace one runner and mode; with ``shadow`` also check every replay step and run
    the eager twin for the numerical oracle. Without it, only the captures are
    recorded (what region maps and diffs need)."""
    from capturelint.engine.llm import Engine, compare

    cfg = engine_config(plan, runner, mode)
    label = RunLabel(runner, mode)
    engine = Engine(cfg)
    roots = {"model": engine.model, "state": list(engine.runner.named_state_tensors())}
    result = trace_run(engine.generate, roots, label, plan.codes, shadow=shadow)
    numerical = None
    findings = list(result.findings)
    note = None
    if result.capture_failed:
        note = "the capture failed on a host synchronisation; replay and the numerical oracle did not run"
    elif shadow:
        twin = Engine(cfg.eager_twin()).generate()
        agreement, logit_error = compare(result.output, twin)
        numerical = Numerical(runner, mode, agreement, result.max_step_error, logit_error, result.replay_steps)
        gap = coverage_gap(label, findings, agreement, result.max_step_error, plan.codes)
        if gap is not None:
            findings.append(gap)
    graphs = [graph_map(c) for c in result.captures]
    return ConfigReport(runner, mode, str(cfg.effective_eager_region), merge(findings), numerical, graphs,
                        captures=result.captures, note=note)


__all__ = ["engine_config", "run_configuration"]
