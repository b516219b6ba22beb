"""The ``capturelint`` program's first code: its console script and ``python -m
capturelint`` start here, before anything heavy is imported.

A Ctrl-C (or SIGTERM, SIGHUP) must end the program with one line and its exit status
whenever it arrives (``capturelint.interrupts``), and the first seconds are spent
importing: click, rich, then torch (and vLLM) once a command runs an engine. Python's
own SIGINT handler would raise ``KeyboardInterrupt`` in the middle of those imports: a
traceback of the import, or, inside torch's native initialisation, a C++ exception that
aborts the process (SIGABRT), or an import half done that fails later or swallows the
interrupt. So the signal handlers go in place here, first, with nothing imported but the
standard library's ``signal``, ``os`` and ``threading``; from then on a signal that
arrives outside a command, or while a module is being imported, ends the process at
once with its one line, and one that arrives while a command runs its own code raises
``KeyboardInterrupt`` there, so that files being written are cleaned up.
"""

from __future__ import annotations

from typing import NoReturn

from capturelint import interrupts


def entry() -> NoReturn:
    """The ``capturelint`` program (``[project.scripts]``): the handlers, then the CLI."""
    interrupts.exit_on_signal()
    from capturelint.cli import entry as run

    run()


__all__ = ["entry"]
