"""``check --engine vllm`` with vLLM's own model runners (``CAPTURELINT_VLLM_RUNNER_IMPL=real``).

The capture decisions are made by vLLM's runners: the tests count the calls of V1's
``_dummy_run``, its dispatcher and ``execute_model``, and of V2's
``prepare_inputs_to_capture`` and ``prepare_attn``, and check that the real path gives
the verdicts of the shim (``vllm_runners``). One layer and four steps keep them small.
"""

from __future__ import annotations

import json

import pytest
import torch

from capturelint.cli import main
from vllm_required import require_vllm

ATTENTION = "vllm/models/deepseek_v4/attention.py"
SMALL = ("--mode", "PIECEWISE", "--layers", "1", "--steps", "4")
V1 = ("--runner", "v1")


@pytest.fixture()
def calls(monkeypatch):
    """Every call of vLLM's ``_dummy_run``, ``execute_model`` and dispatcher, with what
    it decided, while the test runs."""
    require_vllm()
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    seen: dict[str, list] = {"dummy_run": [], "dispatch": [], "execute_model": []}
    dummy_run, dispatch, execute = GPUModelRunner._dummy_run, CudagraphDispatcher.dispatch, GPUModelRunner.execute_model

    def spy_dummy_run(self, num_tokens, *args, **kwargs):
        seen["dummy_run"].append((num_tokens, kwargs.get("cudagraph_runtime_mode"), kwargs.get("force_attention", False),
                                  kwargs.get("is_graph_capturing", False)))
        return dummy_run(self, num_tokens, *args, **kwargs)

    def spy_dispatch(self, *args, **kwargs):
        mode, descriptor = dispatch(self, *args, **kwargs)
        seen["dispatch"].append((mode.name, descriptor.num_tokens))
        return mode, descriptor

    def spy_execute(self, scheduler_output, *args, **kwargs):
        seen["execute_model"].append(scheduler_output.total_num_scheduled_tokens)
        return execute(self, scheduler_output, *args, **kwargs)

    monkeypatch.setattr(GPUModelRunner, "_dummy_run", spy_dummy_run)
    monkeypatch.setattr(CudagraphDispatcher, "dispatch", spy_dispatch)
    monkeypatch.setattr(GPUModelRunner, "execute_model", spy_execute)
    return seen


def check(tmp_path, monkeypatch, impl: str, *args: str) -> tuple[int, dict]:
    monkeypatch.setenv("CAPTURELINT_VLLM_RUNNER_IMPL", impl)
    out = tmp_path / f"{impl}.json"
    code = main(["check", "--engine", "vllm", *SMALL, *args, "--format", "json", "-o", str(out)])
    return code, json.loads(out.read_text())


def test_v1_narrow_region_fails_where_vllms_runner_captured_without_metadata(tmp_path, monkeypatch, calls):
    code, report = check(tmp_path, monkeypatch, "real", *V1, "--eager-region", "narrow")
    assert code == 1
    cl101 = [f for f in report["findings"] if f["code"] == "CL101"]
    assert [f["scope"] for f in cl101] == ["model.layers.0.attn"]
    (f,) = cl101
    assert f["capture_frame"]["file"].endswith(ATTENTION)
    assert f["capture_frame"]["function"] == "_fused_qnorm_rope_kv_insert"
    assert f["op"] == "aten.constant_pad_nd.default"
    assert "attn_metadata was None" in f["message"]
    # vLLM's capture loop made the decision: one warmup (mode NONE) and one capturing
    # _dummy_run of the batch, PIECEWISE, neither forcing attention metadata
    from vllm.config import CUDAGraphMode

    assert calls["dummy_run"] == [(2, CUDAGraphMode.NONE, False, False), (2, CUDAGraphMode.PIECEWISE, False, True)]
    # the eager twin's steps and the graph run's steps went through execute_model
    assert calls["execute_model"] == [2] * 8
    assert ("PIECEWISE", 2) in calls["dispatch"]


