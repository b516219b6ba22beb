"""The gated delta-net family: the CPU references of the FLA kernels vLLM's GDN layers
call (``capturelint.adapters.vllm.kernels.gdn_fla``), against vLLM's own Triton kernels
run in Triton's interpreter, float32 (the interpreter computes bf16 tiles wrongly; the
chunk kernel's public wrapper refuses float32, so its forward ``chunk_gated_delta_rule_fwd``
is called, the same kernels)."""

from __future__ import annotations

import contextlib

import pytest

from capturelint.report import finding_entries
import torch
from vllm_required import require_vllm  # tests/vllm/vllm_required.py

vllm = require_vllm()

from capturelint.adapters.vllm.kernels import gdn_fla  # noqa: E402
from capturelint.errors import CapturelintError  # noqa: E402

FLA = "vllm.third_party.flash_linear_attention.ops"
H, K, HV, V = 2, 16, 4, 16


@contextlib.contextmanager
def _interpreted(*modules: str, heuristics: tuple[str, str] | None = None):
    """vLLM's kernels of ``modules`` in Triton's interpreter. ``heuristics`` (module,
    kernel): the kernel's ``@triton.heuristics`` flags, which vLLM's Triton placeholder
    drops with the decorator, put back around the interpreted kernel (what each flag
    says: an argument was given)."""
    import importlib

    import triton

    from capturelint.adapters.vllm.kernels.interpreter import interpret_modules

    with interpret_modules(tuple(f"{FLA}.{m}" for m in modules)):
        if heuristics is None:
            yield
            return
        module = importlib.import_module(f"{FLA}.{heuristics[0]}")
        kernel = getattr(module, heuristics[1])
        given = {"USE_INITIAL_STATE": "h0", "IS_VARLEN": "cu_seqlens", "IS_CONTINUOUS_BATCHING": "ssm_state_indices",
                 "IS_SPEC_DECODING": "num_accepted_tokens"}
        flags = {flag: (lambda args, name=name: args[name] is not None) for flag, name in given.items()}
        setattr(module, heuristics[1], triton.heuristics(flags)(kernel))
        try:
            yield
        finally:
            setattr(module, heuristics[1], kernel)


def _inputs(tokens: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, tokens, H, K, generator=gen)
    k = torch.randn(1, tokens, H, K, generator=gen)
    v = torch.randn(1, tokens, HV, V, generator=gen)
    a = torch.randn(1, tokens, HV, generator=gen)
    b = torch.randn(1, tokens, HV, generator=gen)
    A_log = torch.randn(HV, generator=gen) * 0.5
    dt_bias = torch.randn(HV, generator=gen)
    return q, k, v, a, b, A_log, dt_bias


def test_post_conv_prep_matches_vllms_kernel():
    import importlib

    gen = torch.Generator().manual_seed(1)
    L = 19  # more than one block of 16 tokens
    conv = torch.randn(L, 2 * H * K + HV * V, generator=gen)
    a, b = torch.randn(L, HV, generator=gen) * 8, torch.randn(L, HV, generator=gen)  # softplus past its threshold too
    A_log, dt_bias = torch.randn(HV, generator=gen), torch.randn(HV, generator=gen) * 10
    mine = gdn_fla.fused_post_conv_prep(conv, a, b, A_log, dt_bias, H, K, V, apply_l2norm=True)
    with _interpreted("fused_gdn_prefill_post_conv"):
        theirs = importlib.import_module(f"{FLA}.fused_gdn_prefill_post_conv").fused_post_conv_prep(
            conv, a, b, A_log, dt_bias, H, K, V, apply_l2norm=True)
    for name, x, y in zip("qkvgb", mine, theirs):
        assert x.shape == y.shape and x.dtype == y.dtype, name
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5, msg=name)
    # without the norm q and k are the conv output's own columns; exp(g) when asked
    q, _, _, g_exp, _ = gdn_fla.fused_post_conv_prep(conv, a, b, A_log, dt_bias, H, K, V, apply_l2norm=False,
                                                     output_g_exp=True)
    assert torch.equal(q.reshape(L, -1), conv[:, :H * K])
    torch.testing.assert_close(g_exp, mine[3].exp())


def _recurrent_case(cu: list[int], indices: torch.Tensor, seed: int):
    q, k, v, a, b, A_log, dt_bias = _inputs(cu[-1], seed)
    state = torch.randn(6, HV, V, K, generator=torch.Generator().manual_seed(seed + 1))
    return q, k, v, a, b, A_log, dt_bias, state, torch.tensor(cu, dtype=torch.int32)


