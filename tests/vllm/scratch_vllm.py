"""A scratch copy of the installed vLLM with one file patched, and a driver run against
it in a fresh interpreter: how the tests plant a region hazard in vLLM's own code
(``examples/vllm_region_gate/gate.py`` links the tree and applies the patch)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def gate():
    """``examples/vllm_region_gate/gate.py``, imported once."""
    spec = importlib.util.spec_from_file_location("vllm_region_gate", ROOT / "examples" / "vllm_region_gate" / "gate.py")
    if spec.name not in sys.modules:
        sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses look their module up
        spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


def planted(tmp_path: Path, target: str, patch: str) -> tuple[Path, list[str]]:
    """A copy of vLLM under ``tmp_path/copy`` (links, ``target`` real) with ``patch`` (a
    unified diff's text) applied to ``target``; and the patched file's lines."""
    g = gate()
    copy = tmp_path / "copy"
    g.link_tree(g.find_vllm(), copy / "vllm", target)
    _, hunks = g.parse_patch(patch)
    g.apply_patch(copy / "vllm" / target, hunks)
    return copy, (copy / "vllm" / target).read_text().splitlines()


def run_driver(copy: Path, tmp_path: Path, driver: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -c driver args...`` in ``tmp_path`` with the copy of vLLM first on the path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(copy), str(ROOT)]), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-c", driver, *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=timeout)
