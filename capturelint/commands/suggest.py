"""``capturelint suggest``: find the smallest eager region that makes replay equal eager."""

from __future__ import annotations

from typing import Any

import click

from capturelint import api
from capturelint.commands.common import split_csv, command_options, engine_options, say, settings_for
from capturelint.errors import EXIT_CLEAN, EXIT_FINDINGS
from capturelint.output import check_output_path, is_stdout
from capturelint.reporters import Options, emit, formats, reporter

FORMATS = formats("suggest")
DEFAULT_MAX_CANDIDATES = 12  # capturelint.suggest.DEFAULT_MAX_CANDIDATES (a test keeps them equal)


@click.command()
@engine_options
@click.option("--select", multiple=True, callback=split_csv, metavar="CODES", help="Only these rule codes (prefixes allowed, e.g. CL1).")
@click.option("--ignore", multiple=True, callback=split_csv, metavar="CODES", help="Skip these rule codes.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="rich", show_default=True,
              help="rich, json, or patch: a unified diff (git apply) adding @eager_break_during_capture above each "
                   "function of the best region.")
@click.option("-o", "--output", metavar="FILE", help="Write the report to FILE (atomically, after the run) instead of stdout; - is stdout.")
@click.option("--max-candidates", type=int, default=DEFAULT_MAX_CANDIDATES, show_default=True, metavar="N",
              help="Try at most N regions (each a full check of every failing configuration).")
@click.option("--target", metavar="SPEC", help="Your own engine instead of the bundled one, as for check: FILE.py:FUNCTION or MODULE:FUNCTION returning capturelint.target.Target objects (engine options such as --runner or --layers do not apply: an error).")
def suggest(select: tuple[str, ...], ignore: tuple[str, ...], fmt: str, output: str | None, max_candidates: int,
            target: str | None, **kw: Any) -> int:
    """Find the smallest eager region that makes replay equal eager: try the functions on the capture-time stack of each finding as eager breaks, verify each with the full check, and rank the clean ones by eager ops per step.

    Takes the options of check. For each failing configuration, each function on the
    capture-time stack of a finding (and the smallest sets of them that cover every
    finding) is made an eager break at run time, in a fresh engine (no file is edited),
    and the configuration is checked again: structural rules and numerical oracle. The
    clean regions are ranked by eager ops per replay step, then by breaks added, and each
    is checked under the other runners and modes too, saying when a per-runner region is
    needed.

    Exit status: 0 a verified region was found (or nothing fails), 1 no candidate makes
    the failing configurations clean, 2 usage, configuration or internal error, 130
    interrupted.
    """
    settings = settings_for(kw)
    check_output_path(output)
    report = api.suggest_with(settings, command_options(kw, select, ignore, target), max_candidates=max_candidates)
    rep = reporter("suggest", fmt)
    if fmt == "patch" and not report.found:
        say(report.summary_line())
        return EXIT_CLEAN if not report.failing else EXIT_FINDINGS
    emit(rep, report, output, Options())
    if not (rep.summary and is_stdout(output)):
        say(report.summary_line())
    return EXIT_FINDINGS if report.failing and not report.found else EXIT_CLEAN
