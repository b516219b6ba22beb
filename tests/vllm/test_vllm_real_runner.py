"""``check --engine vllm`` with vLLM's own model runners (``--vllm-runner-impl real``, the default).

The capture decisions are made by vLLM's runners: the tests count the calls of V1's
``_dummy_run``, its dispatcher and ``execute_model``, and of V2's
``prepare_inputs_to_capture`` and ``prepare_attn``, and check that the real path gives
the verdicts of the reproduction (``runners.reproduced``, ``--vllm-runner-impl reproduced``). The three layer kinds (ratios 1, 4, 128)
run with vLLM's own KV cache plan and metadata builders (``builds`` counts them) over
the serving workload (``workload.schedule``, its defaults): requests joining
with their prompt whole (a long one at position 125, after the stand-in prefill, across
the compressions at 127), mixed prefill and decode steps, a batch of 3 padded to the
capture size 4, requests leaving.
"""

from __future__ import annotations

import json

import pytest
import torch

from capturelint.cli import main
from vllm_required import require_vllm
from capturelint.report import finding_entries

ATTENTION = "vllm/models/deepseek_v4/attention.py"
# the default workload (capture sizes 2 and 4, batch sizes 1, 2, 3, 3, 2, ...), five of its steps
SMALL = ("--mode", "PIECEWISE", "--layers", "3", "--steps", "5")
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

    def spy_dispatch(self, num_tokens, *args, **kwargs):
        mode, descriptor = dispatch(self, num_tokens, *args, **kwargs)
        seen["dispatch"].append((num_tokens, mode.name, descriptor.num_tokens))
        return mode, descriptor

    def spy_execute(self, so, *args, **kwargs):
        seen["execute_model"].append((so.total_num_scheduled_tokens, [r.req_id for r in so.scheduled_new_reqs],
                                      list(so.scheduled_cached_reqs.req_ids), sorted(so.finished_req_ids)))
        return execute(self, so, *args, **kwargs)

    monkeypatch.setattr(GPUModelRunner, "_dummy_run", spy_dummy_run)
    monkeypatch.setattr(CudagraphDispatcher, "dispatch", spy_dispatch)
    monkeypatch.setattr(GPUModelRunner, "execute_model", spy_execute)
    return seen


@pytest.fixture()
def builds(monkeypatch):
    """Every ``build`` of vLLM's metadata builders of the compressed layers, while the
    test runs: (builder, its layer names, the batch's ``max_seq_len``, the C128
    compressor's ``c128_boundary``)."""
    require_vllm()
    from vllm.models.deepseek_v4.compressor import CompressorMetadataBuilder
    from vllm.models.deepseek_v4.sparse_mla import DeepseekV4SparseMLAMetadataBuilder
    from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerMetadataBuilder

    seen: list[tuple[str, tuple[str, ...], int, bool | None]] = []
    for cls in (DeepseekV4SparseMLAMetadataBuilder, CompressorMetadataBuilder, DeepseekV32IndexerMetadataBuilder):
        def spy(self, common_prefix_len, cm, *args, _build=cls.build, **kwargs):
            out = _build(self, common_prefix_len, cm, *args, **kwargs)
            seen.append((type(self).__name__, tuple(self.layer_names), cm.max_seq_len, getattr(out, "c128_boundary", None)))
            return out

        monkeypatch.setattr(cls, "build", spy)
    return seen


# the compressed layers' builders of one step, in vLLM's attention-group order
STEP_BUILDERS = [("DeepseekV32IndexerMetadataBuilder", ("model.layers.1.attn.indexer.k_cache",)),
                 ("DeepseekV4FlashMLAMetadataBuilder", ("model.layers.1.attn",)),
                 ("DeepseekV4FlashMLAMetadataBuilder", ("model.layers.2.attn",)),
                 ("CompressorMetadataBuilder", ("model.layers.1.attn.indexer.compressor.state_cache",)),
                 ("CompressorMetadataBuilder", ("model.layers.1.attn.compressor.state_cache",)),
                 ("CompressorMetadataBuilder", ("model.layers.2.attn.compressor.state_cache",))]


# the longest sequence of each step of the default workload: request 0 (prompt of 2 from
# 0), request 1 (long: prompt of 3 from 125, over 127), request 2 (prompt of 2 from 0)
WORKLOAD_SEQ_LENS = [2, 128, 129, 130, 131]


def step_builds(seq_len: int) -> list[tuple]:
    """What ``builds`` sees for one batch of ``max_seq_len`` ``seq_len``: the C128
    compressor's boundary when its window closes (position 127, in the long request's
    prompt)."""
    return [(*b, seq_len, (seq_len % 128 == 0) if b[0] == "CompressorMetadataBuilder" and "layers.2" in b[1][0]
             else None) for b in STEP_BUILDERS]


def check(tmp_path, monkeypatch, impl: str, *args: str) -> tuple[int, dict]:
    out = tmp_path / f"{impl}.json"
    code = main(["check", "--engine", "vllm", "--vllm-runner-impl", impl, *SMALL, *args, "--format", "json", "-o",
                 str(out)])
    return code, json.loads(out.read_text())


