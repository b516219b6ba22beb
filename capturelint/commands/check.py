"""``capturelint check``: run the bundled engine under each runner and mode and prove or
refute that every replay computes what eager execution computes."""

from __future__ import annotations

from typing import Any

import click

from capturelint import api
from capturelint.commands.common import (
    terminal_options,
    GroupedCommand,
    command_options,
    engine_options,
    given_flags,
    say,
    settings_for,
    shared_options,
)
from capturelint.adapters import registry
from capturelint.errors import EXIT_CLEAN, EXIT_FINDINGS
from capturelint.output import check_output_path, is_stdout
from capturelint.reporters import Options, emit, reporter
from capturelint.rules import rule_infos


@click.command(cls=GroupedCommand)
@shared_options("target")
@engine_options
@shared_options("select", "ignore", "invariants", "static", "baseline", "max_eager_growth", "accept_findings",
                "update_accepted", "format", "output", "verbose", "exit_zero", "strict", "require_oracle", "shard")
@terminal_options
def check(**kw: Any) -> int:
    """Check that CUDA-graph replay computes what eager execution computes: of the
    project's own targets when its pyproject.toml names them ([tool.capturelint]
    targets), else of the bundled engine (--engine), under each runner and CUDA-graph mode.

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
    fmt = kw["format"] or settings.format or "rich"
    output = kw["output"]
    check_output_path(output)
    rep = reporter("check", fmt)
    rep.preflight()
    report = api.check_with(settings, command_options(kw), static=bool(kw["static"]), strict=bool(kw["strict"]),
                            require_oracle=bool(kw["require_oracle"]), baseline=kw["baseline"],
                            max_eager_growth=kw["max_eager_growth"], shard=kw["shard"], keep_captures=rep.captures,
                            accept_findings=kw["accept_findings"], update_accepted=bool(kw["update_accepted"]))
    fallback = api.fallback_uri(settings)
    hint = suggest_hint(kw) if suggestable(report) else None
    emit(rep, report, output, Options(verbose=bool(kw["verbose"]), fallback_uri=fallback, hint=hint,
                                      rules=rule_infos(), table=registry.table(report)))
    if not (rep.summary and is_stdout(output)):
        say(report.summary_line())
    if kw["exit_zero"]:
        return EXIT_CLEAN
    return EXIT_FINDINGS if report.failed else EXIT_CLEAN


def suggestable(report: Any) -> bool:
    """Whether ``capturelint suggest`` can help with the report's findings: it moves eager
    regions of graphs it re-runs in pieces (capturelint's runtime, the engines), so not
    for findings of a suppression comment alone, nor of a configuration whose graphs are
    all bare ``torch.cuda.CUDAGraph``\\ s (no region to move: its search would end in no
    candidate)."""
    return any(c.findings and (c.checked.shadowed_steps or not c.checked.bare_replays) for c in report.configs)


def suggest_hint(kw: dict[str, Any]) -> str:
    """``hint: capturelint suggest --runner v1 ...``: the check's own options, for the
    command that finds the eager region that fixes its findings."""
    import shlex

    names = ("target",) if kw.get("target") is not None else registry.engine_option_names()
    args = given_flags(kw, (*names, "config", "select", "ignore"))
    command = " ".join(["capturelint", "suggest"] + [shlex.quote(a) for a in args])
    return f"hint: run `{command}` to find the smallest eager region that fixes these findings"
