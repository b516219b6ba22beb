"""Region changes to vLLM's DeepSeek V4 code, planted in a scratch copy of vLLM (as
``tests/vllm/test_decode_count_branch.py`` plants its branch): each gets a verdict, and
the numbers the report prints are the program's, those of an untraced graph run of the
same configuration against its eager twin.

- ``sparse_break_removed.patch``: ``@eager_break_during_capture`` removed from
  ``DeepseekV4Attention._sparse_indexer_and_attn``. Under V2 PIECEWISE (the narrow
  region) the sparse attention is captured, and ``torch.ops.vllm.sparse_attn_indexer``,
  whose implementation is itself an eager break, is entered from inside the op's
  dispatch: the emulated capture ends and begins inside a dispatched op (it used to
  crash, "pop from an empty deque"). The verdict: the declared invariant
  (``dsv4-sparse-attention-eager``, CL201) and what replay does; the indexer op, still
  its own break, is not reported captured.
- ``compressor_captured.patch``: the ratio-128 compressor call moved out of V1's eager
  region into the captured forward. V1 captures without attention metadata, so the
  captured compressor returns early and replay never writes its caches. The traced run
  used to compute agreement 1.00 and a replay equal to its shadow (error 0) where the
  untraced run agrees 0.92: the shadow's compressor wrote the caches, which view one
  buffer with the other layers' caches, and the next break's reused call re-applied
  that whole buffer. Its CL101 sits in a kernel capturelint stands in for: the finding
  names vLLM's line that calls the kernel, not the reference's.
- ``break_given_capture_metadata.patch``: V2 PIECEWISE, ``_prepare_and_attn`` hands the
  eager break the attention metadata its captured code read; on replay the break gets
  the capture's metadata objects, whose host values are the capture batch's, in every
  layer kind. The traced run used to reuse its shadow's break calls (handed the step's
  metadata) and print agreement 1.00, error 0, where the program agrees 0.17.
- ``--eager-region narrow`` under V1 (no patch): every layer kind's input preparation
  (ratio 1: the SWA cache insert; ratio 4: compressor and indexer; ratio 128: the
  compressor) captured without metadata; the traced run's numbers are the program's on
  all three at once.

The numbers a report prints come from the traced run itself (its output against its
eager twin); each test runs the same configuration untraced and compares. One small
configuration each, one subprocess each (vLLM's import is most of it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capturelint.report import finding_entries

from scratch_vllm import planted, run_driver  # tests/vllm/scratch_vllm.py
from vllm_required import require_vllm  # tests/vllm/vllm_required.py

DATA = Path(__file__).resolve().parent / "data"
TARGET = "models/deepseek_v4/attention.py"

# The check of one configuration, then the same configuration untraced, in one process.
DRIVER = """
import contextlib, json, sys
from capturelint.cli import main
runner, mode, layers, steps, report, region = sys.argv[1:7]
status = main(["check", "--engine", "vllm", "--runner", runner, "--mode", mode, "--layers", layers, "--steps", steps,
               "--eager-region", region, "--jobs", "1", "--format", "json", "-o", report])
from capturelint.adapters.vllm.install import cpu_shim
from capturelint.adapters.vllm.model import compare
from capturelint.adapters.vllm.runners import real
from capturelint.adapters.vllm.workload import RunSpec
from capturelint.options import CUDAGraphMode, EagerRegion, Runner
spec = RunSpec(runner=Runner(runner), mode=CUDAGraphMode[mode], layers=int(layers), steps=int(steps),
               eager_region=EagerRegion(region))
with cpu_shim(), real.runner_context(spec.runner):  # PIECEWISE: vLLM's own runner, as the check runs it
    graphs = real.VllmRunnerLoop(spec).generate()
    eager = real.VllmRunnerLoop(spec, graphs=False).generate()
