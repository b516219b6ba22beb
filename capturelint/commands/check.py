"""``capturelint check``: run the bundled engine under each runner and mode and prove or
refute that every replay computes what eager execution computes."""

from __future__ import annotations

from typing import Any

import click

from capturelint import api
from capturelint.commands.common import split_csv, command_options, engine_options, say, settings_for, spelled
from capturelint.errors import EXIT_CLEAN, EXIT_FINDINGS
from capturelint.output import check_output_path, is_stdout
from capturelint.reporters import Options, emit, formats, reporter
from capturelint.rules import rule_infos

FORMATS = formats("check")


@click.command()
@engine_options
@click.option("--select", multiple=True, callback=split_csv, metavar="CODES", help="Only these rule codes (prefixes allowed, e.g. CL1).")
@click.option("--ignore", multiple=True, callback=split_csv, metavar="CODES", help="Skip these rule codes.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="Report format (default rich; settings: format).")
@click.option("-o", "--output", metavar="FILE", help="Write the report to FILE (atomically, after the run) instead of stdout; - is stdout.")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when there are findings.")
@click.option("--baseline", metavar="FILE", help="Also report region changes against this snapshot (settings: baseline).")
@click.option("--max-eager-growth", type=float, metavar="PCT", help="With --baseline: fail when eager ops per step grow by more than PCT percent (default 0).")
@click.option("-v", "--verbose", is_flag=True, help="Rich report: the evidence (a panel per runner and mode with every graph's segments and every finding with its ops, source lines and replay steps) instead of one line per problem.")
@click.option("--static", is_flag=True, help="Capture the graphs only (no replay shadow, no eager twin) and check the declared invariants and host syncs at capture: the fast pre-commit hook. Replay equivalence is NOT checked.")
@click.option("--invariants", "invariants_file", metavar="FILE", help="Also hold the invariants of this TOML file ([invariants.ID] tables); they replace defaults and settings with the same id.")
@click.option("--strict", is_flag=True, help="An invariant that selects no op is an error (exit 2), not a warning.")
@click.option("--target", metavar="SPEC", help="Check your own engine instead of the bundled one: FILE.py:FUNCTION (the file is executed, as pytest imports test files) or MODULE:FUNCTION, returning capturelint.target.Target objects (engine options such as --runner or --layers do not apply: an error).")
@click.option("--shard", "shard_text", metavar="K/N", help="Run shard K of N: every N-th configuration (or target) in report order, starting at the K-th; the N shards partition the check and capturelint merge joins their reports (JSON or SARIF) into the unsharded report.")
@click.option("--accept-findings", "accept_findings", metavar="FILE", help="Accept the findings this file lists (keyed by fingerprint, no line numbers): they are counted, not failed on. A FILE that does not exist is written with this check's findings (settings: accept-findings).")
@click.option("--update-accepted", is_flag=True, help="Rewrite the --accept-findings file with this check's findings: new ones added, those that no longer occur dropped.")
@click.option("--require-oracle", is_flag=True, help="A configuration that replays graphs without comparing them with eager execution (a bare CUDA graph whose Target gives no eager twin) is an error (exit 2), for CI that wants numbers (settings: require-oracle).")
def check(select: tuple[str, ...], ignore: tuple[str, ...], fmt: str | None, output: str | None, exit_zero: bool,
          baseline: str | None, max_eager_growth: float | None, verbose: bool, static: bool, invariants_file: str | None,
          strict: bool, target: str | None, shard_text: str | None, require_oracle: bool, accept_findings: str | None,
          update_accepted: bool, **kw: Any) -> int:
    """Check that CUDA-graph replay of the bundled engine computes what eager execution
    computes, under each runner and CUDA-graph mode.

    Its captures are also held to the declared region invariants (capturelint
    invariants lists them). With --static only the captures are checked (invariants, host syncs): fast, but
    replay equivalence is not checked; the full check is the CI gate.

    Every report says per configuration what was checked; a bare CUDA graph without an
    eager twin is not compared with eager execution, and the report says so
    (--require-oracle makes it an error).

    A finding is accepted by a `# capturelint: ignore[CODE]` comment on its line or
    by the --accept-findings file: it is counted and listed, and does not fail.

    Exit status: 0 clean, 1 findings (or region growth over budget with --baseline),
    2 usage, configuration or internal error, 130 interrupted.
    """
    settings = settings_for(kw)
    fmt = fmt or settings.format or "rich"
    check_output_path(output)
    rep = reporter("check", fmt)
    rep.preflight()
    report = api.check_with(settings, command_options(dict(kw, invariants_file=invariants_file), select, ignore, target),
                            static=static, strict=strict, require_oracle=require_oracle, baseline=baseline,
                            max_eager_growth=max_eager_growth, shard=shard_text, keep_captures=rep.captures,
                            accept_findings=accept_findings, update_accepted=update_accepted)
    fallback = api.fallback_uri(settings)
    # suggest finds eager regions: no hint where only suppression comments are reported
    hint = suggest_hint(kw, select, ignore, target) if any(f.runner or f.mode for f in report.findings) else None
    emit(rep, report, output, Options(verbose=verbose, fallback_uri=fallback, hint=hint, rules=rule_infos()))
    if not (rep.summary and is_stdout(output)):
        say(report.summary_line())
    if exit_zero:
        return EXIT_CLEAN
    return EXIT_FINDINGS if report.failed else EXIT_CLEAN


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
        for name in ("capture_sizes", "batch_sizes"):
            if kw.get(name):
                args += [f"--{name.replace('_', '-')}", ",".join(map(str, kw[name]))]
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
