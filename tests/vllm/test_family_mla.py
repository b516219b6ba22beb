"""The MLA family (``capturelint/adapters/vllm/mla.py``): vLLM's own DeepSeek V2/V3 model
classes through vLLM's MLA attention on its Triton MLA backend, on vLLM's own runners.

Default suite: the kernel references (``kernels/mla_decode.py``: the decode attention
against vLLM's own ``decode_attention_fwd`` run in Triton's interpreter; the latent cache
write against its documented semantics) and one small in-process check (one layer, V2,
PIECEWISE, three steps). Slow (``-m slow``): both architectures on both runners and
modes through the CLI, and a planted hazard in a scratch copy of vLLM.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from capturelint.report import finding_entries
import torch

from vllm_required import require_vllm  # tests/vllm/vllm_required.py

DATA = Path(__file__).parent / "data"
LATENT, ROPE, HEADS, PAGE, PAGES = 64, 16, 4, 16, 10  # Lk = 80, Lv = 64 (the kernel's general MLA tiling)
DTYPE = torch.float32  # the interpreter computes bf16 tiles wrongly (numpy has no bf16); the reference is dtype-generic


def _decode_batch(seed: int = 0):
    """Four decode rows: a long one over three pages, a short one, one on a page of
    its own, and a padded row (sequence length 0)."""
    gen = torch.Generator().manual_seed(seed)
    cache = torch.randn(PAGES, PAGE, LATENT + ROPE, generator=gen).to(DTYPE)
    q = torch.randn(4, HEADS, LATENT + ROPE, generator=gen).to(DTYPE)
    table = torch.tensor([[1, 4, 7], [2, 0, 0], [9, 0, 0], [0, 0, 0]], dtype=torch.int32)
    seq_lens = torch.tensor([37, 3, 16, 0], dtype=torch.int32)
    return q, cache, table, seq_lens


def _vllm_decode(q, cache, table, seq_lens, splits, logit_cap):
    from capturelint.adapters.vllm.kernels.interpreter import interpret_modules

    require_vllm()
    from vllm.v1.attention.ops import triton_decode_attention as tda

    k = cache.unsqueeze(2)  # as TritonMLAImpl.forward_mqa passes it: one KV head, the latent first
    o, lse = torch.full((q.shape[0], HEADS, LATENT), 7.0), torch.full((q.shape[0], HEADS), 7.0)
    with interpret_modules(("vllm.v1.attention.ops.triton_decode_attention",)):
        tda.decode_attention_fwd(q, k, k[..., :LATENT], o, lse, table, seq_lens,
                                 torch.empty(q.shape[0], HEADS, splits, LATENT + 1), splits, 0.125, PAGE,
                                 logit_cap=logit_cap, is_mla=True)
    return o, lse


@pytest.mark.parametrize(("splits", "logit_cap"), [(1, 0.0), (4, 0.0), (2, 3.0)],
                         ids=["one-split", "four-splits", "logit-cap"])
def test_decode_reference_matches_vllms_triton_kernel(splits, logit_cap):
    from capturelint.adapters.vllm.kernels.mla_decode import reference_decode_attention

    q, cache, table, seq_lens = _decode_batch()
    theirs_o, theirs_lse = _vllm_decode(q, cache, table, seq_lens, splits, logit_cap)
    k = cache.unsqueeze(2)
    ours_o, ours_lse = torch.full_like(theirs_o, 7.0), torch.full_like(theirs_lse, 7.0)
    reference_decode_attention(q, k, k[..., :LATENT], ours_o, ours_lse, table, seq_lens, 0.125, PAGE, logit_cap)
    assert torch.allclose(ours_o[:3], theirs_o[:3], atol=1e-4, rtol=1e-4), (ours_o[:3] - theirs_o[:3]).abs().max()
    assert torch.allclose(ours_lse[:3], theirs_lse[:3], atol=1e-4, rtol=1e-4)
    # the padded row (no key): the kernel's 0 / 0, NaN output and -inf LSE, in both
    assert theirs_o[3].isnan().all() and ours_o[3].isnan().all()
    assert torch.equal(theirs_lse[3], ours_lse[3]) and bool((ours_lse[3] == float("-inf")).all())
    # the long row reads its third page: a different page there changes its result
    changed = cache.clone()
    changed[7] += 1.0
    k2 = changed.unsqueeze(2)
    moved = torch.empty_like(ours_o)
    reference_decode_attention(q, k2, k2[..., :LATENT], moved, torch.empty_like(ours_lse), table, seq_lens, 0.125,
                               PAGE, logit_cap)
    assert not torch.allclose(moved[0], ours_o[0]) and torch.equal(moved[1:3], ours_o[1:3])


def test_concat_and_cache_reference_writes_each_slot_and_skips_padding():
    """Against the CUDA op's documented semantics (``vllm._C`` is not in this wheel): token
    t's ``[kv_c | k_pe]`` lands at ``slot_mapping[t]``; slot -1 is written nowhere."""
    from capturelint.adapters.vllm.kernels.mla_decode import reference_concat_and_cache_mla

    gen = torch.Generator().manual_seed(1)
    kv_c = torch.randn(5, LATENT, generator=gen).to(torch.bfloat16)
    k_pe = torch.randn(5, 1, ROPE, generator=gen).to(torch.bfloat16).squeeze(1)
    slots = torch.tensor([17, 18, -1, 40, 3], dtype=torch.int64)
    cache = torch.zeros(PAGES, PAGE, LATENT + ROPE, dtype=torch.bfloat16)
    reference_concat_and_cache_mla(kv_c, k_pe, cache, slots, "auto", torch.tensor(1.0))
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(cache[slot // PAGE, slot % PAGE, :LATENT], kv_c[t])
            assert torch.equal(cache[slot // PAGE, slot % PAGE, LATENT:], k_pe[t])
    assert int((cache != 0).any(dim=2).sum()) == 4  # four slots, not the padded row's
    assert torch.equal(cache[0, 0], torch.zeros(LATENT + ROPE, dtype=torch.bfloat16))  # the null block's slot 0 kept


def test_the_references_refuse_a_quantised_cache_in_one_line():
    from capturelint.adapters.vllm.kernels.mla_decode import decode_attention_fwd, reference_concat_and_cache_mla
    from capturelint.errors import CapturelintError

    with pytest.raises(CapturelintError, match="kv_cache_dtype=fp8"):
        reference_concat_and_cache_mla(torch.zeros(1, LATENT), torch.zeros(1, ROPE),
                                       torch.zeros(2, PAGE, LATENT + ROPE, dtype=torch.uint8),
                                       torch.zeros(1, dtype=torch.int64), "fp8", torch.tensor(1.0))
    q, cache, table, seq_lens = _decode_batch()
    k = cache.to(torch.float8_e4m3fn).unsqueeze(2)
    with pytest.raises(CapturelintError, match="float8_e4m3fn cache"):
        decode_attention_fwd(q, k, k[..., :LATENT], torch.empty(4, HEADS, LATENT), torch.empty(4, HEADS), table,
                             seq_lens, torch.empty(4, HEADS, 1, LATENT + 1), 1, 0.125, PAGE, is_mla=True)


def test_the_cache_op_is_registered_under_vllms_name():
    """vLLM's ``ops.concat_and_cache_mla`` calls ``torch.ops._C_cache_ops.concat_and_cache_mla``:
    after ``register_cache_op`` that name runs the reference."""
    from capturelint.adapters.vllm.kernels.mla_decode import CACHE_OP, register_cache_op

    assert CACHE_OP in register_cache_op()
    cache = torch.zeros(2, PAGE, LATENT + ROPE)
    torch.ops._C_cache_ops.concat_and_cache_mla(torch.ones(1, LATENT), torch.full((1, ROPE), 2.0), cache,
                                                torch.tensor([PAGE + 1]), "auto", torch.tensor(1.0), False)
    assert torch.equal(cache[1, 1], torch.cat([torch.ones(LATENT), torch.full((ROPE,), 2.0)]))


def test_an_mla_model_checks_clean_in_process():
    """The family's small configuration in the default suite: one layer of vLLM's own
    DeepSeek V3 on vLLM's own V2 runner, PIECEWISE, three steps (prefill, mixed, padded
    decode): the decode attention and the prefill in the eager break, the latent write
    captured."""
    require_vllm()
    from capturelint import api

    report = api.check(engine="vllm", model="DeepseekV3ForCausalLM", runner="v2", mode="PIECEWISE", layers=1,
                       steps=3, jobs=1)
    assert report.findings == []
    (cfg,) = report.configs
    assert (cfg.runner, cfg.mode) == ("v2", "PIECEWISE")
    assert cfg.numerical.token_agreement == 1.0 and cfg.numerical.max_logit_error == 0.0
    assert cfg.checked.shadowed_steps == 3 and cfg.checked.eager_twin
    selection = report.invariant_selection()
    assert list(selection) == ["mla-attention-eager"] and selection["mla-attention-eager"] > 0


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "capturelint", *args], capture_output=True, text=True, timeout=1800)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"])
def test_an_mla_model_checks_clean_on_vllms_own_runners(tmp_path, arch):
    """Both runners, PIECEWISE and FULL (FULL: the Triton MLA backend's uniform-decode
    graphs, bare), the default workload: every replay equals its eager twin, and the one
    finding is vLLM's V1 PIECEWISE slot mapping (below)."""
    require_vllm()
    out = tmp_path / "report.json"
    done = _cli("check", "--engine", "vllm", "--model", arch, "--layers", "1", "--steps", "4", "--jobs", "1",
                "--format", "json", "-o", str(out))
    assert done.returncode == 1, done.stderr[-3000:]  # one finding, below
    report = json.loads(out.read_text())
    # V1 PIECEWISE: vLLM's MLA backends keep forward_includes_kv_cache_update=True, so V1
    # passes the captured latent write an unpadded slot mapping (gpu_model_runner.py:4036-4041,
    # which says it must be padded): the replay runs over the capture's extent, whose tail the
    # slot-mapping kernel fills with PAD_SLOT_ID (block_table.py:336-345), so the result agrees
    assert [(f["runner"], f["mode"], f["code"], f["capture_frame"]["function"]) for f in finding_entries(report)] == \
        [("v1", "PIECEWISE", "CL103", "concat_and_cache_mla")], finding_entries(report)
    assert finding_entries(report)[0]["tensor"].endswith(".slot_mapping")
    numerical = {(n["runner"], n["mode"]): n for n in report["numerical"]}
    assert set(numerical) == {(r, m) for r in ("v1", "v2") for m in ("PIECEWISE", "FULL")}
    for n in numerical.values():  # compared, and equal
        assert n["token_agreement"] == 1.0 and n["max_logit_error"] == 0.0
    for c in report["configurations"]:
        replays = numerical[(c["runner"], c["mode"])]["replay_steps"]
        if c["mode"] == "PIECEWISE":
            assert c["checked"]["shadowed_steps"] == replays == 4
        else:  # the backend's FULL graphs are uniform decode batches: the prefill and mixed steps run eager
            assert 0 < c["checked"]["bare_replays"] == replays < 4, c["checked"]
    assert [(i["id"], i["selected_ops"] > 0) for i in report["invariants"]] == [("mla-attention-eager", True)]




@pytest.mark.slow
def test_a_latent_write_skipped_in_dummy_runs_is_flagged_where_the_untraced_run_differs(tmp_path):
    """The planted hazard (``data/mla_dummy_run_skips_latent_write.patch``, in a scratch copy
    of vLLM): V1 captures PIECEWISE graphs in a dummy run without metadata, so the early
    return is baked and the latent cache never written; V2 builds metadata for its
    captures, and FULL captures force it."""
    require_vllm()
    from scratch_vllm import check_and_untraced, planted, run_driver  # tests/vllm/scratch_vllm.py

    target = "model_executor/layers/attention/mla_attention.py"
    copy, lines = planted(tmp_path, target, (DATA / "mla_dummy_run_skips_latent_write.patch").read_text())
    branch = lines.index("    if attn_metadata is None:") + 1

    report_path = tmp_path / "report.json"
    done = run_driver(copy, tmp_path, check_and_untraced("DeepseekV3ForCausalLM", layers=1, steps=4), str(report_path), timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == 1, done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    # the unpatched family's one finding (V1 PIECEWISE's unpadded slot mapping, CL103 at
    # _custom_ops.concat_and_cache_mla: test_an_mla_model_checks_clean_on_vllms_own_runners)
    # is not the plant's
    planted_findings = [f for f in finding_entries(report) if f["code"] != "CL103"]
    flagged = {f"{f['runner']}/{f['mode']}" for f in planted_findings}
    diverged = {config for config, (agreement, error) in result["untraced"].items() if error > 1e-3}
    assert flagged == diverged == {"v1/PIECEWISE"}, (finding_entries(report), result["untraced"])
    cl101 = [f for f in planted_findings if f["code"] == "CL101"]
    assert cl101, finding_entries(report)
    frame = cl101[0]["capture_frame"]
    assert frame["file"].endswith("vllm/" + target) and frame["function"] == "unified_mla_kv_cache_update", frame
    assert frame["line"] >= branch, (frame, branch)


BREAK_DRIVER = """
import json, sys
from capturelint.cli import main
status = main(["check", "--engine", "vllm", "--model", "DeepseekV2ForCausalLM", "--runner", "v2", "--mode",
               "PIECEWISE", "--layers", "1", "--steps", "4", "--jobs", "1", "--format", "json", "-o", sys.argv[1]])
json.dump({"status": status}, sys.stdout)
"""


@pytest.mark.slow
def test_the_mla_break_removed_breaks_the_family_invariant(tmp_path):
    """The default invariant's positive case (``data/mla_break_removed.patch``): without
    the eager break, V2's PIECEWISE graphs capture the latent attention, and
    ``mla-attention-eager`` (CL201) says so, at vLLM's MLA code; the clean check above is
    its negative case (ops selected, no finding)."""
    require_vllm()
    from scratch_vllm import planted, run_driver  # tests/vllm/scratch_vllm.py

    target = "model_executor/layers/attention/mla_attention.py"
    copy, _ = planted(tmp_path, target, (DATA / "mla_break_removed.patch").read_text())
    report_path = tmp_path / "report.json"
    done = run_driver(copy, tmp_path, BREAK_DRIVER, str(report_path), timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["status"] == 1, done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    cl201 = [f for f in finding_entries(report) if f["code"] == "CL201"]
    assert cl201 and {f["invariant"] for f in cl201} == {"mla-attention-eager"}, finding_entries(report)
    assert all(f["scope"].startswith("model.layers.0.self_attn.mla_attn.mla_attn") for f in cl201), cl201
    assert any(f["location"]["file"].endswith("vllm/" + target) for f in cl201), [f["location"] for f in cl201]
