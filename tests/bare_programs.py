"""Small plain PyTorch programs for the bare-graph rules (CL108-CL110), checked as a user
would: written to a file and run with ``capturelint check --target FILE.py:targets``,
in-process, rules only (no eager twin unless a test gives one)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from capturelint.cli import main
from capturelint.report import finding_entries

PRELUDE = """\
import torch
from torch import nn
from capturelint.target import Target

DEV = "cuda" if torch.cuda.is_available() else "cpu"
"""


def write(tmp_path: Path, body: str, name: str = "prog.py") -> Path:
    path = tmp_path / name
    path.write_text(PRELUDE + textwrap.dedent(body))
    return path


def check(capsys, path: Path, func: str = "targets", *args: str) -> tuple[int, dict]:
    """``capturelint check --target PATH:FUNC --format json``: the exit status and the report."""
    capsys.readouterr()
    code = main(["check", "--target", f"{path}:{func}", "--format", "json", *args])
    out = capsys.readouterr().out
    return code, json.loads(out) if out else {}


def line_of(path: Path, text: str) -> int:
    """The one line of ``path`` that starts with ``text`` (stripped)."""
    (line,) = [i for i, t in enumerate(path.read_text().splitlines(), 1) if t.strip().startswith(text)]
    return line


def codes(doc: dict) -> list[str]:
    return [f["code"] for f in finding_entries(doc)]
