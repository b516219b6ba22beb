"""Errors that end a command with exit status 2 and a one-line message, and the exit
statuses themselves (decided in one place: ``capturelint.cli.main``)."""


class CapturelintError(Exception):
    """A usage, configuration or input error. The message is one line: what is wrong and
    what to do. The CLI prints it as ``capturelint: error: <message>`` and exits 2."""


EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
"""Exit statuses: 0 clean, 1 findings, 2 usage, configuration or internal error."""

EXIT_INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT, as shells report it)."""
