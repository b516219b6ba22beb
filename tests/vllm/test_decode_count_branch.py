"""A branch on the number of decode tokens inside a captured segment, planted in a
scratch copy of vLLM (``tests/vllm/data/decode_count_branch.patch``, in
``DeepseekV4Attention._fused_qnorm_rope_kv_insert``, which every layer kind runs), is
flagged under exactly the runners and modes whose captures bake it, and those are
exactly the ones whose untraced graph run differs from its eager twin.

Why those: a capture's dummy batch is all decode tokens (V1 ``_dummy_run``, V2
``InputBatch.make_dummy``), so the capture takes the branch's decode-only side. V2
builds PIECEWISE metadata with the real counts (model_states/default.py:179-186) and
captures the insert (narrow region), so a mixed step replays the decode-only side:
baked. Under V1 PIECEWISE the insert runs in the wide eager region every step; FULL
(FULL_DECODE_ONLY for DeepSeek V4) replays only uniform decode batches, whose padded
counts are the capture's, and runs mixed steps eagerly. The copy is a tree of symlinks
with the one patched file real (``examples/vllm_region_gate/gate.py``'s ``link_tree``),
first on ``PYTHONPATH`` of one subprocess that runs ``capturelint check --engine vllm``
(the default three layers: sliding-window, ratio 4 with its indexer, ratio 128) and then
the untraced runs, four steps each (a prefill step, a decode step, a mixed step, a
padded decode batch). About half a minute.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capturelint.report import finding_entries

from scratch_vllm import planted, run_driver  # tests/vllm/scratch_vllm.py
from vllm_required import require_vllm  # tests/vllm/vllm_required.py

PATCH = Path(__file__).resolve().parent / "data" / "decode_count_branch.patch"
TARGET = "models/deepseek_v4/attention.py"

# The check (``capturelint check --engine vllm``), then the untraced runs, in one process.
DRIVER = """
import json, sys
from capturelint.cli import main
status = main(["check", "--engine", "vllm", "--steps", "4", "--jobs", "1", "--format", "json", "-o", sys.argv[1]])
import contextlib
from capturelint.adapters.vllm.install import cpu_shim
from capturelint.adapters.vllm.model import compare
from capturelint.adapters.vllm.runners import real
from capturelint.adapters.vllm.runners.reproduced import ReproducedLoop
from capturelint.adapters.vllm.workload import RunSpec
from capturelint.options import CUDAGraphMode, Runner
out = {}
with cpu_shim():
    for runner in Runner:
        for mode in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL):
            spec = RunSpec(runner=runner, mode=mode, steps=4)
            # the runner implementation the check used for this configuration (vLLM's own for PIECEWISE)
            is_real = real.supports(runner, mode)  # the default --vllm-runner-impl real
            loop = real.VllmRunnerLoop if is_real else ReproducedLoop
            with real.runner_context(runner) if is_real else contextlib.nullcontext():
                graphs = loop(spec).generate()
            with real.runner_context(runner) if is_real else contextlib.nullcontext():
                eager = loop(spec, graphs=False).generate()
            out[f"{runner}/{mode}"] = compare(graphs, eager)
json.dump({"status": status, "untraced": out}, sys.stdout)
"""



@pytest.mark.slow
def test_a_branch_on_the_decode_count_is_flagged_where_captures_bake_it(tmp_path):
    require_vllm()
    copy, lines = planted(tmp_path, TARGET, PATCH.read_text())
    branch_line = lines.index("        if num_decode_tokens < kv.shape[0]:") + 1

    report_path = tmp_path / "report.json"
    done = run_driver(copy, tmp_path, DRIVER, str(report_path))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == 1, done.stderr[-3000:]
    report = json.loads(report_path.read_text())

    flagged = {f"{f['runner']}/{f['mode']}" for f in finding_entries(report)}
    diverged = {config for config, (agreement, error) in result["untraced"].items() if error > 1e-3}
    assert flagged == diverged == {"v2/PIECEWISE"}, (finding_entries(report), result["untraced"])

    cl101 = [f for f in finding_entries(report) if f["code"] == "CL101"]
    assert cl101 and {f["code"] for f in finding_entries(report)} == {"CL101"}, finding_entries(report)
    for f in cl101:
        frame = f["capture_frame"]
        assert frame["file"].endswith("vllm/" + TARGET) and frame["function"] == "_fused_qnorm_rope_kv_insert", frame
        # the captured side of the planted branch: its condition, then what follows it
        assert frame["line"] >= branch_line, (frame, branch_line)
    assert "the capture recorded another branch than the step runs" in cl101[0]["message"]
    # in every layer kind: the sliding-window layer and the compressed ones (ratio 4 with its indexer, ratio 128)
    assert {f["scope"] for f in cl101} >= {"model.layers.0.attn", "model.layers.1.attn", "model.layers.2.attn"}, cl101
    v2_piecewise = next(n for n in report["numerical"] if (n["runner"], n["mode"]) == ("v2", "PIECEWISE"))
    assert v2_piecewise["max_step_error"] > 1e-3
