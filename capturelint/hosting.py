"""Code a command runs (a script, a target, an engine) is hosted: it can neither end
capturelint's process nor move its working folder.

**``os._exit`` does not end the process.** A program that ends with ``os._exit(0)`` (a
common way past a slow teardown) would otherwise end capturelint with it: no report,
and the program's status (0: CI passes) as capturelint's. While ``hosted`` blocks run,
``os._exit(n)`` called in this process's main thread raises ``ProgramExit``, a
``SystemExit`` with code ``n``, so it is handled as ``sys.exit(n)`` is: a script's run
ends there and is checked (its report's note says the status), a target or engine that
calls it is an error naming the call (``called``). Called in another thread of this
process, where no exception can stop the program, it ends the process with one line on
standard error and exit status 2, never with the program's status. A forked child
(a DataLoader worker, ``--jobs``' workers outside their jobs) exits as it always did.
Beyond reach: native code that ends the process itself (C's ``exit`` or ``_exit``),
``os.exec*`` (the process becomes another program), ``os.abort`` and signals; the last
two never end it with status 0 (SIGTERM and SIGHUP: ``capturelint.interrupts``).

**The working folder is restored** when a ``hosted`` block ends: a program that calls
``os.chdir("pkg")`` must not make ``-o z.json``, ``--accept-findings`` or a settings file
named by the user resolve in ``pkg``; every path the user gave means what it meant when
the command started.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from typing import Any, Iterator, NoReturn

from capturelint.errors import EXIT_ERROR

real_exit = os._exit
"""``os._exit`` itself: for capturelint's own ends of a process (``capturelint.cli``)."""


class ProgramExit(SystemExit):
    """``os._exit(code)`` called by hosted code, raised where it was called."""


def exit_call(e: SystemExit) -> str:
    """The function the program called to end: ``os._exit`` or ``sys.exit``."""
    return "os._exit" if isinstance(e, ProgramExit) else "sys.exit"


def called(e: SystemExit) -> str:
    """How the program asked to end, as its source says it: ``os._exit(5)``, ``sys.exit(5)``."""
    return f"{exit_call(e)}({e.code!r})"


class _State:
    depth: dict[int, int] = {}  # process id -> hosted blocks entered and not left in it


def _hosted_exit(status: int) -> NoReturn:
    if not _State.depth.get(os.getpid()):  # a forked child, or no hosted block: what os._exit does
        real_exit(status)
    if threading.current_thread() is threading.main_thread():
        raise ProgramExit(status)
    with contextlib.suppress(Exception):
        os.write(2, f"capturelint: error: a thread of the program checked called os._exit({status!r}), which ends "
                    "the process before any check finishes, so there is no verdict; end the thread without "
                    "os._exit\n".encode())
    real_exit(EXIT_ERROR)


@contextlib.contextmanager
def hosted() -> Iterator[None]:
    """Run the block with ``os._exit`` turned into ``ProgramExit`` (see the module
    docstring), and the working folder it started in restored after."""
    pid = os.getpid()
    cwd = _cwd()
    _State.depth[pid] = _State.depth.get(pid, 0) + 1
    os._exit = _hosted_exit  # type: ignore[assignment]  # stays in place: a forked child passes through
    try:
        yield
    finally:
        _State.depth[pid] -= 1
        if cwd is not None and _cwd() != cwd:
            with contextlib.suppress(OSError):  # the folder was removed meanwhile: nothing to go back to
                os.chdir(cwd)


def hosting(fn: Any) -> Any:
    """``fn`` run in a ``hosted`` block (a decorator)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with hosted():
            return fn(*args, **kwargs)

    return run


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:
        return None


__all__ = ["ProgramExit", "called", "exit_call", "hosted", "hosting", "real_exit"]
