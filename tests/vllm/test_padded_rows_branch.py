"""A branch on the real token count inside an eager break, planted in a scratch copy of
vLLM (``tests/vllm/data/padded_rows_branch.patch``, in
``DeepseekV4Attention._sparse_indexer_and_attn``): a padded batch scales its queries.

Why no structural rule flags it (docs/rules.md, "CL901's location"): V1 pads 3 tokens to
the graph of 4 and keeps the real counts in the metadata; the replay's shadow is that
padded step run eagerly, so the break takes the same path in both and replay equals
shadow. Only the eager twin, unpadded, differs. The numerical oracle reports it (CL901)
and the break probe locates it at the break, exactly where the untraced graph run
differs from its eager twin: V1 and V2 PIECEWISE (both pad the step of 3 tokens to the
graph of 4; FULL replays only uniform decode batches of its capture size), one problem
of two findings. Before the probe, CL901 had no source line.

The check (``capturelint check --engine vllm``, the default three layers, four steps
with a padded decode batch) and the untraced runs run in one subprocess against the
copy (``scratch_vllm``); a few minutes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capturelint.report import finding_entries

from scratch_vllm import planted, run_driver  # tests/vllm/scratch_vllm.py
from test_decode_count_branch import DRIVER  # the check, then the untraced runs of every configuration
from vllm_required import require_vllm  # tests/vllm/vllm_required.py

PATCH = Path(__file__).resolve().parent / "data" / "padded_rows_branch.patch"
TARGET = "models/deepseek_v4/attention.py"


@pytest.mark.slow
def test_a_branch_on_the_real_count_in_a_break_is_located_at_the_break(tmp_path):
    require_vllm()
    copy, lines = planted(tmp_path, TARGET, PATCH.read_text())
    break_line = lines.index("    def _sparse_indexer_and_attn(") + 1

    report_path = tmp_path / "report.json"
    done = run_driver(copy, tmp_path, DRIVER, str(report_path), timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == 1, done.stderr[-3000:]
    report = json.loads(report_path.read_text())

    flagged = {f"{f['runner']}/{f['mode']}" for f in finding_entries(report)}
    diverged = {config for config, (agreement, error) in result["untraced"].items() if error > 1e-3}
    # both runners pad the step of 3 tokens to the graph of 4 under PIECEWISE; FULL replays
    # only uniform decode batches of their capture size
    assert flagged == diverged == {"v1/PIECEWISE", "v2/PIECEWISE"}, (finding_entries(report), result["untraced"])

    for f in finding_entries(report):
        assert f["code"] == "CL901", f
        # the break where the divergence enters, with its definition line in the copy of vLLM
        assert f["location"]["role"] == "break", f
        assert f["location"]["file"].endswith("vllm/" + TARGET)
        assert (f["location"]["function"], f["location"]["line"]) == ("_sparse_indexer_and_attn", break_line)
        assert "real rows padded to" in f["message"]
        numbers = next(n for n in report["numerical"] if (n["runner"], n["mode"]) == (f["runner"], f["mode"]))
        assert numbers["max_step_error"] == 0.0  # replay equals its (padded) shadow
        assert numbers["token_agreement"] < 1.0
    (problem,) = report["findings"]  # one cause under both runners: one problem
    assert problem["count"] == 2