def test_v1_with_vllms_own_region_matches_the_shim(tmp_path, monkeypatch, calls):
    real_code, real = check(tmp_path, monkeypatch, "real", *V1)
    assert calls["dummy_run"], "vLLM's runner did not capture"
    calls["dummy_run"].clear()
    shim_code, shim = check(tmp_path, monkeypatch, "shim", *V1)
    assert calls["dummy_run"] == []  # the shim reproduces the capture; vLLM's runner is not involved
    assert (real_code, shim_code) == (0, 0)
    assert real["findings"] == shim["findings"] == []
    assert {c["eager_region"] for c in real["configurations"]} == {"wide"}
    assert real["numerical"] == shim["numerical"]
    assert real["numerical"][0]["replay_steps"] == 4 and real["numerical"][0]["max_step_error"] == 0.0


def test_v2_builds_metadata_for_its_capture_and_the_narrow_region_holds(tmp_path, monkeypatch):
    """V2's own capture (``cudagraph_utils.py``) prepares attention metadata for a
    PIECEWISE capture (``prepare_inputs_to_capture``, ``prepare_attn(for_capture=False)``),
    so vLLM's narrow region is safe there, as the shim says."""
    require_vllm()
    from vllm.v1.worker.gpu import cudagraph_utils
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    seen: dict[str, list] = {"prepare_inputs_to_capture": [], "prepare_attn": []}
    prepare_inputs, prepare_attn = cudagraph_utils.prepare_inputs_to_capture, DefaultModelState.prepare_attn

    def spy_prepare_inputs(*args, **kwargs):
        seen["prepare_inputs_to_capture"].append(kwargs["full_cudagraph"])
        return prepare_inputs(*args, **kwargs)

    def spy_prepare_attn(self, *args, for_capture=False, **kwargs):
        seen["prepare_attn"].append(for_capture)
        return prepare_attn(self, *args, for_capture=for_capture, **kwargs)

    monkeypatch.setattr(cudagraph_utils, "prepare_inputs_to_capture", spy_prepare_inputs)
    monkeypatch.setattr(DefaultModelState, "prepare_attn", spy_prepare_attn)
    v2 = ("--runner", "v2", "--eager-region", "narrow")
    real_code, real = check(tmp_path, monkeypatch, "real", *v2)
    assert seen["prepare_inputs_to_capture"] == [False, False]  # the warmup's and the capture's forward, not FULL
    assert seen["prepare_attn"] and not any(seen["prepare_attn"])  # PIECEWISE: for_capture=False
    shim_code, shim = check(tmp_path, monkeypatch, "shim", *v2)
    assert (real_code, shim_code) == (0, 0)
    assert real["findings"] == shim["findings"] == []
    assert real["numerical"] == shim["numerical"]
    assert real["numerical"][0]["replay_steps"] == 4 and real["numerical"][0]["max_step_error"] == 0.0


def test_an_unknown_runner_implementation_is_one_line(tmp_path, monkeypatch, capsys):
    require_vllm()
    monkeypatch.setenv("CAPTURELINT_VLLM_RUNNER_IMPL", "bogus")
    code = main(["check", "--engine", "vllm", *SMALL, *V1, "--format", "json", "-o", str(tmp_path / "r.json")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["capturelint: error: CAPTURELINT_VLLM_RUNNER_IMPL='bogus' is not a runner implementation; use real "
                   "or shim"]


def test_vllms_triton_slot_mapping_kernel_runs_in_the_interpreter():
    """vLLM's own ``_COMPUTE_SLOT_MAPPING_KERNEL`` (block_table.py) on CPU tensors: each
    token's slot is its request's block times the block size plus its offset, the rest
    of the buffer is padding (-1); outside the block the kernel is vLLM's again."""
    require_vllm()
    from vllm.v1.worker import block_table

    from capturelint.adapters.vllm_triton import interpret_modules

    placeholder = block_table.ComputeSlotMappingKernel.kernel
    slots = torch.zeros(6, dtype=torch.int64)
    with interpret_modules(("vllm.v1.worker.block_table",)):
        block_table.ComputeSlotMappingKernel().__call__(
            2, 3, 6, torch.tensor([0, 1, 3], dtype=torch.int32), torch.tensor([5, 64, 70]),
            torch.tensor([[3, 4], [6, 7]], dtype=torch.int32), 2, slots, 64, 1, 0, 1)
    assert slots.tolist() == [3 * 64 + 5, 7 * 64 + 0, 7 * 64 + 6, -1, -1, -1]
    assert block_table.ComputeSlotMappingKernel.kernel is placeholder
