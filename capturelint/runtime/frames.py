"""The one frame walker: which source lines of engine or model code are running.

Findings point at engine and model code, never at machinery: torch, the standard
library (installed packages excepted: an installed vLLM is engine code), this package,
and the files registered with ``register_runtime_file`` (the tracer, the harness, an
adapter's shims). ``user_frame`` finds the innermost frame of engine or model code,
``user_stack`` all of them; both start a given number of frames above their caller, so
that a dispatch mode, a runtime hook and the tracer walk the same way.

The tracer walks once per recorded op, so everything is cached: whether a code object
is machinery (until the next registration), and one ``Frame`` per code object and line
(``code_frame``), which also carries where its function is defined (for ``suggest``).
Imports no torch at module import (``protocol``'s rule).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from capturelint.runtime.protocol import UNKNOWN_FRAME, Frame

_skip_prefixes: tuple[str, ...] = ()
# Keyed by code object *and* file: code objects compare equal across files (their
# equality leaves out co_filename), and a copy of an engine's file is another engine.
_hidden: dict[tuple[Any, str], bool] = {}  # (code object, file) -> machinery?
_frames: dict[tuple[Any, str, int], Frame] = {}  # (code object, file, line) -> its Frame
_display_cache: dict[str, str] = {}


def _skip_dirs() -> tuple[str, ...]:
    global _skip_prefixes
    if not _skip_prefixes:
        import torch

        torch_dir = os.path.dirname(torch.__file__)
        runtime_dir = os.path.dirname(os.path.abspath(__file__))
        _skip_prefixes = (torch_dir + os.sep, runtime_dir + os.sep)
    return _skip_prefixes


_STDLIB = os.path.dirname(os.__file__) + os.sep


def _site_dirs() -> tuple[str, ...]:
    """Folders of installed packages: below the standard library's folder, but engine
    or model code (an installed vLLM is what ``--engine vllm`` checks)."""
    global _site_prefixes
    if _site_prefixes is None:
        found = [os.path.abspath(p) for p in sys.path if p and ("site-packages" in p or "dist-packages" in p)]
        _site_prefixes = tuple(dict.fromkeys(p + os.sep for p in found))
    return _site_prefixes


_site_prefixes: tuple[str, ...] | None = None


def _hidden_path(path: str) -> bool:
    if path.startswith(_skip_dirs()):
        return True
    return path.startswith(_STDLIB) and not path.startswith(_site_dirs())


def register_runtime_file(path: str) -> None:
    """Treat ``path`` (a file or a folder) as runtime machinery: frames skip it."""
    global _skip_prefixes
    path = os.path.abspath(path)
    prefix = (path + os.sep) if os.path.isdir(path) else path
    if prefix in _skip_dirs():
        return  # registered already: the cache stays valid
    _skip_prefixes = _skip_dirs() + (prefix,)
    _hidden.clear()


def hidden_file(filename: str) -> bool:
    """Whether source file ``filename`` is runtime machinery (``hidden_code`` for a file)."""
    return filename.startswith("<") or _hidden_path(os.path.abspath(filename))


def hidden_code(code: Any) -> bool:
    """Whether frames of ``code`` are runtime machinery rather than engine or model code."""
    key = (code, code.co_filename)
    hidden = _hidden.get(key)
    if hidden is None:
        name = code.co_filename
        hidden = _hidden[key] = name.startswith("<") or _hidden_path(os.path.abspath(name))
    return hidden


def installed_path(absolute: str) -> str | None:
    """``absolute`` relative to the site-packages folder that holds it (its import path,
    ``vllm/models/deepseek_v4/attention.py``), or None when it is not installed code."""
    site = next((d for d in _site_dirs() if absolute.startswith(d)), None)
    return os.path.relpath(absolute, site) if site else None


_display_root: str | None = None


def set_display_root(root: str | None) -> None:
    """Show files below ``root`` (a project's root: the folder of its settings file)
    relative to it, so that a project's findings and graph names read the same from
    every working directory (its region maps compare across them)."""
    global _display_root
    root = os.path.abspath(root) if root is not None else None
    if root != _display_root:
        _display_root = root
        _display_cache.clear()
        _frames.clear()


def display_path(filename: str) -> str:
    """``filename`` as shown in findings: relative to the project root
    (``set_display_root``), to the folder that holds the ``capturelint`` package or to
    the working directory when below one, else absolute."""
    shown = _display_cache.get(filename)
    if shown is None:
        absolute = os.path.abspath(filename)
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        cwd = os.getcwd()
        # an installed package first, as its import path shows it (vllm/models/...): a
        # virtual environment may lie inside the checkout or the working directory
        installed = installed_path(absolute)
        if installed is not None:
            shown = installed
        elif _display_root is not None and absolute.startswith(_display_root + os.sep):
            shown = os.path.relpath(absolute, _display_root)
        elif absolute.startswith(package_root + os.sep):
            shown = os.path.relpath(absolute, package_root)
        elif absolute.startswith(cwd + os.sep):
            shown = os.path.relpath(absolute, cwd)
        else:
            shown = absolute
        _display_cache[filename] = shown
    return shown


def code_frame(code: Any, line: int) -> Frame:
    """The ``Frame`` of ``code`` running ``line``, with where its function is defined;
    one object per code object and line."""
    key = (code, code.co_filename, line)
    frame = _frames.get(key)
    if frame is None:
        frame = _frames[key] = Frame(display_path(code.co_filename), line, code.co_name,
                                     getattr(code, "co_qualname", code.co_name), os.path.abspath(code.co_filename),
                                     code.co_firstlineno)
    return frame


def user_frame(skip: int = 1) -> Frame:
    """The innermost frame of engine or model code, from ``skip`` frames above the
    caller outwards (``1``: the caller itself)."""
    f = sys._getframe(skip)
    while f is not None:
        code = f.f_code
        hidden = _hidden.get((code, code.co_filename))
        if not (hidden_code(code) if hidden is None else hidden):
            return code_frame(code, f.f_lineno)
        f = f.f_back
    return UNKNOWN_FRAME


def user_codes(skip: int = 1, limit: int = 16) -> tuple[tuple[Any, int], ...]:
    """The code objects of engine or model code running now, innermost first, with their
    lines (``limit`` at most): where a tensor a capture allocates is made, for finding the
    line that stored it (``holders.stored``)."""
    out = []
    f = sys._getframe(skip)
    while f is not None and len(out) < limit:
        if not hidden_code(f.f_code):
            out.append((f.f_code, f.f_lineno))
        f = f.f_back
    return tuple(out)


def user_stack(skip: int = 1, stop: frozenset[int] = frozenset()) -> tuple[Frame, ...]:
    """Every frame of engine or model code, innermost first, from ``skip`` frames above
    the caller outwards, up to (not including) the first frame whose ``id`` is in
    ``stop`` (``running_frames``: what ran when a capture began). It walks the whole
    stack: a few microseconds, so the tracer takes it per op in captures only."""
    f, out = sys._getframe(skip), []
    while f is not None and id(f) not in stop:
        code = f.f_code
        hidden = _hidden.get((code, code.co_filename))
        if not (hidden_code(code) if hidden is None else hidden):
            out.append(code_frame(code, f.f_lineno))
        f = f.f_back
    return tuple(out)


def running_frames() -> tuple[frozenset[int], list[Any]]:
    """The ids of the frames running now (the caller's and outwards), and the frames:
    the caller holds them while it uses the ids (until a capture ends), so that no frame
    made meanwhile can get one of their ids."""
    f, frames = sys._getframe(1), []
    while f is not None:
        frames.append(f)
        f = f.f_back
    return frozenset(id(x) for x in frames), frames


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_RUNTIME = os.path.dirname(os.path.abspath(__file__)) + os.sep


def program_frames() -> list[Any]:
    """The running frames of engine or model code, outermost first, up to where
    capturelint called the program (a target's ``run()``, a script): capturelint's own
    callers (the command line, a test runner) are not the program. Frames of the
    runtime the program calls (the emulated primitive) are passed over. The caller
    holds the frames as long as it uses them."""
    out = []
    f = sys._getframe(1)
    while f is not None:
        if out:
            file = os.path.abspath(f.f_code.co_filename)
            if file.startswith(_PACKAGE) and not file.startswith(_RUNTIME):
                break
        if not hidden_code(f.f_code):
            out.append(f)
        f = f.f_back
    out.reverse()
    return out


def capture_stack(stack: tuple[Frame, ...], entry: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """``stack`` (a full engine stack inside a capture) without the frames that were
    running when the capture began (``entry``, its outer end)."""
    if entry and len(stack) >= len(entry) and stack[len(stack) - len(entry):] == entry:
        return stack[: len(stack) - len(entry)]
    return stack


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_ENGINE_DIR = os.path.join(_PACKAGE_DIR, "engine") + os.sep  # the bundled engine: engine code
_UNCOVERED = ("Torch not compiled with CUDA enabled", "Found no NVIDIA driver", "No CUDA GPUs are available",
              "without ATen_cuda library")
# What capturelint raises on purpose in torch's or CUDA's voice (a capture begun twice,
# a graphed callable called with the wrong tensors): the program's mistake, not a limit.
_DELIBERATE = (RuntimeError, TypeError, AssertionError, ValueError)


def limit_of(e: BaseException) -> str | None:
    """What of capturelint ``e`` comes from, when it does not come from the program: a
    call the emulated CUDA device does not cover (torch's "not compiled with CUDA"), or
    an error capturelint's own code raised that it never raises on purpose. ``None``
    when the program raised it (its own code, or torch on its behalf)."""
    if any(text in str(e) for text in _UNCOVERED):
        at, said = traceback_frame(e), str(e).split(". ")[0].rstrip(".")
        return (f"the emulated CUDA device does not cover the call at {at.file}:{at.line} ({said}); "
                "docs/emulation.md lists what it emulates")
    tb = e.__traceback__
    if tb is None or isinstance(e, _DELIBERATE):
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    path = os.path.abspath(tb.tb_frame.f_code.co_filename)
    if path.startswith(_PACKAGE_DIR) and not path.startswith(_ENGINE_DIR):
        where = os.path.relpath(path, os.path.dirname(_PACKAGE_DIR.rstrip(os.sep)))
        return f"capturelint's own code raised {type(e).__name__} at {where}:{tb.tb_lineno}: {e}"
    return None


def traceback_frame(e: BaseException) -> Frame:
    """The innermost engine or model frame of an exception's traceback."""
    tb = e.__traceback__
    best = UNKNOWN_FRAME
    while tb is not None:
        code = tb.tb_frame.f_code
        if not hidden_code(code):
            best = code_frame(code, tb.tb_lineno)
        tb = tb.tb_next
    return best
