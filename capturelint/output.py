"""Where command output goes: standard output, or a file replaced atomically.

**Files are written whole or not at all.** ``write_file`` writes a temporary file in
the target's folder (``.FILE.XXXXXXXX.tmp``, the name cut so that it stays a legal file
name), flushes it to disk, then ``os.replace``\\ s the target with it: a command killed
mid-write (Ctrl-C, SIGTERM, SIGHUP: ``capturelint.interrupts``), a full disk or a
file-size limit leave the old file as it was, and no temporary file behind (except
after SIGKILL). A target that exists but is not a regular file (``/dev/null``, a named
pipe) has no file to replace and is written directly; a target that is standard output
(``-o /dev/stdout``) is written to standard output. A symbolic link is followed: the
file it names is replaced, the link stays. Every failure is a ``CapturelintError``
naming the path.

**Files are written after the run**, once the report exists; ``check_output_path``
refuses, before anything runs, a path that can never be written (a directory, a folder
that does not exist, that this user may not write, or that refuses a new file: /sys,
/proc, a read-only mount; it makes and removes a file there to know), so a long run does
not end in a lost report. ``-`` names standard output.

**Standard output never crashes a command.** ``GuardedStdout`` (installed by
``capturelint.cli.main``) turns a closed pipe (``capturelint check | head -1``) into
silence, so the command still ends with the exit status its run had; a write error
(``> /dev/full``) or a standard output closed from the start (``>&-``) into one
``CapturelintError``; and a character the output encoding cannot represent
(``PYTHONIOENCODING=ascii``) into ``?``. **Standard error never changes the exit
status**: ``GuardedStderr`` drops what cannot be written (``2>/dev/full``, ``2>&-``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import stat
import sys
import tempfile
from typing import Any, TextIO

from rich.console import Console

from capturelint.errors import CapturelintError

STDOUT = "-"
REPORT_WIDTH = 120  # the width of Rich output that does not go to a terminal


def is_stdout(output: str | None) -> bool:
    return output is None or output == STDOUT


def check_output_path(output: str | None, option: str = "-o") -> None:
    """Refuse, before a run, an output path that can never be written."""
    if is_stdout(output):
        return
    assert output is not None
    if not output:
        raise CapturelintError(f"{option} needs a file name (or - for standard output)")
    info = _stat(output)
    if output.endswith(("/", os.sep)) or (info is not None and stat.S_ISDIR(info.st_mode)):
        raise CapturelintError(f"cannot write {output}: it is a directory; name a file with {option}")
    if info is not None and not stat.S_ISREG(info.st_mode):  # a device or pipe, written in place
        if not os.access(output, os.W_OK):
            raise CapturelintError(f"cannot write {output}: permission denied; choose a writable path with {option}")
        return
    target = os.path.realpath(output)
    folder = os.path.dirname(target)
    shown = os.path.dirname(output) or folder
    if not os.path.isdir(folder):
        what = "is not a folder" if os.path.exists(folder) else "does not exist"
        raise CapturelintError(f"cannot write {output}: the folder {shown} {what}; create it or choose another path with "
                               f"{option}")
    if not os.access(folder, os.W_OK | os.X_OK):  # the file is replaced by a new one made in its folder
        raise CapturelintError(f"cannot write {output}: the folder {shown} is not writable; choose a writable path with "
                               f"{option}")
    _probe(output, folder, shown, option)


def _probe(output: str, folder: str, shown: str, option: str) -> None:
    """Make and remove a file in ``folder``, as ``write_file`` will: a folder that
    permissions call writable may still refuse new files (/sys, /proc, a read-only
    mount, root's ``os.access`` that answers yes to everything)."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".capturelint-probe.", suffix=".tmp")
    except OSError as e:
        raise CapturelintError(f"cannot write {output}: the folder {shown} refuses new files ({e.strerror or e}); "
                               f"choose a writable path with {option}") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)


def _stat(path: str) -> os.stat_result | None:
    """What ``path`` names (links followed), or ``None`` when nothing is there yet."""
    try:
        return os.stat(path)
    except OSError:
        return None


def write_file(path: str, data: str | bytes) -> None:
    """Write ``data`` (text is UTF-8) to ``path`` atomically (see the module docstring)."""
    info = _stat(path)
    if isinstance(data, str) and info is not None and _is_stdout(info):
        write_stdout(data)  # -o /dev/stdout: the report joins standard output (a pipe's reader gone: quiet)
        return
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        if info is not None and not stat.S_ISREG(info.st_mode):
            if stat.S_ISDIR(info.st_mode):
                raise IsADirectoryError(21, "Is a directory")
            sys.stdout.flush()  # what came before stays before, when this is standard output too
            with open(path, "wb") as fh:  # the path, not its realpath: /dev/stdout -> /proc/self/fd/1 -> pipe:[...]
                fh.write(payload)
            return
        _replace(os.path.realpath(path), payload)
    except OSError as e:
        raise CapturelintError(f"cannot write {path}: {e.strerror or e}; choose a writable path with -o") from None


def _is_stdout(info: os.stat_result) -> bool:
    """Whether ``info`` is the file standard output writes to."""
    try:
        return os.path.samestat(info, os.fstat(sys.stdout.fileno()))
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False


_TEMP_STEM_BYTES = 200  # of the file's name in its temporary file's: ".NAME.XXXXXXXX.tmp" fits in NAME_MAX (255)


def _replace(target: str, payload: bytes) -> None:
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mask = os.umask(0)
        os.umask(mask)
        mode = 0o666 & ~mask
    stem = os.fsdecode(os.fsencode(os.path.basename(target))[:_TEMP_STEM_BYTES])
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=f".{stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:  # also KeyboardInterrupt and capturelint.interrupts.Terminated: never leave a half file
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


