"""The sparse MLA family (``adapters/vllm/sparse_mla.py``: vLLM's own DeepSeek V3.2 /
GLM-5.2 DSA model on vLLM's own runners) and its kernel references
(``kernels/sparse_mla_fused.py``).

The references are compared with vLLM's own Triton kernels run as they are in Triton's
interpreter (``kernels.interpreter``) on the same inputs, in fp32 where the interpreter
allows it (numpy has no bf16); the cache writes' skipped slots and the index remap's
compaction against their documented semantics. The family's fast clean check is one
layer on V2, PIECEWISE, three steps; V1 PIECEWISE is flagged (vLLM captures it without
metadata, vLLM's own hazard); the planted hazard (the sparse attention's eager break
removed) is flagged exactly where the untraced graph run differs from its eager twin,
checked with both runners and both modes (slow).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vllm_required import require_vllm  # tests/vllm/vllm_required.py

DATA = Path(__file__).resolve().parent / "data"

KERNELS = "vllm.models.deepseek_v32.common.kernels"
T, Q, KV, PE, IK, TOPK = 5, 64, 512, 64, 128, 128


def _cos_sin(positions: int = 64, rot: int = PE) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, rot, 2).float() / rot))
    freqs = torch.arange(positions).float()[:, None] * inv[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def _norm_rope_inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    positions = torch.tensor([0, 3, 17, 40, 9])
    slots = torch.tensor([5, -1, 70, 3, 130])  # -1: padding, written nowhere
    return dict(positions=positions, q_c=r(T, Q), q_w=1 + 0.1 * r(Q), kv_c=r(T, KV), kv_w=1 + 0.1 * r(KV),
                k_pe=r(T, PE), cos_sin=_cos_sin(), index_k=r(T, IK), ik_w=1 + 0.1 * r(IK), ik_b=0.1 * r(IK),
                slots=slots)


def _run_norm_rope(fn, x, interleave: bool):
    mla = torch.full((3, 64, KV + PE), 7.0)
    indexer = torch.zeros(3, 64, IK + 4, dtype=torch.uint8)
    topk = torch.zeros(8, TOPK, dtype=torch.int32)
    kv_out, pe_out = torch.empty(T, KV), torch.empty(T, PE)
    q = fn(x["positions"], x["q_c"], x["q_w"], 1e-6, x["kv_c"], x["kv_w"], 1e-6, x["k_pe"], x["cos_sin"],
           x["index_k"], x["ik_w"], x["ik_b"], 1e-6, x["cos_sin"], topk, slot_mapping=x["slots"],
           indexer_slot_mapping=x["slots"], indexer_k_cache=indexer, mla_kv_cache=mla, mla_kv_cache_dtype="auto",
           has_indexer=True, index_rope_interleave=interleave, kv_c_out=kv_out, k_pe_out=pe_out)
    return q, kv_out, pe_out, mla, indexer, topk


@pytest.mark.parametrize("interleave", [False, True], ids=["neox-deepseek", "interleaved-glm"])
def test_fused_norm_rope_reference_matches_vllms_triton_kernel(interleave):
    require_vllm()
    from capturelint.adapters.vllm.kernels import sparse_mla_fused
    from capturelint.adapters.vllm.kernels.interpreter import interpret_modules

    import importlib

    kernels = importlib.import_module(KERNELS)
    x = _norm_rope_inputs()
    with interpret_modules((KERNELS,)):
        theirs = _run_norm_rope(kernels.fused_norm_rope, x, interleave)
    ours = _run_norm_rope(sparse_mla_fused.fused_norm_rope, x, interleave)
    names = ("q_c_out", "kv_c_out", "k_pe_out", "mla cache", "indexer cache", "top-k buffer")
    for name, a, b in zip(names[:4], ours[:4], theirs[:4]):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), (name, (a - b).abs().max())
    # the indexer cache: the fp32 power-of-two scales byte for byte; the e4m3 values equal
    # but for a few (10 of 640 here) where the interpreter's numpy fp32 -> e4m3 cast lands a
    # power of two away from torch's round-to-nearest-even (the reference's), never more
    ours_flat, theirs_flat = ours[4].view(3, -1), theirs[4].view(3, -1)
    assert torch.equal(ours_flat[:, 64 * IK:], theirs_flat[:, 64 * IK:])
    values = [f[:, :64 * IK].contiguous().view(torch.float8_e4m3fn).float() for f in (ours_flat, theirs_flat)]
    differ = values[0] != values[1]
    assert differ.float().mean() < 0.01
    ratio = (values[0][differ] / values[1][differ]).abs()
    assert ((ratio == 2) | (ratio == 0.5)).all()
    assert torch.equal(ours[5], theirs[5])
    # the written rows: every slot >= 0, nothing at the padding's
    mla = ours[3].view(-1, KV + PE)
    written = (mla != 7.0).all(dim=-1).nonzero().flatten().tolist()
    assert written == [3, 5, 70, 130]
    assert (ours[5][:T] == -1).all() and (ours[5][T:] == 0).all()  # the first T rows of the top-k buffer cleared


def test_fused_q_reference_matches_vllms_triton_kernel():
    require_vllm()
    import importlib

    from capturelint.adapters.vllm.kernels import sparse_mla_fused
    from capturelint.adapters.vllm.kernels.interpreter import interpret_modules

    kernels = importlib.import_module(KERNELS)
    gen = torch.Generator().manual_seed(2)
    positions = torch.tensor([0, 3, 17, 40])
    q_pe, ql_nope = torch.randn(4, 4, PE, generator=gen), torch.randn(4, 4, KV, generator=gen)
    index_q, weights = torch.randn(4, 4, IK, generator=gen), torch.randn(4, 4, generator=gen)
    args = (positions, q_pe, _cos_sin(), index_q, _cos_sin(), ql_nope, torch.ones(1), weights, IK ** -0.5, 0.5)
    with interpret_modules((KERNELS,)):
        theirs = kernels.fused_q(*args, has_indexer=True, index_rope_interleave=False, quantize_mqa=False)
    ours = sparse_mla_fused.fused_q(*args, has_indexer=True, index_rope_interleave=False, quantize_mqa=False)
    assert torch.allclose(ours[2], theirs[2], atol=1e-5)  # the roped q_pe
    values = ours[0].float(), theirs[0].float()  # the fp8 index q: as for the indexer cache above
    differ = values[0] != values[1]
    assert differ.float().mean() < 0.05
    assert (((values[0][differ] / values[1][differ]).abs() - 1.25).abs() == 0.75).all()  # a factor of 2 apart
    assert torch.allclose(ours[1], theirs[1], rtol=1e-6)  # the weights with the q scales folded in
    with pytest.raises(NotImplementedError, match="bf16 MQA query"):
        sparse_mla_fused.fused_q(*args, quantize_mqa=True)


def test_fused_embed_norm_reference_matches_vllms_triton_kernel():
    require_vllm()
    from vllm.model_executor.layers import fused_embed_norm as embed

    from capturelint.adapters.vllm.kernels import sparse_mla_fused
    from capturelint.adapters.vllm.kernels.interpreter import interpret_modules

    gen = torch.Generator().manual_seed(3)
    table, w = torch.randn(96, 128, generator=gen), 1 + 0.1 * torch.randn(128, generator=gen)
    ids = torch.tensor([4, 0, 95, 4])
    with interpret_modules(("vllm.model_executor.layers.fused_embed_norm",)):
        theirs = embed.fused_embed_norm(ids, table, w, 1e-6)
    ours = sparse_mla_fused.fused_embed_norm(ids, table, w, 1e-6)
    assert torch.equal(ours[0], theirs[0]) and torch.allclose(ours[1], theirs[1], atol=1e-5)
    assert torch.equal(sparse_mla_fused.fused_embed_norm(ids, table), table[ids])


def test_index_remap_reference_converts_compacts_and_counts():
    """The remap kernel's documented semantics (sparse_utils.py): slot = block_table[req,
    i // bs] * stride + i % bs; -1 for -1 and for a block past the table; with counts,
    the valid ones first; a prefill token's index goes to its workspace row."""
    from capturelint.adapters.vllm.kernels.sparse_mla_fused import req_index_to_global

    req = torch.tensor([0, 1, 1], dtype=torch.int32)
    table = torch.tensor([[3, 5], [7, 2]], dtype=torch.int32)
    idx = torch.tensor([[0, 65, -1, 200], [-1, 1, 64, 3], [2, -1, -1, -1]], dtype=torch.int32)
    out, counts = torch.empty_like(idx), torch.empty(3, dtype=torch.int32)
    req_index_to_global(req, table, idx, out, counts, None, None, None, 64, 64, True)
    assert out.tolist() == [[192, 321, -1, -1], [449, 128, 451, -1], [450, -1, -1, -1]]
    assert counts.tolist() == [2, 3, 1]
    req_index_to_global(req, table, idx, out, None, None, None, None, 64, 64, False)
    assert out.tolist() == [[192, 321, -1, -1], [-1, 449, 128, 451], [450, -1, -1, -1]]
    prefill = torch.tensor([-1, 0, -1], dtype=torch.int32)  # token 1 is a prefill's, its workspace at 10
    req_index_to_global(req, table, idx, out, None, prefill, torch.tensor([10], dtype=torch.int32), None, 64, 64,
                        False)
    assert out[1].tolist() == [-1, 11, 74, 13]


