"""The checker's commands, registered on the ``capturelint`` group."""

from __future__ import annotations

import click


def register(cli: click.Group) -> None:
    from capturelint.commands.check import check
    from capturelint.commands.rules import rules

    cli.add_command(check)
    cli.add_command(rules)
    try:
        from capturelint.commands.regions import diff, show, snapshot
    except ImportError:
        return
    cli.add_command(show)
    cli.add_command(diff)
    cli.add_command(snapshot)
