"""``capturelint suggest``: find the smallest eager region that makes replay equal eager."""

from __future__ import annotations

from typing import Any

import click

from capturelint import api
from capturelint.commands.common import (
    terminal_options,
    OTHER,
    REPORT,
    GroupedCommand,
    SpecOption,
    command_options,
    engine_options,
    given_flags,
    say,
    settings_for,
    shared_options,
)
from capturelint.errors import EXIT_CLEAN, EXIT_FINDINGS
from capturelint.output import check_output_path, is_stdout
from capturelint.reporters import Options, emit, formats, reporter

FORMATS = formats("suggest")
DEFAULT_MAX_CANDIDATES = 12  # capturelint.suggest.DEFAULT_MAX_CANDIDATES (a test keeps them equal)


@click.command(cls=GroupedCommand)
@shared_options("target")
@engine_options
@shared_options("select", "ignore")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="rich", show_default=True, cls=SpecOption,
              group=REPORT, help="rich, json, or patch: a unified diff (git apply) adding @eager_break_during_capture "
                                 "above each function of the best region.")
@shared_options("output")
@click.option("--max-candidates", type=int, default=DEFAULT_MAX_CANDIDATES, show_default=True, metavar="N",
              cls=SpecOption, group=OTHER, help="Try at most N regions (each a full check of every failing "
                                                "configuration).")
@terminal_options
def suggest(fmt: str, max_candidates: int, **kw: Any) -> int:
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
    output = kw["output"]
    check_output_path(output)
    report = api.suggest_with(settings, command_options(kw), max_candidates=max_candidates)
    rep = reporter("suggest", fmt)
    if fmt == "patch" and not report.found:
        say(report.summary_line())
        return EXIT_CLEAN if not report.failing else EXIT_FINDINGS
    emit(rep, report, output, Options(hint=apply_hint(kw, max_candidates) if report.found else None))
    if not (rep.summary and is_stdout(output)):
        say(report.summary_line())
    return EXIT_FINDINGS if report.failing and not report.found else EXIT_CLEAN


def apply_hint(kw: dict[str, Any], max_candidates: int) -> str:
    """``apply it: capturelint suggest ... --format patch | git apply``: the command that
    writes the best region's patch, with this run's own options."""
    import shlex

    from capturelint.adapters import registry

    names = ("target",) if kw.get("target") is not None else registry.engine_option_names()
    args = given_flags(kw, (*names, "config", "select", "ignore"))
    if max_candidates != DEFAULT_MAX_CANDIDATES:
        args += ["--max-candidates", str(max_candidates)]
    command = " ".join(["capturelint", "suggest"] + [shlex.quote(a) for a in args] + ["--format", "patch"])
    return f"apply the best region: {command} | git apply"