def test_a_sparse_mla_model_checks_clean_in_process():
    """The family's small configuration in the default suite: one layer of vLLM's own
    DeepSeek V3.2 (MLA with the indexer, FlashMLA sparse) on vLLM's own V2 runner,
    PIECEWISE, three steps (prefill, mixed, padded decode): safe, graph run = eager."""
    require_vllm()
    from capturelint import api

    report = api.check(engine="vllm", model="DeepseekV32ForCausalLM", runner="v2", mode="PIECEWISE", layers=1,
                       steps=3, jobs=1)
    assert report.findings == []
    (cfg,) = report.configs
    assert (cfg.runner, cfg.mode) == ("v2", "PIECEWISE")
    assert cfg.numerical.token_agreement == 1.0 and cfg.numerical.max_logit_error == 0.0
    assert cfg.checked.shadowed_steps == 3 and cfg.checked.eager_twin
    selection = report.invariant_selection()
    assert list(selection) == ["sparse-mla-indexer-attention-eager"]
    assert selection["sparse-mla-indexer-attention-eager"] > 0  # the indexer and the sparse attention, in the break


@pytest.mark.slow
def test_v1_piecewise_is_flagged_where_vllm_captures_without_metadata():
    """Under V1, vLLM captures PIECEWISE graphs without attention metadata
    (gpu_model_runner.py:5637), so DeepSeek V3.2's fused_norm_rope is captured without
    its MLA and indexer cache writes, which every replay then skips: flagged (CL101 at
    vLLM's line), and the untraced graph run differs from eager."""
    require_vllm()
    from capturelint import api

    report = api.check(engine="vllm", model="DeepseekV32ForCausalLM", runner="v1", mode="PIECEWISE", layers=1,
                       steps=3, jobs=1)
    assert {f.code for f in report.findings} >= {"CL101"}
    first = next(f for f in report.findings if f.code == "CL101")
    assert first.capture_frame.file == "vllm/models/deepseek_v32/attention.py"
    assert "mla_cache_insert" in first.message
    (cfg,) = report.configs
    assert cfg.numerical.token_agreement < 1.0