def test_v1_narrow_region_fails_where_vllms_runner_captured_without_metadata(tmp_path, monkeypatch, calls, builds):
    code, report = check(tmp_path, monkeypatch, "real", *V1, "--eager-region", "narrow")
    assert code == 1
    cl101 = [f for f in finding_entries(report) if f["code"] == "CL101"]
    # every layer kind: the capture recorded the profile branch (q padded, nothing written)
    assert [f["scope"] for f in cl101] == ["model.layers.0.attn", "model.layers.1.attn", "model.layers.2.attn"]
    for f in cl101:
        assert f["capture_frame"]["file"].endswith(ATTENTION)
        assert f["capture_frame"]["function"] == "_fused_qnorm_rope_kv_insert"
        assert f["op"] == "aten.constant_pad_nd.default"
        assert "attn_metadata was None" in f["message"]
        assert "_C.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert.default" in f["message"]
    # the compressed layers' steps also write their compressor states and compressed
    # entries, which the captured graph lost
    lost = ("capturelint_vllm.save_partial_states.default", "capturelint_vllm.compress_norm_rope_store.default")
    assert [all(op in f["message"] for op in lost) for f in cl101] == [False, True, True]
    # vLLM's builders made the compressed layers' metadata at every step (none at the
    # PIECEWISE capture): the traced graph run's, its eager twin's, and, since they
    # differ, an untraced graph run's, whose break calls locate a divergence no rule
    # explains (adapters/vllm/break_probe.py)
    assert builds == [b for _ in range(3) for seq_len in WORKLOAD_SEQ_LENS for b in step_builds(seq_len)]
    # vLLM's capture loop made the decision: per capture size, largest first, one warmup
    # (mode NONE) and one capturing _dummy_run, PIECEWISE, neither forcing attention metadata
    from vllm.config import CUDAGraphMode

    # (again for the untraced graph run, which captures its own graphs)
    assert calls["dummy_run"] == [(n, mode, False, capturing) for n in (4, 2)
                                  for mode, capturing in ((CUDAGraphMode.NONE, False), (CUDAGraphMode.PIECEWISE, True))] * 2
    # the scheduler outputs of the workload, the traced graph run's, the eager twin's and
    # the untraced graph run's: a
    # prefill-only step, two mixed prefill-decode steps, decodes, requests leaving
    steps = [(2, ["req0"], [], []), (4, ["req1"], ["req0"], []), (4, ["req2"], ["req0", "req1"], []),
             (3, [], ["req0", "req1", "req2"], []), (2, [], ["req1", "req2"], ["req0"])]
    assert calls["execute_model"] == steps * 3
    # vLLM's runner padded the step of 3 tokens to the capture size 4 and replayed that
    # graph (the untraced graph run did the same); the eager twin's steps dispatched to no graph
    assert calls["dispatch"][4:9] == [(2, "PIECEWISE", 2), (4, "PIECEWISE", 4), (4, "PIECEWISE", 4),
                                      (3, "PIECEWISE", 4), (2, "PIECEWISE", 2)]
    assert calls["dispatch"][9:14] == [(n, "NONE", n) for n in (2, 4, 4, 3, 2)]
    assert calls["dispatch"][14:] == calls["dispatch"][:9]


def test_v2_builds_metadata_for_its_capture_and_the_narrow_region_holds(tmp_path, monkeypatch, builds):
    """V2's own capture (``cudagraph_utils.py``) prepares attention metadata for a
    PIECEWISE capture (``prepare_inputs_to_capture``, ``prepare_attn(for_capture=False)``),
    the compressed layers' too, so vLLM's narrow region is safe there, as the shim says."""
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
    # each capture size's warmup and capture forward, not FULL (the traced run's: the
    # eager twin agrees with it, so no untraced graph run is made)
    assert seen["prepare_inputs_to_capture"] == [False] * 4
    assert seen["prepare_attn"] and not any(seen["prepare_attn"])  # PIECEWISE: for_capture=False
    # each capture size's warmup and capture dummy batch (4 and 2 requests of one token),
    # then the steps of the traced graph run; then the steps of the eager twin
    steps = [b for seq_len in WORKLOAD_SEQ_LENS for b in step_builds(seq_len)]
    assert builds == step_builds(1) * 4 + steps + steps
    shim_code, shim = check(tmp_path, monkeypatch, "reproduced", *v2)
    assert (real_code, shim_code) == (0, 0)
    assert real["findings"] == shim["findings"] == []
    [num] = real["numerical"]
    assert num["replay_steps"] == 5 and num["max_step_error"] == 0.0 and num["token_agreement"] == 1.0


def test_an_unknown_runner_implementation_is_one_line(tmp_path, capsys):
    code = main(["check", "--engine", "vllm", "--vllm-runner-impl", "shim", *SMALL, *V1])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["capturelint: error: Invalid value for '--vllm-runner-impl': 'shim' is not one of 'real', "
                   "'reproduced'; see 'capturelint check --help'"]