@pytest.mark.parametrize("case", ["decode", "multi-token"])
def test_sigmoid_gating_update_matches_vllms_kernel(case):
    """Decode (one token per sequence, a padded sequence on the null block 0 skipped) and
    several tokens per sequence with a state slot per token (2-D indices: each token's
    state stored at its own slot, one slot 0 not written)."""
    import importlib

    if case == "decode":
        cu, indices = [0, 1, 2, 3], torch.tensor([2, 0, 5], dtype=torch.int32)
    else:
        cu, indices = [0, 3, 5], torch.tensor([[1, 4, 3], [5, 0, 0]], dtype=torch.int32)
    q, k, v, a, b, A_log, dt_bias, state, cu_t = _recurrent_case(cu, indices, seed=3)
    mine_state = state.clone()
    mine, _ = gdn_fla.fused_sigmoid_gating_delta_rule_update(
        A_log, a, b, dt_bias, q, k, v, initial_state=mine_state, cu_seqlens=cu_t, ssm_state_indices=indices,
        use_qk_l2norm_in_kernel=True)
    theirs_state = state.clone()
    with _interpreted("fused_sigmoid_gating", heuristics=("fused_sigmoid_gating",
                                                             "fused_sigmoid_gating_delta_rule_update_kernel")):
        theirs, _ = importlib.import_module(f"{FLA}.fused_sigmoid_gating").fused_sigmoid_gating_delta_rule_update(
            A_log, a, b, dt_bias, q, k, v, initial_state=theirs_state, cu_seqlens=cu_t, ssm_state_indices=indices,
            use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(mine_state, theirs_state, rtol=1e-4, atol=1e-4)
    live = [t for n in range(len(cu) - 1) for t in range(cu[n], cu[n + 1])
            if indices.reshape(-1)[n * indices.stride(0)] > 0]
    torch.testing.assert_close(mine[0, live], theirs[0, live], rtol=1e-4, atol=1e-4)
    assert not torch.equal(mine_state, state)  # the states did move
    if case == "decode":
        assert torch.equal(mine_state[[0, 1, 3, 4]], state[[0, 1, 3, 4]])  # slots no sequence owns are untouched
        assert torch.equal(mine[0, 1], torch.zeros(HV, V))  # the skipped sequence's rows: not computed


def test_recurrent_rule_with_given_gates_is_the_sigmoid_gated_kernel_with_its_gates():
    """``fused_recurrent_gated_delta_rule`` is the same rule with g and beta given
    (fused_recurrent.py; its kernel's ``exp`` comes from FLA's ``op`` module, bound at
    import to vLLM's Triton placeholder, so the interpreter cannot run it): against
    the interpreted sigmoid-gated kernel, fed the gates' inputs."""
    import importlib

    q, k, v, a, b, A_log, dt_bias, state, cu_t = _recurrent_case([0, 2, 3], torch.tensor([1, 3]), seed=5)
    g, beta = gdn_fla.gating(A_log, a, dt_bias, b)
    indices = torch.tensor([[1, 2], [3, 0]], dtype=torch.int32)  # a slot per token of a sequence
    mine_state, theirs_state = state.clone(), state.clone()
    mine, _ = gdn_fla.fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=mine_state, cu_seqlens=cu_t,
                                                       ssm_state_indices=indices, use_qk_l2norm_in_kernel=True)
    with _interpreted("fused_sigmoid_gating", heuristics=("fused_sigmoid_gating",
                                                         "fused_sigmoid_gating_delta_rule_update_kernel")):
        theirs, _ = importlib.import_module(f"{FLA}.fused_sigmoid_gating").fused_sigmoid_gating_delta_rule_update(
            A_log, a, b, dt_bias, q, k, v, initial_state=theirs_state, cu_seqlens=cu_t, ssm_state_indices=indices,
            use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(mine_state, theirs_state, rtol=1e-4, atol=1e-4)


def test_chunk_rule_is_vllms_recurrence_over_each_sequence():
    """``chunk_gated_delta_rule`` computes the recurrence chunk-wise (chunk.py: its
    WY-representation kernels, whose autotuned launches the interpreter does not take
    here); what it computes is the rule of the recurrent kernels. Two sequences, one
    longer than a 64-token chunk, from given initial states, against vLLM's sigmoid-gated
    recurrent kernel interpreted (each sequence's tokens storing to one state slot, so
    the slot ends with the final state)."""
    import importlib

    cu = [0, 66, 69]
    q, k, v, a, b, A_log, dt_bias = _inputs(cu[-1], seed=7)
    g, beta = gdn_fla.gating(A_log, a, dt_bias, b)
    h0 = torch.randn(2, HV, V, K, generator=torch.Generator().manual_seed(8)) * 0.1
    cu_t = torch.tensor(cu, dtype=torch.int32)
    mine, final = gdn_fla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                                 cu_seqlens=cu_t, use_qk_l2norm_in_kernel=True)
    assert final.dtype == torch.float32 and mine.dtype == q.dtype and mine.shape == v.shape
    state = torch.zeros(3, HV, V, K)
    state[1:] = h0
    indices = torch.zeros(2, 66, dtype=torch.int32)
    indices[0], indices[1, :3] = 1, 2
    with _interpreted("fused_sigmoid_gating", heuristics=("fused_sigmoid_gating",
                                                         "fused_sigmoid_gating_delta_rule_update_kernel")):
        theirs, _ = importlib.import_module(f"{FLA}.fused_sigmoid_gating").fused_sigmoid_gating_delta_rule_update(
            A_log, a, b, dt_bias, q, k, v, initial_state=state, cu_seqlens=cu_t, ssm_state_indices=indices,
            use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(final, state[1:], rtol=1e-4, atol=1e-4)
    # equal-length sequences without cu_seqlens: the batch flattened
    two, two_final = gdn_fla.chunk_gated_delta_rule(q[:, :66].reshape(2, 33, H, K), k[:, :66].reshape(2, 33, H, K),
                                                    v[:, :66].reshape(2, 33, HV, V), g[:, :66].reshape(2, 33, HV),
                                                    beta[:, :66].reshape(2, 33, HV), initial_state=h0,
                                                    output_final_state=True, use_qk_l2norm_in_kernel=True)
    split, _ = gdn_fla.chunk_gated_delta_rule(q[:, :66], k[:, :66], v[:, :66], g[:, :66], beta[:, :66],
                                              initial_state=h0, output_final_state=True,
                                              cu_seqlens=torch.tensor([0, 33, 66]), use_qk_l2norm_in_kernel=True)
    assert two.shape == (2, 33, HV, V) and torch.equal(two.reshape(1, 66, HV, V), split)


def test_l2norm_matches_vllms_kernel():
    import importlib

    x = torch.randn(7, 3, K, generator=torch.Generator().manual_seed(9))
    with _interpreted("l2norm"):
        theirs = importlib.import_module(f"{FLA}.l2norm").l2norm_fwd(x)
    torch.testing.assert_close(gdn_fla.l2norm_fwd(x), theirs, rtol=1e-6, atol=1e-6)


def test_what_the_references_do_not_implement_is_refused_in_one_line():
    q, k, v, a, b, A_log, dt_bias, state, cu_t = _recurrent_case([0, 1], torch.tensor([1]), seed=0)
    with pytest.raises(CapturelintError, match="num_accepted_tokens"):
        gdn_fla.fused_sigmoid_gating_delta_rule_update(A_log, a, b, dt_bias, q, k, v, initial_state=state,
                                                       cu_seqlens=cu_t, ssm_state_indices=torch.tensor([1]),
                                                       num_accepted_tokens=torch.tensor([1]))
    with pytest.raises(CapturelintError, match="is_kda"):
        gdn_fla.fused_sigmoid_gating_delta_rule_update(A_log, a, b, dt_bias, q, k, v, initial_state=state,
                                                       cu_seqlens=cu_t, ssm_state_indices=torch.tensor([1]),
                                                       is_kda=True)
    with pytest.raises(CapturelintError, match="2 initial states for 1 sequences"):
        gdn_fla.chunk_gated_delta_rule(q, k, v, a, b, initial_state=torch.zeros(2, HV, V, K), cu_seqlens=cu_t)


def test_packed_decode_is_the_sigmoid_gated_update_on_packed_rows():
    """``fused_recurrent_gated_delta_rule_packed_decode`` (the decode path vLLM takes by
    default, ``VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE``): one token per sequence, q, k
    and v packed in one row; against the interpreted sigmoid-gated kernel on the same
    rows (its own kernel reads ``exp`` from FLA's ``op``, which the interpreter cannot
    run as vLLM binds it). A sequence on the null block gets zero rows, its state none."""
    import importlib

    q, k, v, a, b, A_log, dt_bias, state, cu_t = _recurrent_case([0, 1, 2, 3], torch.tensor([1]), seed=11)
    indices = torch.tensor([4, 0, 2], dtype=torch.int32)
    packed = torch.cat([q[0].reshape(3, -1), k[0].reshape(3, -1), v[0].reshape(3, -1)], dim=-1)
    out = torch.full((3, 1, HV, V), 7.0)
    mine_state, theirs_state = state.clone(), state.clone()
    gdn_fla.fused_recurrent_gated_delta_rule_packed_decode(packed, a[0], b[0], A_log, dt_bias, K ** -0.5, mine_state,
                                                           out, indices, use_qk_l2norm_in_kernel=True)
    with _interpreted("fused_sigmoid_gating", heuristics=("fused_sigmoid_gating",
                                                         "fused_sigmoid_gating_delta_rule_update_kernel")):
        theirs, _ = importlib.import_module(f"{FLA}.fused_sigmoid_gating").fused_sigmoid_gating_delta_rule_update(
            A_log, a, b, dt_bias, q, k, v, initial_state=theirs_state, cu_seqlens=cu_t, ssm_state_indices=indices,
            use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(out[[0, 2], 0], theirs[0, [0, 2]], rtol=1e-4, atol=1e-4)
    assert torch.equal(out[1], torch.zeros(1, HV, V))
    torch.testing.assert_close(mine_state, theirs_state, rtol=1e-4, atol=1e-4)
    with pytest.raises(CapturelintError, match="do not fit states"):
        gdn_fla.fused_recurrent_gated_delta_rule_packed_decode(packed, a[0], b[0], A_log, dt_bias, 1.0, mine_state,
                                                               torch.zeros(3, HV, V), indices)


def test_the_moe_reference_is_the_routed_experts_sum():
    """``kernels.moe``: each token's top-k experts, SiLU-and-mul, weighted; written
    per token and expert in float64 here. An expert no token picked contributes
    nothing; a routing weight of zero neither."""
    from capturelint.adapters.vllm.kernels import moe

    gen = torch.Generator().manual_seed(12)
    T, D, E, I = 5, 8, 4, 6
    hidden = torch.randn(T, D, generator=gen)
    w13, w2 = torch.randn(E, 2 * I, D, generator=gen), torch.randn(E, D, I, generator=gen)
    ids = torch.tensor([[0, 1], [1, 2], [2, 0], [1, 0], [0, 2]])  # expert 3 unused
    weights = torch.rand(T, 2, generator=gen)
    weights[4, 1] = 0.0
    out = moe.ReferenceMoEKernel().apply(hidden, w13, w2, weights, ids)
    want = torch.zeros(T, D, dtype=torch.float64)
    for t in range(T):
        for j in range(2):
            e = int(ids[t, j])
            gate_up = w13[e].double() @ hidden[t].double()
            want[t] += weights[t, j].double() * (w2[e].double() @ (torch.nn.functional.silu(gate_up[:I]) * gate_up[I:]))
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(CapturelintError, match="an expert map"):
        moe.ReferenceMoEKernel().apply(hidden, w13, w2, weights, ids, expert_map=torch.arange(E))


def test_a_gated_delta_net_hybrid_checks_clean_in_process():
    """The family's small configuration in the default suite: vLLM's own Qwen3-Next, a
    linear-attention layer and a full-attention layer, on vLLM's own V2 runner,
    PIECEWISE, three steps (prefill, mixed, padded), with vLLM's hybrid KV cache plan
    (the GDN layer's conv and recurrent states beside the attention's paged KV)."""
    from capturelint import api

    report = api.check(engine="vllm", model="Qwen3NextForCausalLM", runner="v2", mode="PIECEWISE", layers=2, steps=3,
                       jobs=1)
    assert report.findings == []
    (cfg,) = report.configs
    assert (cfg.runner, cfg.mode) == ("v2", "PIECEWISE")
    assert cfg.numerical.token_agreement == 1.0 and cfg.numerical.max_logit_error == 0.0
    assert cfg.numerical.max_step_error == 0.0
    assert cfg.checked.shadowed_steps == 3 and cfg.checked.eager_twin
    selected = report.invariant_selection()
    assert set(selected) == {"attention-eager", "gdn-core-eager"}
    assert selected["attention-eager"] > 0 and selected["gdn-core-eager"] > 0  # each kind of layer's break


def test_the_hybrid_kv_cache_plan_is_vllms_with_a_state_group_beside_the_attention():
    """The runner's KV cache configuration (vLLM's planner, ``runners.real``): one group
    of the full-attention layer's paged KV, one of the GDN layer's Mamba states (conv
    and recurrent, one block per request), the pages unified."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    from capturelint.adapters.vllm import gdn
    from capturelint.adapters.vllm.install import cpu_shim
    from capturelint.adapters.vllm.runners.real import runner_context
    from capturelint.adapters.vllm.workload import RunSpec
    from capturelint.options import CUDAGraphMode, Runner

    with cpu_shim(), gdn.backend(), runner_context(Runner.V2):
        loop = gdn.loop_for("Qwen3NextForCausalLM")(RunSpec(runner=Runner.V2, mode=CUDAGraphMode.PIECEWISE, layers=2,
                                                             steps=2))
        groups = {type(g.kv_cache_spec): g for g in loop.runner.kv_cache_config.kv_cache_groups}
        assert set(groups) == {FullAttentionSpec, MambaSpec}
        assert groups[FullAttentionSpec].layer_names == ["model.layers.1.self_attn.attn"]
        assert groups[MambaSpec].layer_names == ["model.layers.0.linear_attn"]
        pages = {spec: group.kv_cache_spec.page_size_bytes for spec, group in groups.items()}
        assert pages[MambaSpec] == pages[FullAttentionSpec]
        names = dict(loop.roots()["caches"])
        conv, ssm = names["conv_state.model.layers.0.linear_attn"], names["ssm_state.model.layers.0.linear_attn"]
        assert ssm.shape[1:] == (4, 32, 32)  # value heads, value dim, key dim
        assert conv.shape[1:] == (2 * 2 * 32 + 4 * 32, 3) or conv.shape[1:] == (3, 2 * 2 * 32 + 4 * 32)


def _cli(*args: str):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    return subprocess.run([sys.executable, "-m", "capturelint", *args], cwd=root, capture_output=True, text=True,
                          timeout=900)


@pytest.mark.slow
def test_a_gated_delta_net_hybrid_checks_clean_on_vllms_own_runners(tmp_path):
    """Both runners, PIECEWISE and FULL (which vLLM resolves to FULL_DECODE_ONLY for the
    GDN backend, ``UNIFORM_BATCH``: the decode steps replay), five steps."""
    import json

    out = tmp_path / "report.json"
    done = _cli("check", "--engine", "vllm", "--model", "Qwen3NextForCausalLM", "--steps", "5", "--jobs", "1",
                "--format", "json", "-o", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert finding_entries(report) == []
    numbers = {(n["runner"], n["mode"]): n for n in report["numerical"]}
    assert set(numbers) == {(r, m) for r in ("v1", "v2") for m in ("PIECEWISE", "FULL")}
    for n in numbers.values():  # compared, and equal
        assert n["token_agreement"] == 1.0 and n["max_logit_error"] == 0.0 and n["replay_steps"] >= 2, n
    assert {i["id"]: i["selected_ops"] > 0 for i in report["invariants"]} == {"attention-eager": True,
                                                                              "gdn-core-eager": True}




@pytest.mark.slow
def test_a_gate_zeroed_in_dummy_runs_is_flagged_where_the_untraced_run_differs(tmp_path):
    """The planted hazard (``data/gdn_dummy_run_drops_gate.patch``, in a scratch copy of
    vLLM): the GDN layer's output gate, captured code, zeroed without attention metadata.
    V1 captures PIECEWISE graphs in a dummy run without metadata, so the zeroing is
    baked; V2 builds metadata for its captures, and FULL captures have it under both."""
    import json
    from pathlib import Path

    from scratch_vllm import check_and_untraced, planted, run_driver  # tests/vllm/scratch_vllm.py

    target = "model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py"
    patch = (Path(__file__).resolve().parent / "data" / "gdn_dummy_run_drops_gate.patch").read_text()
    copy, lines = planted(tmp_path, target, patch)
    branch = lines.index("        if get_forward_context().attn_metadata is None:") + 1

    report_path = tmp_path / "report.json"
    done = run_driver(copy, tmp_path, check_and_untraced("Qwen3NextForCausalLM", layers=2, steps=5), str(report_path), timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == 1, done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    flagged = {f"{f['runner']}/{f['mode']}" for f in finding_entries(report)}
    diverged = {config for config, (agreement, error) in result["untraced"].items() if error > 1e-3}
    assert flagged == diverged == {"v1/PIECEWISE"}, (finding_entries(report), result["untraced"])
    frames = [f["capture_frame"] for f in finding_entries(report) if f.get("capture_frame")]
    assert frames, finding_entries(report)
    assert all(f["file"].endswith("vllm/" + target) and f["function"] == "forward_cuda" for f in frames), frames
    assert any(f["line"] >= branch for f in frames), (frames, branch)
