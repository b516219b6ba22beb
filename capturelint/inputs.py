"""Reading the files capturelint is given: settings, invariants, baselines, reports.

Every input file goes through this one reader, so every one is bounded the same way:

- **Regular files only.** A directory, a device (``/dev/zero`` never ends), a named pipe
  (opening one blocks until a writer comes) or a socket is refused by what it is, before
  it is opened for reading.
- **Bounded size.** A file larger than its kind's limit (``capturelint.limits``) is
  refused by its size, before it is read; a file that grows while read is read no
  further than the limit, then refused.
- **Bounded nesting.** A parsed document is at most ``MAX_DEPTH`` levels of objects,
  arrays or tables deep. Deeper nesting is refused whether the parser runs out of stack
  on it (``[[[[...``) or builds it without recursion (TOML's dotted keys ``a.b.c...``),
  so no later walk of a document can run out of stack either.

A refusal is an ``InputProblem``: a ``CapturelintError`` that names the file and says
what is wrong with it; callers put it in their own words with ``problem`` (a
predicate: "does not exist", "is larger than 64 MiB") and ``kind``, and add what to do.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any, Callable

from capturelint.errors import CapturelintError
from capturelint.limits import MAX_DEPTH, MAX_TOML_BYTES

_SPECIAL = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
            (stat.S_ISSOCK, "a socket"))


class InputProblem(CapturelintError):
    """An input file that cannot be taken: ``kind`` is one of ``missing``, ``directory``,
    ``special``, ``too-large``, ``unreadable``, ``encoding``, ``syntax``, ``nested``;
    ``problem`` says it after the file's name ("is a directory")."""

    def __init__(self, path: str | os.PathLike[str], kind: str, problem: str):
        super().__init__(f"{os.fspath(path)} {problem}")
        self.path = os.fspath(path)
        self.kind = kind
        self.problem = problem

    @property
    def state(self) -> str:
        """``problem`` after ``FILE:`` ("a directory", "larger than 4 MiB")."""
        return self.problem.removeprefix("is ")


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n >= 2**20 else f"{n} bytes"


def read_bytes(path: str | os.PathLike[str], limit: int) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them (see the
    module docstring)."""
    try:
        info = os.stat(path)
        _check_kind(path, info, limit)
        # O_NONBLOCK: were the file swapped for a named pipe since the stat, opening it
        # would not wait for a writer (fstat below then refuses it)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise InputProblem(path, "missing", "does not exist") from None
    except OSError as e:
        raise InputProblem(path, "unreadable", f"cannot be read ({e.strerror or e})") from None
    try:
        with os.fdopen(fd, "rb") as fh:
            _check_kind(path, os.fstat(fh.fileno()), limit)
            data = fh.read(limit + 1)
    except OSError as e:
        raise InputProblem(path, "unreadable", f"cannot be read ({e.strerror or e})") from None
    if len(data) > limit:
        raise InputProblem(path, "too-large", f"is larger than {_size(limit)}")
    return data


def _check_kind(path: str | os.PathLike[str], info: os.stat_result, limit: int) -> None:
    if stat.S_ISDIR(info.st_mode):
        raise InputProblem(path, "directory", "is a directory")
    if not stat.S_ISREG(info.st_mode):
        what = next((name for test, name in _SPECIAL if test(info.st_mode)), "not a file")
        raise InputProblem(path, "special", f"is not a regular file (it is {what})")
    if info.st_size > limit:
        raise InputProblem(path, "too-large", f"is larger than {_size(limit)}")


def read_text(path: str | os.PathLike[str], limit: int) -> str:
    """``read_bytes`` decoded as UTF-8."""
    data = read_bytes(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputProblem(path, "encoding", f"is not UTF-8 text (byte {e.start} is invalid)") from None


def parse_json(text: str, path: str | os.PathLike[str], parse_constant: Callable[[str], Any] | None = None) -> Any:
    """``json.loads`` with the nesting bound; ``json.JSONDecodeError`` (a ``ValueError``)
    is left to the caller, who knows what the file should have been."""
    try:
        doc = json.loads(text, parse_constant=parse_constant)
    except RecursionError:
        raise _nested(path) from None
    check_depth(doc, path)
    return doc


def load_toml(path: str | os.PathLike[str], limit: int = MAX_TOML_BYTES) -> dict[str, Any]:
    """The TOML document of the file at ``path``, read and parsed within the bounds."""
    import tomllib

    text = read_text(path, limit)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputProblem(path, "syntax", f"is malformed TOML: {e}") from None
    except RecursionError:
        raise _nested(path) from None
    check_depth(doc, path)
    return doc


def check_depth(doc: Any, path: str | os.PathLike[str], limit: int = MAX_DEPTH) -> None:
    """Refuse a document nested more than ``limit`` levels deep (walked without recursion)."""
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > limit:
            raise _nested(path)
        stack.extend((child, depth + 1) for child in children)


def _nested(path: str | os.PathLike[str]) -> InputProblem:
    return InputProblem(path, "nested", f"is nested more than {MAX_DEPTH} levels deep")


__all__ = ["InputProblem", "check_depth", "load_toml", "parse_json", "read_bytes", "read_text"]
