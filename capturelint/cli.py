"""The ``capturelint`` command line.

**Exit status is decided here, in one place** (``main``), and every outcome maps to one:

- 0 clean, 1 findings (what the command returned);
- 2 a usage, configuration or input error (``CapturelintError``, click's usage errors),
  printed as one line ``capturelint: error: ...`` on stderr; also any other exception,
  printed as one line ``capturelint: internal error: ...``, with its traceback only under
  ``--debug`` (or ``CAPTURELINT_DEBUG=1``);
- 130 interrupted (Ctrl-C, at any moment: also while torch is imported), one line
  ``capturelint: interrupted``;
- a reader that closes the pipe (``capturelint check | head -1``) ends the output
  quietly, and the command still ends with the status its run had.

Standard output goes through ``capturelint.output.GuardedStdout`` while a command runs.
Commands never import this module; ``EXIT_*`` live in ``capturelint.errors``.

**Nothing heavy is imported to answer** ``--version``, ``-h`` or ``rules``: commands are
loaded when used (``capturelint.commands.COMMANDS``), and torch's thread count
(``CAPTURELINT_THREADS``, default 1) is set just before a command that runs torch. A
bad ``CAPTURELINT_THREADS`` is an error on every command.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import Any

import click

from capturelint.errors import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS, EXIT_INTERRUPTED, CapturelintError  # noqa: F401

THREADS_ENV = "CAPTURELINT_THREADS"
DEBUG_ENV = "CAPTURELINT_DEBUG"


class _LazyGroup(click.Group):
    """The root group: commands come from ``capturelint.commands.COMMANDS`` and are
    imported when invoked (or asked for their own help), not to list them."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        from capturelint.commands import COMMANDS

        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        from capturelint.commands import COMMANDS

        entry = COMMANDS.get(name)
        if entry is None:
            return None
        command = getattr(importlib.import_module(entry.module), entry.attribute)
        if entry.torch:
            _threads_before(command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from capturelint.commands import COMMANDS

        limit = max(formatter.width - 6 - max(len(n) for n in COMMANDS), 20)
        rows = [(name, _shorten(COMMANDS[name].summary, limit)) for name in sorted(COMMANDS)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _shorten(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[: limit - 3].rsplit(" ", 1)[0].rstrip(",;:") + "..."


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and isinstance(ctx.obj, dict):
        ctx.obj["debug"] = True


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="capturelint")
@click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=_set_debug,
              help=f"Print the traceback of an internal error (also: {DEBUG_ENV}=1).")
def cli() -> None:
    """Check that CUDA-graph replay computes what eager execution computes.

    Exit status: 0 clean, 1 findings, 2 usage, configuration or internal error,
    130 interrupted.
    """


# ------------------------------------------------------------------- threads


def threads_from_env() -> int:
    """``CAPTURELINT_THREADS`` as a positive integer (default 1), or a one-line error.

    The bundled engine's tensors are tiny: one intra-op thread is fastest, and OpenMP
    threads contending for busy cores make every op ~100x slower. The variable
    overrides it for engines with real shapes."""
    text = os.environ.get(THREADS_ENV)
    if text is None:
        return 1
    try:
        value = int(text.strip())
    except ValueError:
        value = 0
    if value < 1 or value > 4096:
        raise CapturelintError(
            f"{THREADS_ENV}={text!r} is not a thread count; set it to an integer from 1 to 4096 (e.g. 8), or unset it"
        )
    return value


def _threads_before(command: click.Command) -> None:
    """Set torch's threads when ``command`` runs (after its arguments parsed), once."""
    if getattr(command, "_capturelint_threads", False):
        return
    invoke = command.invoke

    def invoke_with_threads(ctx: click.Context) -> Any:
        import torch

        torch.set_num_threads(threads_from_env())
        return invoke(ctx)

    command.invoke = invoke_with_threads  # type: ignore[method-assign]
    command._capturelint_threads = True  # type: ignore[attr-defined]


# ----------------------------------------------------------------------- main


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _error(text: str) -> None:
    try:
        click.echo(f"capturelint: {_one_line(text)}", err=True)
    except OSError:  # stderr is gone too: the exit status still says what happened
        pass


def _env_debug() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the command and maps every outcome to an exit status."""
    from capturelint.output import GuardedStdout

    state: dict[str, Any] = {"debug": _env_debug()}
    real_stdout = sys.stdout
    guarded = GuardedStdout(real_stdout)
    sys.stdout = guarded
    try:
        status = _run(argv, state)
        if guarded.error is None:
            try:
                guarded.flush()
            except CapturelintError as e:
                _error(f"error: {e}")
                status = EXIT_ERROR
        elif state.get("reported") is not guarded.error:  # the failed write's error was swallowed on its way
            _error(f"error: {guarded.error}")
            status = EXIT_ERROR
        return status
    except KeyboardInterrupt:  # while reporting an error, or flushing
        _error("interrupted")
        return EXIT_INTERRUPTED
    finally:
        sys.stdout = real_stdout


def _run(argv: list[str] | None, state: dict[str, Any]) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    no_args = getattr(click.exceptions, "NoArgsIsHelpError", ())
    try:
        threads_from_env()
        with cli.make_context("capturelint", args, obj=state) as ctx:
            rv = cli.invoke(ctx)
        return rv if isinstance(rv, int) else EXIT_CLEAN
    except click.exceptions.Exit as e:
        return e.exit_code
    except (KeyboardInterrupt, click.exceptions.Abort):
        _error("interrupted")
        return EXIT_INTERRUPTED
    except no_args as e:  # type: ignore[misc]
        path = e.ctx.command_path if e.ctx is not None else "capturelint"
        _error(f"error: no command given; see '{path} --help' for the commands")
        return EXIT_ERROR
    except click.UsageError as e:
        hint = f"; see '{e.ctx.command_path} --help'" if e.ctx is not None else ""
        _error(f"error: {_one_line(e.format_message()).rstrip('.')}{hint}")
        return EXIT_ERROR
    except click.ClickException as e:
        _error(f"error: {e.format_message()}")
        return EXIT_ERROR
    except CapturelintError as e:
        if state["debug"]:
            traceback.print_exc()
        _error(f"error: {e}")
        state["reported"] = e
        return EXIT_ERROR
    except BrokenPipeError:
        # a write that did not go through GuardedStdout (stderr's reader is gone)
        return EXIT_ERROR
    except SystemExit as e:
        if state["debug"]:
            traceback.print_exc()
        _error(f"error: code run by the command called sys.exit({e.code!r}); capturelint cannot give a verdict on it, "
               "so it ends with an error; remove the sys.exit call")
        return EXIT_ERROR
    except Exception as e:  # a bug of capturelint's: one line, the traceback on request
        if state["debug"]:
            traceback.print_exc()
            hint = "report it with the traceback above"
        else:
            hint = "run again with --debug for the traceback, and report it"
        _error(f"internal error: {type(e).__name__}: {e}; {hint}")
        return EXIT_ERROR


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
