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


def check_and_untraced(arch: str, modes: tuple[str, ...] = ("PIECEWISE", "FULL"), layers: int | None = None,
                       steps: int | None = None) -> str:
    """A driver (for ``run_driver``) that checks ``arch`` under both runners and ``modes``
    (``capturelint check --engine vllm --model ARCH ... -o argv[1]``), then runs the same
    configurations untraced, graphs against their eager twin, through the family's own
    step loop; it prints ``{"status": exit status, "untraced": {"v1/PIECEWISE": [token
    agreement, max logit error], ...}}``: where a planted hazard must be flagged."""
    sizes = [*(("--layers", str(layers)) if layers is not None else ()),
             *(("--steps", str(steps)) if steps is not None else ())]
    spec = "".join(f", {name}={value}" for name, value in (("layers", layers), ("steps", steps)) if value is not None)
    return f"""
import json, sys
from capturelint.cli import main
status = main(["check", "--engine", "vllm", "--model", {arch!r}, "--mode", {",".join(modes)!r}, *{sizes!r},
               "--jobs", "1", "--format", "json", "-o", sys.argv[1]])
from capturelint.adapters.vllm import families
from capturelint.adapters.vllm.install import cpu_shim
from capturelint.adapters.vllm.model import compare
from capturelint.adapters.vllm.runners.real import runner_context
from capturelint.adapters.vllm.workload import RunSpec
from capturelint.options import CUDAGraphMode, Runner
family = families.of({arch!r}).load()
out = {{}}
with cpu_shim(), family.backend():
    loop = family.loop_for({arch!r})
    for runner in Runner:
        for mode in {tuple(modes)!r}:
            spec = RunSpec(runner=runner, mode=CUDAGraphMode(mode){spec})
            with runner_context(runner):
                graphs = loop(spec).generate()
            with runner_context(runner):
                eager = loop(spec, graphs=False).generate()
            out[f"{{runner}}/{{mode}}"] = compare(graphs, eager)
json.dump({{"status": status, "untraced": out}}, sys.stdout)
"""
