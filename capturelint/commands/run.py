"""``capturelint run SCRIPT.py [ARGS...]``: run a plain PyTorch program as written for
a GPU, under the emulated CUDA device and the tracer, and check every CUDA graph it
captures and replays (the script adapter, ``capturelint.adapters.script``)."""

from __future__ import annotations

import click

from capturelint.adapters import registry
from capturelint.commands.common import split_csv, say, settings_for, warn
from capturelint.errors import EXIT_CLEAN, EXIT_FINDINGS, CapturelintError
from capturelint.options import EngineOptions
from capturelint.output import check_output_path, is_stdout
from capturelint.reporters import Options, emit, formats, reporter
from capturelint.rules import rule_infos

FORMATS = formats("check")


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--select", multiple=True, callback=split_csv, metavar="CODES", help="Only these rule codes (prefixes allowed, e.g. CL1).")
@click.option("--ignore", multiple=True, callback=split_csv, metavar="CODES", help="Skip these rule codes.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="Report format (default rich; settings: format).")
@click.option("-o", "--output", metavar="FILE", help="Write the report to FILE (atomically, after the run) instead of stdout; - is stdout.")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when there are findings.")
@click.option("-v", "--verbose", is_flag=True, help="Rich report: the evidence (a panel per runner and mode with every graph's segments and every finding with its ops, source lines and replay steps) instead of one line per problem.")
@click.option("--invariants", "invariants_file", metavar="FILE", help="Also hold the invariants of this TOML file ([invariants.ID] tables).")
@click.option("--require-oracle", is_flag=True, help="Replay not compared with eager execution is an error (exit 2); a script's bare graphs have no eager twin, so this asks for shadowed steps (make_graphed_callables) only (settings: require-oracle).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), metavar="PYPROJECT",
              help="Read [tool.capturelint] from this file instead of the nearest pyproject.toml.")
@click.argument("script", metavar="SCRIPT.py")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(select: tuple[str, ...], ignore: tuple[str, ...], fmt: str | None, output: str | None, exit_zero: bool,
        verbose: bool, invariants_file: str | None, require_oracle: bool, config_path: str | None, script: str,
        args: tuple[str, ...]) -> int:
    """Run a Python script as written for a GPU (python SCRIPT.py ARGS...) under the
    emulated CUDA device, and check every CUDA graph it captures and replays.

    Options go before SCRIPT.py; everything after it is the script's own arguments
    (sys.argv[1:]). What the script prints goes to standard error; standard output
    carries the report. The script's own exit status is not capturelint's: the report's
    note says it.

    Exit status: 0 clean, 1 findings, 2 usage or configuration error, an exception the
    script did not catch, or a script that captured no CUDA graph; 130 interrupted.
    """
    settings = settings_for({"config_path": config_path})
    fmt = fmt or settings.format or "rich"
    check_output_path(output)
    rep = reporter("check", fmt)
    rep.preflight()
    plan = registry.make_plan(settings, EngineOptions(script=(script, *args), select=select, ignore=ignore,
                                                      invariants_file=invariants_file, jobs=1))
    for text in plan.warnings:
        warn(text)
    report = registry.run_check(registry.load(plan), keep_captures=rep.captures)
    from capturelint.acceptance import apply

    # the script's inline suppressions apply, as check's do; a script's run is the whole check of it
    apply(report, plan.codes, whole=invariants_file is None)
    missing = report.oracle_missing("--require-oracle" if require_oracle else "[tool.capturelint] require-oracle")
    if missing is not None and (require_oracle or settings.require_oracle):
        raise CapturelintError(missing)
    fallback = str(settings.source.name) if settings.source else "pyproject.toml"
    emit(rep, report, output, Options(verbose=verbose, fallback_uri=fallback, rules=rule_infos()))
    if not (rep.summary and is_stdout(output)):
        say(report.summary_line() + "".join(f" ({c.note})" for c in report.configs if c.note))
    if exit_zero:
        return EXIT_CLEAN
    return EXIT_FINDINGS if report.failed else EXIT_CLEAN
