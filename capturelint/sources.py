"""The engine's source, read when a report is made: the lines of a finding's file, and
the branch a finding's two sides parted at.

Findings point at source lines (``runtime.protocol.Frame``); three readers need the
text behind them: the HTML report shows the lines around each frame, inline
suppressions are comments on them (``capturelint.waivers``), and CL101 looks for the
branch condition between its capture-side and step-side lines (``branch_line``). They
share ``SourceFiles``: each file read once, bounded as every input is
(``capturelint.inputs``).

**Which file.** A frame recorded by this run knows its file's absolute path
(``Frame.source``); one read back from a JSON report has only the path findings show,
looked up relative to the working directory, the folder holding capturelint and the
import path (installed packages show their import path, ``vllm/...``).

**The branch.** ``branch_line`` finds, in the innermost function that both sides run
(the capture side's stack holds it; the step side's op line is in it), the first
``if``/``elif``, ``while``, ``for``, conditional expression or ``match`` whose arms do
not hold the two sides' lines alike: one in each of two arms (``if``/``else``), or one
in an arm and the other outside the statement (an ``if`` without ``else`` that the
capture entered and the step skipped). Both runs execute the function from its top, so
the first such statement is where they parted (those nested in it, only one side
reached). Its line is where the choice is made, the line to change.
It gives ``None`` when the step's line is in a function the capture's stack does not run
(the step side keeps no stack), when both lines are one, when the source is not readable,
or when no branch statement separates them.
"""

from __future__ import annotations

import ast
import os
import sys
from typing import Iterator, Sequence

from capturelint.inputs import InputProblem, read_text
from capturelint.runtime.protocol import Frame

MAX_SOURCE_BYTES = 8 * 2**20  # a source file larger than this is not read
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class SourceFiles:
    """Source files read when a report is made, each once (see the module docstring)."""

    def __init__(self) -> None:
        self.files: dict[str, list[str] | str] = {}
        self._trees: dict[str, ast.Module | None] = {}

    def lines(self, frame: Frame) -> list[str] | str:
        """The lines of ``frame``'s file, or why they cannot be read."""
        key = frame.source or frame.file
        if key not in self.files:
            self.files[key] = self._read(frame)
        return self.files[key]

    def path(self, frame: Frame) -> str | None:
        """The file on this machine that ``frame`` names, or ``None``."""
        if os.path.isabs(frame.file):
            candidates = [frame.file]
        else:
            roots = [os.getcwd(), PACKAGE_ROOT] + [p for p in sys.path if p and os.path.isabs(p)]
            candidates = [os.path.join(root, frame.file) for root in roots]
        if frame.source:
            candidates.insert(0, frame.source)
        return next((c for c in candidates if os.path.isfile(c)), None)

    def _read(self, frame: Frame) -> list[str] | str:
        path = self.path(frame)
        if path is None:
            return "its file is not on this machine (looked beside the working directory and on the import path)"
        try:
            return read_text(path, MAX_SOURCE_BYTES).splitlines()
        except InputProblem as e:
            return f"its file {e.problem}"

    def tree(self, frame: Frame) -> ast.Module | None:
        """The parsed module of ``frame``'s file, or ``None`` where it cannot be read or parsed."""
        key = frame.source or frame.file
        if key not in self._trees:
            lines = self.lines(frame)
            try:
                self._trees[key] = None if isinstance(lines, str) else ast.parse("\n".join(lines) + "\n")
            except (SyntaxError, ValueError):
                self._trees[key] = None
        return self._trees[key]


_SHARED = SourceFiles()  # the rules' reader: a run reads each engine file once


def same_function(a: Frame, b: Frame) -> bool:
    """Whether two frames run in one function (one code object's source)."""
    if a.source and b.source and a.first_line and b.first_line:
        return (a.source, a.first_line) == (b.source, b.first_line)
    return (a.file, a.function) == (b.file, b.function)


def branch_line(capture: Sequence[Frame], step: Frame, sources: SourceFiles | None = None) -> Frame | None:
    """The branch condition where the capture side (``capture``: its engine stack,
    innermost first) and the step side (``step``: its op's line) parted, as a frame of
    their common function (see the module docstring), or ``None``."""
    common = next((f for f in capture if same_function(f, step)), None)
    if common is None or common.line == step.line:
        return None
    tree = (sources or _SHARED).tree(common)
    if tree is None:
        return None
    scope = _function(tree, common) or tree
    found = _separating(scope, common.line, step.line)
    if found is None:
        return None
    return Frame(common.file, found, common.function, common.qualname, common.source, common.first_line)


def _function(tree: ast.Module, frame: Frame) -> ast.AST | None:
    """The function ``frame`` runs in: the one defined at its code object's first line
    (a decorator's line for a decorated one), else the innermost holding its line."""
    best = None
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        if frame.first_line and first == frame.first_line:
            return node
        if node.lineno <= frame.line <= (node.end_lineno or node.lineno):
            if best is None or node.lineno >= best.lineno:
                best = node
    return best


def _arms(node: ast.AST) -> list[tuple[int, int]] | None:
    """The line spans of a branch statement's arms, or ``None`` for another node."""

    def span(body: Sequence[ast.AST]) -> tuple[int, int] | None:
        return (body[0].lineno, max(n.end_lineno or n.lineno for n in body)) if body else None

    if isinstance(node, (ast.If, ast.While, ast.For, ast.AsyncFor)):
        bodies: list[Sequence[ast.AST]] = [node.body, node.orelse]
    elif isinstance(node, ast.IfExp):
        bodies = [[node.body], [node.orelse]]
    elif isinstance(node, ast.Match):
        bodies = [case.body for case in node.cases]
    else:
        return None
    return [s for s in (span(b) for b in bodies) if s is not None]


def _branches(scope: ast.AST) -> Iterator[ast.AST]:
    """The branch statements of ``scope``'s own body (not of functions or classes it
    defines)."""
    stack: list[ast.AST] = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if _arms(node) is not None:
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _separating(scope: ast.AST, a: int, b: int) -> int | None:
    """The line of the branch of ``scope`` where lines ``a`` and ``b`` parted: of the
    branch statements whose arms hold one of them and not the other in the same arm
    (two different arms, or one arm and the other line outside the statement), the one
    that starts first. The two runs execute the function from its top, so the first such
    decision is where they parted; the ones nested in it were taken by one side only."""
    found: list[tuple[int, int]] = []
    for node in _branches(scope):
        arms = _arms(node) or []
        at_a = next((i for i, (lo, hi) in enumerate(arms) if lo <= a <= hi), None)
        at_b = next((i for i, (lo, hi) in enumerate(arms) if lo <= b <= hi), None)
        if at_a != at_b:
            line = node.test.lineno if isinstance(node, ast.IfExp) else node.lineno
            found.append((node.lineno, line))
    return min(found)[1] if found else None


__all__ = ["MAX_SOURCE_BYTES", "SourceFiles", "branch_line", "same_function"]
