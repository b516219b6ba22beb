"""``capturelint merge``: join the reports of the shards of one check into the report
one unsharded check would have written (``capturelint.merge``)."""

from __future__ import annotations

import click

from capturelint.commands.common import say, terminal_options, warn
from capturelint.adapters import registry
from capturelint.errors import EXIT_CLEAN, EXIT_FINDINGS, CapturelintError
from capturelint.output import check_output_path, is_stdout, write_file, write_stdout
from capturelint.rules import rule_infos
from capturelint.reporters import Options, emit, formats, reporter

FORMATS = formats("check")


@click.command()
@click.argument("reports", nargs=-1, metavar="REPORT...")
@click.option("--format", "fmt", type=click.Choice(FORMATS),
              help="Output format (default: the inputs' format, json or sarif); SARIF inputs give SARIF only.")
@click.option("-o", "--output", metavar="FILE", help="Write the merged report to FILE (atomically) instead of stdout; - is stdout.")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when there are findings.")
@click.option("-v", "--verbose", is_flag=True, help="--format rich: the default report, then the evidence (every graph's segments, every finding with its ops, source lines and replay steps).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), metavar="PYPROJECT",
              help="The settings the check read (SARIF locates findings without a source line at this file; default: "
                   "the nearest pyproject.toml).")
@terminal_options
def merge(reports: tuple[str, ...], fmt: str | None, output: str | None, exit_zero: bool, verbose: bool,
          config_path: str | None) -> int:
    """Join the reports of the shards of one check (check --shard K/N, JSON or SARIF) into the report one unsharded check would have written.

    Sharded reports must be complete: every shard 1..N once, of the same check.
    Unsharded reports of different configurations may be joined too. JSON inputs give
    every format (--format json, sarif, github, rich); the JSON of all shards' JSON
    reports is byte-identical to the unsharded check's. SARIF inputs give one SARIF log.

    Exit status, as check's: 0 clean, 1 findings, 2 usage or input error (one line
    naming the file), 130 interrupted.
    """
    from capturelint.merge import merge_json, merge_sarif, read_input, sarif_summary

    check_output_path(output)
    if not reports:
        raise CapturelintError("merge needs the reports to join; e.g. capturelint merge shard-*.json -o merged.json")
    inputs = [read_input(path) for path in reports]
    if inputs[0].kind == "sarif" and all(i.kind == "sarif" for i in inputs):
        if fmt not in (None, "sarif"):
            raise CapturelintError(f"merge: SARIF inputs give a SARIF log only, not --format {fmt}; merge the JSON "
                                   "reports of the shards (check --format json) for other formats")
        from capturelint.report import dumps_json

        from capturelint.formats.sarif import result_of

        log = merge_sarif(inputs, result_of)
        text = dumps_json(log)
        if is_stdout(output):
            write_stdout(text)
        else:
            write_file(output, text)  # type: ignore[arg-type]
        n, line = sarif_summary(log, len(inputs))
        say(line)
        return EXIT_CLEAN if exit_zero or not n else EXIT_FINDINGS
    report = merge_json(inputs)
    empty = report.empty_invariants
    if empty:
        warn(f"invariant(s) {', '.join(empty)} applied to captured graphs but selected no op: the selector "
             "probably does not say what was meant; see capturelint invariants --explain ID")
    rep = reporter("check", fmt or "json")
    emit(rep, report, output, Options(verbose=verbose, fallback_uri=_fallback_uri(config_path), rules=rule_infos(),
                                      command="merge", table=registry.table(report)))
    if not (rep.summary and is_stdout(output)):
        say(report.summary_line())
    if exit_zero:
        return EXIT_CLEAN
    return EXIT_FINDINGS if report.failed else EXIT_CLEAN


def _fallback_uri(config_path: str | None) -> str:
    """Where SARIF locates findings without a source line: the settings file's name, as
    check does."""
    from capturelint.settings import load_settings

    settings = load_settings(config_path)
    return str(settings.source.name) if settings.source else "pyproject.toml"