json.dump({"status": status, "untraced": compare(graphs, eager)}, sys.stdout)
"""



def check_mutation(tmp_path: Path, patch: str | None, runner: str, mode: str, layers: int, steps: int,
                   region: str = "per-runner") -> tuple[dict, dict]:
    """The JSON report of ``capturelint check`` on a copy of vLLM with ``patch`` applied
    (None: the installed vLLM), and the untraced run's ``(token agreement, max logit
    error)`` of the same configuration."""
    copy = planted(tmp_path, TARGET, (DATA / patch).read_text())[0] if patch else tmp_path
    report = tmp_path / "report.json"
    done = run_driver(copy, tmp_path, DRIVER, runner, mode, str(layers), str(steps), str(report), region)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "error" not in done.stderr, done.stderr[-3000:]  # a verdict, not "the engine raised ..."
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return json.loads(report.read_text()), result


def assert_program_numbers(report: dict, untraced: list[float]) -> None:
    """The traced run's numbers are the program's: the agreement and logit error it
    prints (its own output against its eager twin) are the untraced run's (JSON keeps 6
    digits), and where the program's replay differs from eager, the traced run's
    replays differ from their shadows too (a replay that computed the shadow's values,
    its writes leaked, would print 0)."""
    (numerical,) = report["numerical"]
    agreement, error = untraced
    assert numerical["token_agreement"] == pytest.approx(agreement, abs=1e-6), (numerical, untraced)
    assert numerical["max_logit_error"] == pytest.approx(error, rel=1e-5), (numerical, untraced)
    if error > 1e-3:
        assert numerical["max_step_error"] > 1e-3, numerical


@pytest.mark.slow
def test_a_break_removed_around_an_op_that_is_itself_a_break_gets_a_verdict(tmp_path):
    require_vllm()
    report, result = check_mutation(tmp_path, "sparse_break_removed.patch", "v2", "PIECEWISE", 2, 4)
    assert result["status"] == 1
    codes = {f["code"] for f in finding_entries(report)}
    assert "CL201" in codes, finding_entries(report)
    cl201 = [f for f in finding_entries(report) if f["code"] == "CL201"]
    assert {f["invariant"] for f in cl201} == {"dsv4-sparse-attention-eager"}, cl201
    # the captured sparse attention is reported; the indexer op, still an eager break of its
    # own (sparse_attn_indexer.py:437), is not: no finding sits in it
    assert all(not f["location"]["file"].endswith("sparse_attn_indexer.py") for f in finding_entries(report)), \
        [f["location"] for f in finding_entries(report)]
    agreement, error = result["untraced"]
    assert error > 1e-3  # the untraced graph run differs from its eager twin: replay is wrong
    assert_program_numbers(report, result["untraced"])


@pytest.mark.slow
def test_the_check_prints_what_the_untraced_run_computes(tmp_path):
    require_vllm()
    report, result = check_mutation(tmp_path, "compressor_captured.patch", "v1", "PIECEWISE", 3, 6)
    assert result["status"] == 1
    agreement, error = result["untraced"]
    assert agreement < 1.0 and error > 1e-3  # the compressor's caches are never written on replay
    assert_program_numbers(report, result["untraced"])
    # the ratio-128 layer's compressor, captured: the declared invariant, and the state
    # write replay never makes, located at vLLM's call of the kernel (compressor.py), not
    # inside capturelint's CPU reference for it (adapters/vllm/kernels/compressed.py)
    assert {f["code"] for f in finding_entries(report)} == {"CL101", "CL201"}, finding_entries(report)
    assert all(f["scope"].startswith("model.layers.2.attn") for f in finding_entries(report)), finding_entries(report)
    for f in finding_entries(report):
        assert f["location"]["file"].endswith("vllm/models/deepseek_v4/compressor.py"), f["location"]
        assert f["location"]["function"] == "forward", f["location"]
    (cl101,) = [f for f in finding_entries(report) if f["code"] == "CL101"]
    assert cl101["shadow_frame"]["file"].endswith("vllm/models/deepseek_v4/compressor.py"), cl101


@pytest.mark.slow
def test_every_layer_kind_captured_without_metadata_prints_the_programs_numbers(tmp_path):
    require_vllm()
    report, result = check_mutation(tmp_path, None, "v1", "PIECEWISE", 3, 6, region="narrow")
    assert result["status"] == 1
    agreement, error = result["untraced"]
    assert agreement < 1.0 and error > 1e-3  # no layer's cache is written on replay
    assert_program_numbers(report, result["untraced"])
    # the baked profile-run branch, found in each of the three layer kinds
    cl101 = [f for f in finding_entries(report) if f["code"] == "CL101"]
    assert {f["scope"].split(".")[2] for f in cl101} == {"0", "1", "2"}, [f["scope"] for f in cl101]


@pytest.mark.slow
def test_a_break_handed_the_captures_metadata_prints_the_programs_numbers(tmp_path):
    require_vllm()
    report, result = check_mutation(tmp_path, "break_given_capture_metadata.patch", "v2", "PIECEWISE", 3, 6)
    assert result["status"] == 1
    agreement, error = result["untraced"]
    assert agreement < 0.5 and error > 1.0  # the capture batch's counts on every step
    assert_program_numbers(report, result["untraced"])
    # the stale break argument, found in each of the three layer kinds
    assert {(f["code"], f["scope"]) for f in finding_entries(report)} == {
        ("CL107", f"model.layers.{i}.attn") for i in range(3)}, finding_entries(report)
    # one cause, the argument the break was handed: one problem with its count (hundreds of
    # findings, one per tensor inside the metadata, layer and graph), not one entry each
    (problem,) = report["findings"]
    assert problem["count"] == report["summary"]["findings"] > 100 and report["summary"]["problems"] == 1