# ------------------------------------------------------------- the terminal

QUIET_ENV = "CAPTURELINT_QUIET"
COLORS = ("auto", "always", "never")


@dataclasses.dataclass
class Terminal:
    """How a command talks to the terminal, as ruff does: ``color`` (``--color``:
    ``auto`` colours a terminal only; ``NO_COLOR`` set to anything non-empty turns
    colour off and ``FORCE_COLOR`` on, ``NO_COLOR`` winning; ``always`` and ``never``
    override both), ``quiet`` (``--quiet``, or ``CAPTURELINT_QUIET=1``: no progress) and
    ``lines`` (a command is running: off a terminal, progress is a plain line per
    configuration finished; the Python API prints none)."""

    color: str = "auto"
    quiet: bool = False
    lines: bool = False

    def colored(self, stream: Any) -> bool | None:
        """Whether output to ``stream`` is coloured: True, False, or None (a terminal is)."""
        if self.color != "auto":
            return self.color == "always"
        if os.environ.get("NO_COLOR", ""):
            return False
        if os.environ.get("FORCE_COLOR", ""):
            return True
        return None

    def console_options(self, stream: Any) -> dict[str, Any]:
        colored = self.colored(stream)
        if colored is None:
            return {"force_terminal": _isatty(stream), "no_color": False}
        return {"force_terminal": True, "no_color": False} if colored else {"force_terminal": False, "color_system": None}


TERMINAL = Terminal()


def quiet_from_env() -> bool:
    """``CAPTURELINT_QUIET``: ``1`` (or true, yes, on) silences progress; ``0``, false,
    no, off or empty does not; anything else is an error."""
    text = os.environ.get(QUIET_ENV, "")
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise CapturelintError(f"{QUIET_ENV}={text!r} is not a switch; set it to 1 (or true, yes, on) to silence progress, "
                           "0 (or false, no, off) or unset it")


def configure_terminal(color: str | None = None, quiet: bool | None = None) -> None:
    """Set ``TERMINAL`` for the command that starts: its ``--color`` and ``--quiet``."""
    TERMINAL.color = color or "auto"
    TERMINAL.quiet = bool(quiet) or quiet_from_env()
    TERMINAL.lines = True


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def stdout_console() -> Console:
    # The same content with or without a terminal: no colour codes in pipes (unless
    # --color always or FORCE_COLOR), a fixed width so line breaks do not depend on
    # the terminal that ran it.
    return Console(file=sys.stdout, width=None if _isatty(sys.stdout) else REPORT_WIDTH,
                   **TERMINAL.console_options(sys.stdout))


def stderr_console() -> Console:
    return Console(file=sys.stderr, **TERMINAL.console_options(sys.stderr))


def file_console(buffer: io.StringIO) -> Console:
    """A Console that renders into ``buffer`` for a file: fixed width, no colour."""
    return Console(file=buffer, width=REPORT_WIDTH, force_terminal=False, color_system=None)


class GuardedStdout(io.TextIOBase):
    """Standard output that cannot crash a command (see the module docstring).
    ``stream`` is ``None`` when the process started with standard output closed."""

    def __init__(self, stream: TextIO | None):
        self.stream = stream
        self.closed_by_reader = False
        self.error: CapturelintError | None = None  # raised again by every later write and flush

    # what Rich and click ask of a stream
    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", None) or "utf-8"

    def isatty(self) -> bool:
        return self.stream is not None and not self.closed_by_reader and self.stream.isatty()

    def fileno(self) -> int:
        if self.stream is None:
            raise io.UnsupportedOperation("the stream is closed")
        return self.stream.fileno()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:  # type: ignore[override]
        if self.error is not None:
            raise self.error
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")  # as a text stream does
        if self.closed_by_reader or not text:  # click probes streams with write("")
            return len(text)
        if self.stream is None:
            self._fail(None)
            return len(text)
        try:
            try:
                self.stream.write(text)
            except UnicodeEncodeError:
                self.stream.write(text.encode(self.encoding, "replace").decode(self.encoding, "replace"))
        except BrokenPipeError:
            self._silence()
        except OSError as e:
            self._fail(e)
        return len(text)

    def flush(self) -> None:
        if self.error is not None:
            raise self.error
        if self.closed_by_reader or self.stream is None:
            return
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._silence()
        except OSError as e:
            self._fail(e)

    def _silence(self) -> None:
        """The reader is gone: drop the rest, and point the stream's file descriptor at
        /dev/null so that the interpreter's last flush at exit does not fail again."""
        self.closed_by_reader = True
        with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.fileno())
            os.close(devnull)

    def _fail(self, e: OSError | None) -> None:
        """A write that cannot go through (``e``; ``None``: the stream is closed)."""
        self._silence()
        if e is None:
            self.error = CapturelintError("cannot write to standard output: it is closed; give the command a standard "
                                          "output (e.g. > FILE), or write to a file with -o")
        else:
            self.error = CapturelintError(
                f"cannot write to standard output: {e.strerror or e}; free the device or write to a file with -o"
            )
        raise self.error from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


class GuardedStderr(GuardedStdout):
    """Standard error that never changes how a command ends: diagnostics that cannot be
    written (``2>/dev/full``, a closed stream, a reader gone) are dropped, so the exit
    status stays the run's."""

    def _fail(self, e: OSError | None) -> None:
        self._silence()


__all__ = [
    "GuardedStderr", "GuardedStdout", "STDOUT", "check_output_path", "file_console", "is_stdout", "stderr_console", "stdout_console",
    "write_file", "write_stdout",
]
