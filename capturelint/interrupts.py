"""Signals that end a command: Ctrl-C (SIGINT), SIGTERM and SIGHUP, at any moment.

**While a command runs** (``raising``), each of them raises an exception in the main
thread: ``KeyboardInterrupt`` for SIGINT, as Python does, and ``Terminated``, a
``KeyboardInterrupt`` of its own, for SIGTERM and SIGHUP. So everything that cleans up
after Ctrl-C cleans up after them too (``finally`` blocks; an output file's temporary
file is removed), and the CLI ends with one line, ``capturelint: interrupted`` or
``capturelint: terminated``, and exit status 128 + the signal's number: 130, 143, 129
(``exit_status``). The handlers in place before are restored after.

**From the program's first line until it ends** (``exit_on_signal``, installed by
``capturelint.launch`` before anything heavy is imported; for the ``capturelint``
program, not for ``main`` called in-process): outside a command (while the CLI is
imported, once the command is done) and, inside one, while a module is being imported
(torch, vLLM, an engine, a ``--target`` file), a signal prints the same line and ends
the process at once with the same status: an exception raised in the middle of an
import would unwind through native initialisation code (torch's aborts the process with
SIGABRT) or be swallowed by it. ``capturelint.cli.entry`` ends
the process with ``os._exit`` after the atexit functions and a flush, because
Python's own teardown (about half a second once torch is loaded) first restores each
signal's default action: a Ctrl-C then killed the process without a word.

A signal ignored when capturelint starts (``nohup``; a background job's SIGINT) stays
ignored. Forked worker processes (``--jobs``) inherit the handlers; in them a signal
does what it did before capturelint installed anything (SIGINT raises
``KeyboardInterrupt``, SIGTERM and SIGHUP end the worker), so a pool stops its workers
as it always did.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import traceback
from typing import Any, Iterator

_exit = os._exit  # the process's own end, whatever code a command runs makes of os._exit (capturelint.hosting)

SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the main thread is, as Ctrl-C raises
    ``KeyboardInterrupt``; ``signum`` is the signal's number."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def exit_status(e: KeyboardInterrupt) -> int:
    """128 + the signal's number, as shells report a command a signal ended."""
    return 128 + (e.signum if isinstance(e, Terminated) else signal.SIGINT)


def message(e: KeyboardInterrupt) -> str:
    return "terminated" if isinstance(e, Terminated) else "interrupted"


class _State:
    owner: int | None = None  # the process the handlers belong to (not a forked worker)
    raising = 0  # commands running (``raising`` blocks entered and not left)
    exiting = False  # the capturelint program: outside a command, a signal ends the process


def _handler(signum: int, frame: Any) -> None:
    if os.getpid() != _State.owner:  # a forked worker: what the signal did before
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    e = KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)
    if not _State.exiting or (_State.raising and not _importing(frame)):
        raise e
    with contextlib.suppress(Exception):
        sys.stderr.write(f"capturelint: {message(e)}\n")
        sys.stderr.flush()
    _exit(exit_status(e))


def _importing(frame: Any) -> bool:
    """Whether the main thread is importing a module (``frame``: where the signal found
    it): an exception raised there unwinds through the module's half-run code (torch's
    native initialisation turns it into a C++ exception that aborts the process, or an
    import swallows it), so the process ends at once instead; nothing is being written."""
    # the standard library's walker: runtime.frames, capturelint's, is above this room
    return any(f.f_code.co_filename.startswith("<frozen importlib") for f, _ in traceback.walk_stack(frame))


def _install(signums: tuple[int, ...]) -> dict[int, Any]:
    """Put ``_handler`` in place for ``signums`` (not over an ignored signal); the
    handlers replaced, to restore."""
    saved: dict[int, Any] = {}
    if threading.current_thread() is not threading.main_thread():
        return saved  # only the main thread may set handlers; in a thread, Python's defaults apply
    _State.owner = os.getpid()
    for signum in signums:
        before = signal.getsignal(signum)
        if before is not signal.SIG_IGN:
            signal.signal(signum, _handler)
            saved[signum] = before
    return saved


@contextlib.contextmanager
def raising() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP raise ``Terminated`` (SIGINT raises
    ``KeyboardInterrupt`` as ever); the handlers before are restored after."""
    saved = _install(tuple(s for s in SIGNALS if s != signal.SIGINT))
    _State.raising += 1
    try:
        yield
    finally:
        _State.raising -= 1
        for signum, before in saved.items():
            signal.signal(signum, before)


def exit_on_signal() -> None:
    """From now on, outside ``raising`` blocks, SIGINT, SIGTERM and SIGHUP end the
    process at once with their line and exit status (the ``capturelint`` program only)."""
    _State.exiting = True
    _install(SIGNALS)


__all__ = ["SIGNALS", "Terminated", "exit_on_signal", "exit_status", "message", "raising"]
