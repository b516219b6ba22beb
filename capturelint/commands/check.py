"""``capturelint check``: run the bundled engine under each runner and mode and prove or
refute that every replay computes what eager execution computes."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import click

from capturelint import __version__
from capturelint.adapters import registry
from capturelint.commands.common import (
    ProgressReporter,
    _csv,
    engine_options,
    resolve_plan,
    say,
    settings_for,
    spelled,
    warn,
)
from capturelint.options import CUDAGraphMode
from capturelint.errors import EXIT_CLEAN, EXIT_FINDINGS, CapturelintError
from capturelint.output import check_output_path, is_stdout
from capturelint.reporters import Options, emit, formats, reporter
from capturelint.rules import rule_infos
from capturelint.shard import ShardInfo, fingerprint, parse_shard, require_selection

FORMATS = formats("check")


@click.command()
@engine_options
@click.option("--select", multiple=True, callback=_csv, metavar="CODES", help="Only these rule codes (prefixes allowed, e.g. CL1).")
@click.option("--ignore", multiple=True, callback=_csv, metavar="CODES", help="Skip these rule codes.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="Report format (default rich; settings: format).")
@click.option("-o", "--output", metavar="FILE", help="Write the report to FILE (atomically, after the run) instead of stdout; - is stdout.")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when there are findings.")
@click.option("--baseline", metavar="FILE", help="Also report region changes against this snapshot (settings: baseline).")
@click.option("--max-eager-growth", type=float, metavar="PCT", help="With --baseline: fail when eager ops per step grow by more than PCT percent (default 0).")
@click.option("-v", "--verbose", is_flag=True, help="Show every graph in the Rich report.")
@click.option("--static", is_flag=True, help="Capture the graphs only (no replay shadow, no eager twin) and check the declared invariants and host syncs at capture: the fast pre-commit hook. Replay equivalence is NOT checked.")
@click.option("--invariants", "invariants_file", metavar="FILE", help="Also hold the invariants of this TOML file ([invariants.ID] tables); they replace defaults and settings with the same id.")
@click.option("--strict", is_flag=True, help="An invariant that selects no op is an error (exit 2), not a warning.")
@click.option("--target", metavar="SPEC", help="Check your own engine instead of the bundled one: FILE.py:FUNCTION (the file is executed, as pytest imports test files) or MODULE:FUNCTION, returning capturelint.target.Target objects (engine options such as --runner or --layers do not apply: an error).")
@click.option("--shard", "shard_text", metavar="K/N", help="Run shard K of N: every N-th configuration (or target) in report order, starting at the K-th; the N shards partition the check and capturelint merge joins their reports (JSON or SARIF) into the unsharded report.")
@click.option("--require-oracle", is_flag=True, help="A configuration that replays graphs without comparing them with eager execution (a bare CUDA graph whose Target gives no eager twin) is an error (exit 2), for CI that wants numbers (settings: require-oracle).")
def check(select: tuple[str, ...], ignore: tuple[str, ...], fmt: str | None, output: str | None, exit_zero: bool,
          baseline: str | None, max_eager_growth: float | None, verbose: bool, static: bool, invariants_file: str | None,
          strict: bool, target: str | None, shard_text: str | None, require_oracle: bool, **kw: Any) -> int:
    """Check that CUDA-graph replay of the bundled engine computes what eager execution
    computes, under each runner and CUDA-graph mode.

    Its captures are also held to the declared region invariants (capturelint
    invariants lists them). With --static only the captures are checked (invariants, host syncs): fast, but
    replay equivalence is not checked; the full check is the CI gate.

    Every report says per configuration what was checked; a bare CUDA graph without an
    eager twin is not compared with eager execution, and the report says so
    (--require-oracle makes it an error).

    Exit status: 0 clean, 1 findings (or region growth over budget with --baseline),
    2 usage, configuration or internal error, 130 interrupted.
    """
    settings = settings_for(kw)
    fmt = fmt or settings.format or "rich"
    check_output_path(output)
    shard = parse_shard(shard_text) if shard_text is not None else None
    if shard is not None and (baseline is not None or max_eager_growth is not None):
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
    if target is not None and (baseline is not None or max_eager_growth is not None):
        raise CapturelintError("--baseline and --max-eager-growth gate the bundled engine's regions, not --target; drop them")
    if target is None and max_eager_growth is not None and baseline_path is None:
        raise CapturelintError("--max-eager-growth is the budget of --baseline, and no baseline is given; "
                               "add --baseline FILE (or baseline in settings), or drop it")
    plan = resolve_plan(settings, dict(kw, invariants_file=invariants_file), select, ignore, target)
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
    if baseline_path is not None and shard is not None and target is None and not static:
        warn(f"the baseline of the settings ({baseline_path}) is not checked by a shard: the gate compares the whole "
             "matrix; run check --baseline without --shard for it")
    elif baseline_path is not None and target is None and not static:
        from capturelint.snapshot import load_snapshot

        gate = load_snapshot(baseline_path)  # fail on a bad baseline before running anything
    plan = registry.load(plan)  # a target's engines are built here: its configurations are theirs
    if shard is not None:
        labels = [f"{r}/{m}" for r, m in plan.all_configurations]
        require_selection(shard, labels, registry.unit(plan))
        plan = dataclasses.replace(plan, shard=shard)
    with ProgressReporter(len(plan.configurations)) as progress:
        report = registry.run_check(plan, progress, static=static)
    # A result without a location is rejected by GitHub's upload; CL901 has no source
    # line, so SARIF points it at the configuration file that asked for the check.
    fallback = str(settings.source.name) if settings.source else "pyproject.toml"
    if shard is not None:
        # everything that shapes the report (not how many jobs ran it), so that merge
        # joins only the shards of one check
        shaped = dataclasses.replace(plan, shard=None, jobs=1, reuse=True)
        check_id = fingerprint(__version__, shaped, static, fallback)
        report.shard = ShardInfo(shard[0], shard[1], tuple(labels), check_id)
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
    rep = reporter("check", fmt)
    hint = suggest_hint(kw, select, ignore, target)
    emit(rep, report, output, Options(verbose=verbose, fallback_uri=fallback, hint=hint, rules=rule_infos()))
    if not (rep.summary and is_stdout(output)):
        say(report.summary_line())
    if exit_zero:
        return EXIT_CLEAN
    return EXIT_FINDINGS if report.failed else EXIT_CLEAN


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


def suggest_hint(kw: dict[str, Any], select: tuple[str, ...], ignore: tuple[str, ...], target: str | None) -> str:
    """``hint: capturelint suggest --runner v1 ...``: the check's own options, for the
    command that finds the eager region that fixes its findings."""
    import shlex

    args: list[str] = []
    if target is not None:
        args += ["--target", target]
    else:
        for name in ("engine", "runner", "eager_region", "layers", "steps", "seed", "kernels", "break_outputs"):
            if kw.get(name) is not None:
                args += [f"--{name.replace('_', '-')}", spelled(kw[name])]
        if kw.get("modes"):
            args += ["--mode", spelled(kw["modes"])]
        if kw.get("fresh_metadata"):
            args.append("--fresh-metadata")
        if kw.get("platform") not in (None, "cuda"):
            args += ["--platform", kw["platform"]]
    if kw.get("config_path"):
        args += ["--config", kw["config_path"]]
    if select:
        args += ["--select", ",".join(select)]
    if ignore:
        args += ["--ignore", ",".join(ignore)]
    command = " ".join(["capturelint", "suggest"] + [shlex.quote(a) for a in args])
    return f"hint: run `{command}` to find the smallest eager region that fixes these findings"
