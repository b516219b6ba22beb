"""The pre-merge gate example (examples/vllm_region_gate) works on the installed vLLM.

``gate.py`` checks the installed vLLM and a symlinked copy patched with
``narrow_v1_region.patch`` (the narrow eager region under every runner, vLLM before
PR #52401) with ``capturelint check --engine vllm --runner v1 --mode PIECEWISE``; it
exits 0 only when the original passes and the patched copy fails with CL101 in
``_fused_qnorm_rope_kv_insert``. Two vLLM checks in subprocesses: about a minute.
Skips without vLLM, fails under ``CI=true`` without it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_required import require_vllm  # tests/vllm/vllm_required.py

GATE = Path(__file__).resolve().parents[2] / "examples" / "vllm_region_gate" / "gate.py"


@pytest.mark.slow
def test_gate_passes_the_original_and_fails_the_narrow_v1_region(tmp_path: Path) -> None:
    require_vllm()
    proc = subprocess.run(
        [sys.executable, str(GATE), "--workdir", str(tmp_path / "gate")],
        capture_output=True, text=True, timeout=900,
    )
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{proc.stderr}"

    original = re.search(r"^original +v1 PIECEWISE: (.*)$", out, re.M)
    assert original and original.group(1).startswith("exit 0, no findings"), out
    patched = re.search(r"^patched +v1 PIECEWISE: (.*)$", out, re.M)
    assert patched and patched.group(1).startswith("exit 1, "), out
    assert f"vllm imported from {tmp_path / 'gate' / 'patched' / 'vllm' / '__init__.py'}" in out, out

    cl101 = re.findall(r"^  CL101 (\S+):(\d+) in (\w+) ", out, re.M)
    assert cl101, out
    assert {(path, fn) for path, _, fn in cl101} == {
        ("vllm/models/deepseek_v4/attention.py", "_fused_qnorm_rope_kv_insert")
    }, out
    # the line is the profile-run F.pad branch of the patched copy, not of the original
    patched_source = (tmp_path / "gate" / "patched" / "vllm/models/deepseek_v4/attention.py").read_text()
    for _, line, _ in cl101:
        assert patched_source.splitlines()[int(line) - 1].strip().startswith("return F.pad("), line
    assert re.search(r"^gate works: ", out, re.M), out
