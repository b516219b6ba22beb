"""The ``capturelint`` command line.

**Exit status is decided here, in one place** (``main``), and every outcome maps to one:

- 0 clean, 1 findings (what the command returned);
- 2 a usage, configuration or input error (``CapturelintError``, click's usage errors),
  printed as one line ``capturelint: error: ...`` on stderr; also any other exception,
  printed as one line ``capturelint: internal error: ...``, with its traceback only under
  ``--debug`` (or ``CAPTURELINT_DEBUG=1``);
- 130 interrupted (Ctrl-C, at any moment: also while torch is imported, and after the
  report is written), one line ``capturelint: interrupted``; 143 and 129 for SIGTERM and
  SIGHUP, one line ``capturelint: terminated`` (``capturelint.interrupts``);
- a reader that closes the pipe (``capturelint check | head -1``) ends the output
  quietly, and the command still ends with the status its run had; a standard error
  that cannot be written changes nothing.

``--debug`` is accepted by the root and by every command; ``CAPTURELINT_DEBUG`` is
``1``, ``true``, ``yes``, ``on`` or ``0``, ``false``, ``no``, ``off``, empty (anything
else is an error). Standard output and standard error go through
``capturelint.output.GuardedStdout`` and ``GuardedStderr`` while a command runs.
Commands never import this module; ``EXIT_*`` live in ``capturelint.errors``.

**Nothing heavy is imported to answer** ``--version``, ``-h`` or ``rules``: commands are
loaded when used (``capturelint.commands.COMMANDS``), and torch's thread count
(``CAPTURELINT_THREADS``, default 1) is set just before a command first runs an engine,
after its options and settings are read (a typo there is reported before torch loads). A
bad ``CAPTURELINT_THREADS`` is an error on every command.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import traceback
from typing import Any, NoReturn

import click

from capturelint import interrupts
from capturelint.errors import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS, EXIT_INTERRUPTED, CapturelintError  # noqa: F401
from capturelint.hosting import called, exit_call, hosted, real_exit
from capturelint.records import lint_recorded

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
            # commands reach engines through the adapter registry; the engine's own CLI runs it directly
            _threads_before(command, at_once=not entry.module.startswith("capturelint.commands."))
        _with_debug(command)
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


def _debug_option() -> click.Option:
    return click.Option(["--debug"], is_flag=True, expose_value=False, is_eager=True, callback=_set_debug,
                        help=f"Print the traceback of an internal error (also: {DEBUG_ENV}=1).")


def _with_debug(command: click.Command) -> None:
    """``--debug`` on ``command`` and its subcommands too (the internal-error hint says
    "run again with --debug" whatever the command was)."""
    if not any(p.name == "debug" for p in command.params):
        command.params.append(_debug_option())
    for sub in getattr(command, "commands", {}).values():
        _with_debug(sub)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="capturelint")
def cli() -> None:
    """Check that CUDA-graph replay computes what eager execution computes.

    Exit status: 0 clean, 1 findings, 2 usage, configuration or internal error,
    130 interrupted (143, 129: SIGTERM, SIGHUP).
    """


_with_debug(cli)


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


def _threads_before(command: click.Command, at_once: bool = False) -> None:
    """Set torch's threads when ``command`` first runs an engine, once: after its options
    and settings are read (the adapter registry's ``before_engines_run``), so that a typo
    there is reported before torch loads; ``at_once``: when it starts (the engine's own
    CLI, which runs no adapter)."""
    if getattr(command, "_capturelint_threads", False):
        return
    invoke = command.invoke

    def invoke_with_threads(ctx: click.Context) -> Any:
        if at_once:
            _set_threads()
        else:
            from capturelint.adapters import registry

            registry.before_engines_run(_set_threads)
        return invoke(ctx)

    command.invoke = invoke_with_threads  # type: ignore[method-assign]
    command._capturelint_threads = True  # type: ignore[attr-defined]


def _set_threads() -> None:
    import torch

    torch.set_num_threads(threads_from_env())


# ----------------------------------------------------------------------- main


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _error(text: str) -> None:
    click.echo(f"capturelint: {_one_line(text)}", err=True)  # standard error is guarded: never raises


_DEBUG_ON = ("1", "true", "yes", "on")
_DEBUG_OFF = ("", "0", "false", "no", "off")


def debug_from_env() -> bool:
    """``CAPTURELINT_DEBUG`` as a switch, or a one-line error for a value that is neither."""
    text = os.environ.get(DEBUG_ENV, "")
    value = text.strip().lower()
    if value not in _DEBUG_ON + _DEBUG_OFF:
        raise CapturelintError(
            f"{DEBUG_ENV}={text!r} is not a switch; set it to 1 (or true, yes, on) for tracebacks, 0 (or false, no, "
            "off) or unset it"
        )
    return value in _DEBUG_ON


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the command and maps every outcome to an exit status."""
    from capturelint.output import GuardedStderr, GuardedStdout

    state: dict[str, Any] = {"debug": False}
    real_stdout, real_stderr = sys.stdout, sys.stderr
    guarded = GuardedStdout(real_stdout)
    sys.stdout, sys.stderr = guarded, GuardedStderr(real_stderr)
    try:
        with interrupts.raising(), hosted():
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
    except KeyboardInterrupt as e:  # while reporting an error, or flushing; SIGTERM, SIGHUP too
        _error(interrupts.message(e))
        return interrupts.exit_status(e)
    finally:
        sys.stdout, sys.stderr = real_stdout, real_stderr


def _run(argv: list[str] | None, state: dict[str, Any]) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    no_args = getattr(click.exceptions, "NoArgsIsHelpError", ())
    try:
        state["debug"] = debug_from_env()
        threads_from_env()
        with cli.make_context("capturelint", args, obj=state) as ctx:
            if state["debug"]:  # a tracer bug shows where it happens: every recorded stream linted
                lint_recorded()
            rv = cli.invoke(ctx)
        return rv if isinstance(rv, int) else EXIT_CLEAN
    except click.exceptions.Exit as e:
        return e.exit_code
    except KeyboardInterrupt as e:
        _error(interrupts.message(e))
        return interrupts.exit_status(e)
    except click.exceptions.Abort:
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
        _error(f"error: code run by the command called {called(e)}; capturelint cannot give a verdict on it, "
               f"so it ends with an error; remove the {exit_call(e)} call")
        return EXIT_ERROR
    except Exception as e:  # a bug of capturelint's: one line, the traceback on request
        if state["debug"]:
            traceback.print_exc()
            hint = "report it with the traceback above"
        else:
            hint = "run again with --debug for the traceback, and report it"
        _error(f"internal error: {type(e).__name__}: {e}; {hint}")
        return EXIT_ERROR


def entry() -> NoReturn:
    """The ``capturelint`` program: ``main``, then the end of the process, where a signal
    still ends it with its one line and exit status (``capturelint.interrupts``)."""
    interrupts.exit_on_signal()
    _hold_closed_descriptors()
    _end(main())


def _hold_closed_descriptors() -> None:
    """Point a standard output or error closed from the start (``>&-``) at /dev/null.
    Python has already made ``sys.stdout`` ``None`` for it (a write is then an error,
    ``capturelint.output``); holding the number keeps the next file opened (an output
    file's temporary file) from becoming "standard output" for code that writes to 1."""
    for fd in (1, 2):
        try:
            os.fstat(fd)
        except OSError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)


def _end(status: int) -> NoReturn:
    """End the process with ``status``: the atexit functions, a flush, then ``os._exit``.
    Python's own teardown would take about half a second once torch is loaded, and it
    restores each signal's default action first: a Ctrl-C then killed the process
    without a word. Nothing after the flush needs that teardown."""
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    real_exit(status)


if __name__ == "__main__":
    entry()
