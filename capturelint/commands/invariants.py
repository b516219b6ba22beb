"""``capturelint invariants``: the declared region invariants in force, where each comes
from, and (``--explain ID``) the graph query one runs and the ops it selects."""

from __future__ import annotations

import json
from typing import Any

import click

from capturelint.adapters import registry
from capturelint.commands.common import (
    terminal_options,
    OTHER,
    REPORT,
    GroupedCommand,
    ProgressReporter,
    SpecOption,
    engine_options,
    resolve_plan,
    say,
    settings_for,
    spec_option,
    stdout_console,
)
from capturelint.common_options import BY_NAME
from capturelint.errors import EXIT_CLEAN, CapturelintError
from capturelint.lists import cut


@click.command(cls=GroupedCommand)
@engine_options
@spec_option(BY_NAME["invariants"], help="Also hold the invariants of this TOML file ([invariants.ID] tables).")
@click.option("--explain", "explain_id", metavar="ID", cls=SpecOption, group=OTHER, help="Show invariant ID's graph "
              "query and the ops it selects under each runner and mode (captures the graphs: a static check).")
@click.option("--format", "fmt", type=click.Choice(["rich", "json"]), default="rich", show_default=True,
              cls=SpecOption, group=REPORT)
@terminal_options
def invariants(explain_id: str | None, fmt: str, **kw: Any) -> int:
    """List the declared region invariants in force (bundled defaults, settings file,
    --invariants FILE) and where each comes from; --explain ID shows the graph query it
    runs and the ops it selects under each runner and mode.

    Exit status: 0 listed, 2 usage or configuration error (an unknown ID), 130 interrupted.
    """
    plan = resolve_plan(settings_for(kw), kw)
    if explain_id is None:
        rows = [_row(inv) for inv in plan.invariants]
        if fmt == "json":
            click.echo(json.dumps({"invariants": rows}, indent=2, sort_keys=True))
        else:
            _table(rows)
        say(f"{len(rows)} invariant{'s' * (len(rows) != 1)} in force")
        return EXIT_CLEAN
    by_id = {inv.id: inv for inv in plan.invariants}
    inv = by_id.get(explain_id)
    if inv is None:
        known = ", ".join(by_id) or "none"
        raise CapturelintError(f"--explain {explain_id!r}: no invariant with that id is in force (in force: {known}); "
                               "run capturelint invariants to list them")
    from capturelint.invariants import explain_selection

    with ProgressReporter(len(plan.configurations)) as progress:
        report = registry.run_check(plan, progress, static=True, keep_captures=True)  # --explain reads the captures
    explained = {**_row(inv), "query": inv.query(),
                 "configurations": [explain_selection(inv, c) for c in report.configs]}
    if fmt == "json":
        click.echo(json.dumps(explained, indent=2, sort_keys=True))
    else:
        _print_explained(explained)
    return EXIT_CLEAN


def _row(inv: Any) -> dict[str, Any]:
    return {"id": inv.id, "source": inv.source, "requires": inv.requirement_text(), "applies_to": inv.scope_text(),
            "selects": " | ".join(s.describe() for s in inv.selectors), "why": inv.why}


def _table(rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    table = Table(show_header=True, header_style="bold", box=None)
    for col in ("id", "source", "requires", "applies to", "selects"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["id"], r["source"], r["requires"], r["applies_to"], r["selects"])
    stdout_console().print(table)


def _print_explained(e: dict[str, Any]) -> None:
    from rich.text import Text

    console = stdout_console()
    console.print(Text(f"{e['id']} ({e['source']}): {e['requires']}; applies to {e['applies_to']}", style="bold"))
    if e["why"]:
        console.print(Text(f"why: {e['why']}"))
    console.print(Text(f"query: {e['query']}"))
    for c in e["configurations"]:
        head = f"runner {c['runner']} · {c['mode']} · eager region {c['eager_region']}"
        if not c["applies"]:
            console.print(Text(f"{head}: does not apply to any captured graph", style="dim"))
            continue
        for sel in c["selections"]:
            graphs = cut(sel["graphs"])
            console.print(Text(f"{head} · graphs {graphs} ({sel['runtime_mode']}): {sel['selected']} ops selected",
                               style="bold" if sel["selected"] else "yellow"))
            for op in sel["ops"]:
                style = "green" if op["placement"] == "eager" else "red"
                console.print(Text(f"    {op['scope']}  {op['op']} x{op['count']}  ", style=None) + Text(op["placement"], style=style))