def test_the_environment_switch_of_earlier_versions_is_refused_naming_the_option(tmp_path, monkeypatch, capsys):
    # it chose the step loop per configuration behind the command line's back: now an option
    monkeypatch.setenv("CAPTURELINT_VLLM_RUNNER_IMPL", "shim")
    code = main(["check", "--engine", "vllm", *SMALL, *V1])
    assert code == 2
    assert capsys.readouterr().err == (
        "capturelint: error: CAPTURELINT_VLLM_RUNNER_IMPL is no longer read; use --vllm-runner-impl real or "
        "reproduced (settings: vllm-runner-impl), and unset CAPTURELINT_VLLM_RUNNER_IMPL\n")


def test_vllms_triton_slot_mapping_kernel_runs_in_the_interpreter():
    """vLLM's own ``_COMPUTE_SLOT_MAPPING_KERNEL`` (block_table.py) on CPU tensors: each
    token's slot is its request's block times the block size plus its offset, the rest
    of the buffer is padding (-1); outside the block the kernel is vLLM's again."""
    require_vllm()
    from vllm.v1.worker import block_table

    from capturelint.adapters.vllm.kernels.interpreter import interpret_modules

    placeholder = block_table.ComputeSlotMappingKernel.kernel
    slots = torch.zeros(6, dtype=torch.int64)
    with interpret_modules(("vllm.v1.worker.block_table",)):
        block_table.ComputeSlotMappingKernel().__call__(
            2, 3, 6, torch.tensor([0, 1, 3], dtype=torch.int32), torch.tensor([5, 64, 70]),
            torch.tensor([[3, 4], [6, 7]], dtype=torch.int32), 2, slots, 64, 1, 0, 1)
    assert slots.tolist() == [3 * 64 + 5, 7 * 64 + 0, 7 * 64 + 6, -1, -1, -1]
    assert block_table.ComputeSlotMappingKernel.kernel is placeholder


def _slot_mapping(slots: torch.Tensor) -> list[int]:
    from vllm.v1.worker import block_table

    block_table.ComputeSlotMappingKernel().__call__(
        2, 3, 6, torch.tensor([0, 1, 3], dtype=torch.int32), torch.tensor([5, 64, 70]),
        torch.tensor([[3, 4], [6, 7]], dtype=torch.int32), 2, slots, 64, 1, 0, 1)
    return slots.tolist()


@pytest.mark.parametrize("debug", [False, True])
def test_the_interpreters_overflow_checks_are_off_only_where_they_assert_nothing(debug, monkeypatch):
    """Without ``debug`` Triton's ``device_assert`` checks nothing, so the interpreter's
    overflow sanitising (int64 recomputation of each integer op) is dead work: off for
    the block, the same slots computed as with it on; with ``debug`` it asserts, and stays on."""
    require_vllm()
    import dataclasses

    from triton.runtime import interpreter

    from capturelint.adapters.vllm.kernels.interpreter import interpret_modules

    options = dataclasses.replace(interpreter.interpreter_builder.options, debug=debug, sanitize_overflow=True)
    monkeypatch.setattr(interpreter.interpreter_builder, "options", options)
    with interpret_modules(("vllm.v1.worker.block_table",)):
        inside = interpreter.interpreter_builder.options
        fast = _slot_mapping(torch.zeros(6, dtype=torch.int64))
        interpreter.interpreter_builder.options = options
        checked = _slot_mapping(torch.zeros(6, dtype=torch.int64))
    assert inside.sanitize_overflow == debug
    assert interpreter.interpreter_builder.options is options  # restored on exit
    assert fast == checked == [3 * 64 + 5, 7 * 64 + 0, 7 * 64 + 6, -1, -1, -1]


def test_vllms_two_runners_compute_the_shims_logits_with_their_own_builders():
    """Eager, the default workload (prefills, a long request's prefill across the
    compressions at 127, mixed and decode steps): Model Runner V1 and V2, each with its
    own input preparation, KV cache plan and metadata builders, over the stand-in prefill
    at the blocks each owns, compute the shim's logits to the bit, on the rows vLLM
    samples from (each request's last token of each step)."""
    require_vllm()
    from capturelint.adapters.vllm.install import cpu_shim
    from capturelint.adapters.vllm.runners.real import VllmRunnerLoop, runner_context
    from capturelint.adapters.vllm.runners.reproduced import ReproducedLoop
    from capturelint.adapters.vllm.workload import RunSpec
    from capturelint.options import Runner

    logits = []
    with cpu_shim():
        for runner in (Runner.V1, Runner.V2):
            spec = RunSpec(runner=runner, layers=3)
            with runner_context(spec.runner):
                logits.append(VllmRunnerLoop(spec, graphs=False).generate())
        shim = ReproducedLoop(RunSpec(layers=3), graphs=False)
        every_token = shim.generate()
    ends = torch.cumsum(torch.tensor([s.query_len for step in shim.steps for s in step]), 0) - 1
    v1, v2 = logits
    assert v1.shape == v2.shape == (12, 96) and bool(v1.isfinite().all())
    assert torch.equal(v1, v2)
    assert torch.equal(v1, every_token[ends])
