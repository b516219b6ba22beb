"""A vLLM check on a fresh install: stderr holds capturelint's lines only (none of
vLLM's logging), the temp folder is left as it was found (in worker processes too),
and vLLM's default invariants select vLLM's ops under every runner and mode they name.

The checks run as ``python -m capturelint.cli`` subprocesses (what a user runs: vLLM's
import-time logging and the process group happen in that process) with ``TMPDIR`` an
empty folder. ``TORCHINDUCTOR_CACHE_DIR`` points elsewhere: importing ``torch._dynamo``
makes torch's per-user compile cache folder (``torchinductor_USER``) in the temp folder,
for the bundled engine too; it is torch's cache, reused by every run, not a run's file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from capturelint.cli import main
from vllm_required import require_vllm

ROOT = Path(__file__).resolve().parents[2]


def vllm_check(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    """``capturelint check --engine vllm ARGS`` in a subprocess whose temp folder is an
    empty ``tmp_path/tmp``; the process and that folder."""
    require_vllm()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp), "CAPTURELINT_THREADS": "1",
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run([sys.executable, "-m", "capturelint.cli", "check", "--engine", "vllm", *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    return done, tmp


@pytest.fixture(scope="module")
def fresh_check(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """One fresh process for the tests below (each vLLM import costs seconds): two
    configurations in forked workers (``--jobs 2``), one of them failing (V1 PIECEWISE
    with the narrow region), the text report in a file."""
    folder = tmp_path_factory.mktemp("fresh")
    report = folder / "report.txt"
    done, tmp = vllm_check(folder, "--jobs", "2", "--runner", "v1", "--mode", "PIECEWISE,FULL", "--eager-region",
                           "narrow", "--layers", "1", "--steps", "4", "-o", str(report))
    return done, tmp, report


def test_stderr_holds_capturelint_lines_only_and_the_hint_names_the_engine(fresh_check):
    done, _, report = fresh_check
    assert done.returncode == 1, done.stderr
    # the summary, and nothing of vLLM's logging (vllm._C, Triton, the runner, the SSM cache)
    # nor a warning about an invariant selecting no op
    assert done.stderr.splitlines() == ["2 findings (CL101 x1, CL201 x1) in 2 configurations [engine vllm]"], \
        done.stderr
    hint = report.read_text().rstrip().splitlines()[-1]
    assert hint.startswith("hint: run `capturelint suggest --engine vllm --runner v1 --mode PIECEWISE,FULL "
                           "--eager-region narrow --layers 1 --steps 4`"), hint


def test_forked_workers_leave_no_file_in_the_temp_folder(fresh_check):
    done, tmp, report = fresh_check
    assert done.returncode == 1, done.stderr
    # both configurations ran (in two workers) and were compared
    first = report.read_text().splitlines()[0]
    assert first.startswith("replay DIFFERS from eager execution in v1/PIECEWISE ") and "; matches in v1/FULL " in first
    assert list(tmp.iterdir()) == []  # no gloo FileStore file per worker (capturelint-vllm-*)


@pytest.mark.parametrize("inv_id, runners", [
    ("dsv4-sparse-attention-eager", {"v1", "v2"}),
    ("dsv4-v1-attention-prep-eager", {"v1"}),
])
def test_vllm_default_invariants_select_vllms_ops_where_they_apply(inv_id, runners, capsys):
    require_vllm()
    assert main(["invariants", "--engine", "vllm", "--explain", inv_id, "--mode", "PIECEWISE", "--layers", "1",
                 "--steps", "4", "--format", "json"]) == 0
    explained = json.loads(capsys.readouterr().out)
    assert explained["source"] == "default"
    applied = {c["runner"]: c for c in explained["configurations"] if c["applies"]}
    assert set(applied) == runners
    for runner, config in applied.items():
        (selection,) = config["selections"]
        assert selection["selected"] >= 1, (runner, config)
        # vLLM's own region (per runner) holds its own invariants
        assert {o["placement"] for o in selection["ops"]} == {"eager"}, (runner, config)
    ops = {o["op"] for c in applied.values() for o in c["selections"][0]["ops"]}
    if inv_id == "dsv4-sparse-attention-eager":
        assert "_flashmla_C.sparse_decode_fwd.default" in ops  # FlashMLA's decode, under V2
    else:
        assert {"aten.mm.default", "aten.constant_pad_nd.default"} <= ops  # wq_b and the profile-run F.pad
