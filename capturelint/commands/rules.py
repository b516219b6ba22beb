"""``capturelint rules``: the rule table, or one rule's doc."""

from __future__ import annotations

import click
from rich.markdown import Markdown
from rich.table import Table

from capturelint.commands.common import stdout_console
from capturelint.rules import RULES, rule


def rules_table_markdown() -> str:
    """The rule table of docs/rules.md, generated from the rule classes."""
    lines = ["| code | name | condition | what it reports |", "|---|---|---|---|"]
    for r in RULES:
        lines.append(f"| {r.code} | {r.name} | {r.condition} | {r.summary} |")
    return "\n".join(lines) + "\n"


@click.command()
@click.argument("code", required=False)
@click.option("--format", "fmt", type=click.Choice(["rich", "markdown"]), default="rich", show_default=True)
def rules(code: str | None, fmt: str) -> None:
    """List the rules, or print the doc of rule CODE (e.g. CL101)."""
    console = stdout_console()
    if code is None:
        if fmt == "markdown":
            click.echo(rules_table_markdown(), nl=False)
            return
        table = Table(show_header=True, header_style="bold", box=None)
        for col in ("code", "name", "condition", "what it reports"):
            table.add_column(col)
        for r in RULES:
            table.add_row(r.code, r.name, str(r.condition), r.summary)
        console.print(table)
        return
    info = rule(code).info()
    text = f"# {info.code} {info.name} ({info.condition})\n\n{info.summary}\n\n{info.doc}"
    if fmt == "markdown":
        click.echo(text, nl=False)
    else:
        console.print(Markdown(text))
