"""``capturelint run SCRIPT.py [ARGS...]``: run a plain PyTorch program as written for
a GPU, under the emulated CUDA device and the tracer, and check every CUDA graph it
captures and replays (the script adapter, ``capturelint.adapters.plain.script``)."""

from __future__ import annotations

from typing import Any

import click

from capturelint.adapters import registry
from capturelint.commands.common import GroupedCommand, say, settings_for, shared_options, spec_option, terminal_options, warn
from capturelint.common_options import BY_NAME
from capturelint.errors import EXIT_CLEAN, EXIT_FINDINGS, CapturelintError
from capturelint.options import EngineOptions
from capturelint.output import check_output_path, is_stdout
from capturelint.reporters import Options, emit, reporter
from capturelint.rules import rule_infos


@click.command(cls=GroupedCommand, context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@shared_options("select", "ignore", "format", "output", "exit_zero", "verbose")
@spec_option(BY_NAME["invariants"], help="Also hold the invariants of this TOML file ([invariants.ID] tables).")
@spec_option(BY_NAME["require_oracle"], help="Replay not compared with eager execution is an error (exit 2); a "
             "script's bare graphs have no eager twin, so this asks for shadowed steps (make_graphed_callables) only.")
@shared_options("config")
@click.argument("script", metavar="SCRIPT.py")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@terminal_options
def run(script: str, args: tuple[str, ...], **kw: Any) -> int:
    """Run a Python script as written for a GPU (python SCRIPT.py ARGS...) under the
    emulated CUDA device, and check every CUDA graph it captures and replays.

    Options go before SCRIPT.py; everything after it is the script's own arguments
    (sys.argv[1:]). What the script prints goes to standard error; standard output
    carries the report. The script's own exit status is not capturelint's: the report's
    note says it.

    Exit status: 0 clean, 1 findings, 2 usage or configuration error, an exception the
    script did not catch, or a script that captured no CUDA graph; 130 interrupted.
    """
    settings = settings_for(kw)
    fmt = kw["format"] or settings.format or "rich"
    output, require_oracle = kw["output"], bool(kw["require_oracle"])
    check_output_path(output)
    rep = reporter("check", fmt)
    rep.preflight()
    plan = registry.make_plan(settings, EngineOptions(script=(script, *args), select=kw["select"] or (),
                                                      ignore=kw["ignore"] or (), invariants_file=kw["invariants"],
                                                      jobs=1))
    for text in plan.warnings:
        warn(text)
    report = registry.run_check(registry.load(plan), keep_captures=rep.captures)
    from capturelint.acceptance import apply

    # the script's inline suppressions apply, as check's do; a script's run is the whole check of it
    apply(report, plan.codes, whole=kw["invariants"] is None)
    missing = report.oracle_missing("--require-oracle" if require_oracle else "[tool.capturelint] require-oracle")
    if missing is not None and (require_oracle or settings.require_oracle):
        raise CapturelintError(missing)
    fallback = str(settings.source.name) if settings.source else "pyproject.toml"
    emit(rep, report, output, Options(verbose=bool(kw["verbose"]), fallback_uri=fallback, rules=rule_infos(),
                                      command="run"))
    if not (rep.summary and is_stdout(output)):
        say(report.summary_line() + "".join(f" ({c.note})" for c in report.configs if c.note))
    if kw["exit_zero"]:
        return EXIT_CLEAN
    return EXIT_FINDINGS if report.failed else EXIT_CLEAN