@pytest.mark.slow
def test_the_sparse_attention_break_removed_is_flagged_where_the_untraced_run_differs(tmp_path):
    """The planted region hazard (``data/sparse_mla_break_removed.patch``, in a scratch copy
    of vLLM): without the eager break, the indexer's top-k and the sparse attention are
    captured in PIECEWISE graphs. Flagged exactly in the configurations whose untraced
    graph run differs from its eager twin (both runners' PIECEWISE: V1's already differs,
    vLLM's own hazard above), with the family's invariant at vLLM's file."""
    require_vllm()
    from scratch_vllm import check_and_untraced, planted, run_driver  # tests/vllm/scratch_vllm.py

    from capturelint.report import finding_entries

    target = "models/deepseek_v32/attention.py"
    copy, lines = planted(tmp_path, target, (DATA / "sparse_mla_break_removed.patch").read_text())
    assert "    def _sparse_indexer_and_attn(" in lines and "    @eager_break_during_capture" not in lines
    report_path = tmp_path / "report.json"
    done = run_driver(copy, tmp_path, check_and_untraced("DeepseekV32ForCausalLM", layers=1), str(report_path), timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == 1, done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    findings = finding_entries(report)
    flagged = {f"{f['runner']}/{f['mode']}" for f in findings}
    diverged = {config for config, (agreement, error) in result["untraced"].items() if error > 1e-3}
    assert flagged == diverged == {"v1/PIECEWISE", "v2/PIECEWISE"}, (findings, result["untraced"])
    cl201 = [f for f in findings if f["code"] == "CL201" and f["runner"] == "v2"]
    assert cl201 and cl201[0]["invariant"] == "sparse-mla-indexer-attention-eager", findings
    assert all(f["capture_frame"]["file"].endswith("vllm/" + target) for f in cl201), cl201
