"""``capturelint check``: run the bundled engine under each runner and mode and prove or
refute that every replay computes what eager execution computes."""

from __future__ import annotations

from typing import Any

import click

from capturelint import __version__
from capturelint.adapters.bundled import run_check
from capturelint.errors import EXIT_CLEAN, EXIT_FINDINGS
from capturelint.commands.common import (
    ProgressReporter,
    _csv,
    engine_options,
    resolve_plan,
    settings_for,
    stdout_console,
    write_output,
)
from capturelint.errors import CapturelintError
from capturelint.formats.github import to_github
from capturelint.formats.sarif import to_sarif
from capturelint.report import dumps_json, render_json, render_rich
from capturelint.rules import RULES, select_codes

FORMATS = ("rich", "json", "sarif", "github")


@click.command()
@engine_options
@click.option("--select", multiple=True, callback=_csv, metavar="CODES", help="Only these rule codes (prefixes allowed, e.g. CL1).")
@click.option("--ignore", multiple=True, callback=_csv, metavar="CODES", help="Skip these rule codes.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="Report format (default rich; settings: format).")
@click.option("-o", "--output", metavar="FILE", help="Write the report to FILE instead of stdout.")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when there are findings.")
@click.option("--baseline", metavar="FILE", help="Also report region changes against this snapshot (settings: baseline).")
@click.option("--max-eager-growth", type=float, metavar="PCT", help="Fail when eager ops per step grow by more than PCT percent against the baseline (default 0).")
@click.option("-v", "--verbose", is_flag=True, help="Show every graph in the Rich report.")
@click.option("--target", metavar="SPEC", help="Check your own engine instead of the bundled one: FILE.py:FUNCTION or MODULE:FUNCTION returning capturelint.target.Target objects (engine options do not apply).")
def check(select: tuple[str, ...], ignore: tuple[str, ...], fmt: str | None, output: str | None, exit_zero: bool,
          baseline: str | None, max_eager_growth: float | None, verbose: bool, target: str | None, **kw: Any) -> int:
    """Check that CUDA-graph replay of the bundled engine computes what eager execution
    computes, under each runner and CUDA-graph mode.

    Exit status: 0 clean, 1 findings (or region growth over budget with --baseline),
    2 usage, configuration or internal error.
    """
    settings = settings_for(kw)
    if target is not None:
        # engine options do not apply to a target: only the rule selection does
        codes = select_codes(list(select) or list(settings.select or ()), list(ignore) or list(settings.ignore or ()))
        plan = None
    else:
        plan = resolve_plan(settings, kw, select, ignore)
        codes = plan.codes
    fmt = fmt or settings.format or "rich"
    if fmt not in FORMATS:
        raise CapturelintError(f"unknown format {fmt!r} in settings; use one of {', '.join(FORMATS)}")
    baseline_path = baseline or (str(settings.baseline) if settings.baseline else None)
    growth = max_eager_growth if max_eager_growth is not None else settings.max_eager_growth
    if growth is not None and growth < 0:
        raise CapturelintError(f"--max-eager-growth must be a percentage >= 0, got {growth}")
    if target is not None and baseline is not None:
        raise CapturelintError("--baseline snapshots the bundled engine's regions and cannot gate --target; drop one of them")
    gate = None
    if baseline_path is not None and target is None:
        from capturelint.snapshot import load_snapshot

        gate = load_snapshot(baseline_path)  # fail on a bad baseline before running anything
    if target is not None:
        from capturelint.target import load_targets, run_targets

        targets = load_targets(target)
        with ProgressReporter(len(targets)) as progress:
            report = run_targets(targets, codes, progress)
    else:
        with ProgressReporter(len(plan.configurations)) as progress:
            report = run_check(plan, progress)
    if gate is not None:
        from capturelint.snapshot import compare_report

        report.region_changes = compare_report(gate, report, plan, growth or 0.0)
    if fmt == "json":
        write_output(render_json(report), output)
    elif fmt == "sarif":
        # A result without a location is rejected by GitHub's upload; CL901 has no source
        # line, so it points at the configuration file that asked for the check.
        fallback = str(settings.source.name) if settings.source else "pyproject.toml"
        sarif = to_sarif(report.findings, [r.info() for r in RULES], __version__, fallback_uri=fallback)
        write_output(dumps_json(sarif), output)
    elif fmt == "github":
        text = to_github(report.findings)
        write_output(text + ("\n" if text and not text.endswith("\n") else ""), output)
    else:
        if output:
            from rich.console import Console

            with open(output, "w") as fh:
                render_rich(report, Console(file=fh, width=120), verbose)
        else:
            render_rich(report, stdout_console(), verbose)
    if fmt != "rich":
        from capturelint.commands.common import stderr_console

        stderr_console().print(report.summary_line(), highlight=False, soft_wrap=True)
    if exit_zero:
        return EXIT_CLEAN
    return EXIT_FINDINGS if report.failed else EXIT_CLEAN
