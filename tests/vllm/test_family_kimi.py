"""The Kimi linear + MLA family (``KimiLinearForCausalLM``, ``adapters/vllm/kimi.py``):
vLLM's own model on vLLM's own runners checks clean (in process: V2 PIECEWISE; slow: the
CLI, both runners, both modes); a planted region hazard is flagged exactly where the
untraced graph run differs from its eager twin (slow); the KDA kernel references
(``kernels/kda.py``) against vLLM's own KDA kernels run in Triton's interpreter
(``tests/vllm/kda_interpreted.py``: live in a slow test, stored outputs in the fast
ones) and the Kimi MLA epilogues (``kernels/kimi_mla.py``) against their documented
semantics."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from capturelint.report import finding_entries
import torch

from vllm_required import require_vllm  # tests/vllm/vllm_required.py

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STORED = HERE / "data" / "kda_interpreted.pt"
H, K = 2, 16
BOUNDS = [(None, "softplus"), (-2.0, "bounded")]


def _close(ours: torch.Tensor, theirs: torch.Tensor, tol: float = 1e-5) -> None:
    assert ours.shape == theirs.shape
    assert torch.allclose(ours.float(), theirs.float(), atol=tol, rtol=tol), (ours - theirs).abs().max()


def _check_against(saved: dict) -> None:
    """Every output of vLLM's kernels in ``saved`` equals the reference's on the same inputs."""
    from capturelint.adapters.vllm.kernels import kda

    x, theirs = saved["inputs"], saved["vllm"]
    cu = x["cu_seqlens"]
    for bound, tag in BOUNDS:
        gate = kda.reference_kda_gate(x["raw_g"][0], x["A_log"], x["dt_bias"], bound)
        # the chunk kernel's gate: chunk-local cumsum (one chunk per sequence here) in log2 units
        cumsum = torch.cat([gate[int(a):int(b)].cumsum(0) for a, b in zip(cu[:-1], cu[1:])]) / math.log(2)
        _close(cumsum, theirs[f"gate_cumsum_{tag}"][0], 1e-5)
        _close(torch.sigmoid(x["raw_beta"]), theirs["beta"])
        initial = torch.zeros(2, H, K, K)
        initial[1] = x["state"][2]
        out, final = kda.reference_chunk_kda(x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"],
                                             x["dt_bias"], bound, initial, cu, K ** -0.5, True)
        _close(out, theirs[f"prefill_out_{tag}"])
        _close(final, theirs[f"prefill_state_{tag}"])
        state, out = x["state"].clone(), torch.full((1, 3, H, K), 7.0)
        kda.reference_packed_decode(x["mixed_qkv"], x["decode_g"], x["decode_beta"], x["A_log"], x["dt_bias"],
                                    bound, state, x["decode_slots"], K ** -0.5, out)
        _close(out, theirs[f"decode_out_{tag}"])
        _close(state, theirs[f"decode_state_{tag}"])


def test_kda_references_match_vllms_kernels_stored_interpreter_outputs():
    _check_against(torch.load(STORED))


def test_the_comparison_tells_a_wrong_gate_apart():
    """Negative: the same decode without dt_bias (a gate the kernel does not compute) is
    far from vLLM's output, so the agreement above is not vacuous."""
    from capturelint.adapters.vllm.kernels import kda

    saved = torch.load(STORED)
    x, theirs = saved["inputs"], saved["vllm"]
    state, out = x["state"].clone(), torch.zeros(1, 3, H, K)
    kda.reference_packed_decode(x["mixed_qkv"], x["decode_g"], x["decode_beta"], x["A_log"], None, None, state,
                                x["decode_slots"], K ** -0.5, out)
    assert (out - theirs["decode_out_softplus"]).abs().max() > 1e-2


def test_decode_padding_rows_write_zeros_and_leave_every_state_alone():
    """Edge: state index 0 (vLLM's null block) or below: zeros out, no state moves; the
    live row's state does."""
    from capturelint.adapters.vllm.kernels import kda

    x = torch.load(STORED)["inputs"]
    state = x["state"].clone()
    slots = torch.tensor([0, -1, 3], dtype=torch.int32)
    out = torch.full((1, 3, H, K), 7.0)
    kda.reference_packed_decode(x["mixed_qkv"], x["decode_g"], x["decode_beta"], x["A_log"], x["dt_bias"], None,
                                state, slots, K ** -0.5, out)
    assert torch.equal(out[0, :2], torch.zeros(2, H, K))
    assert torch.equal(state[[0, 1, 2, 4]], x["state"][[0, 1, 2, 4]])
    assert not torch.equal(state[3], x["state"][3]) and out[0, 2].abs().max() > 0


def test_prefill_rows_past_the_last_sequence_are_zero_and_change_no_state():
    from capturelint.adapters.vllm.kernels import kda

    x = torch.load(STORED)["inputs"]
    short = torch.tensor([0, 5, 6], dtype=torch.int32)  # tokens 6 and 7: padding
    out, final = kda.reference_chunk_kda(x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"],
                                         x["dt_bias"], None, None, short, K ** -0.5, True)
    one, _ = kda.reference_chunk_kda(x["q"][:, :6], x["k"][:, :6], x["v"][:, :6], x["raw_g"][:, :6],
                                     x["raw_beta"][:, :6], x["A_log"], x["dt_bias"], None, None, short, K ** -0.5, True)
    assert torch.equal(out[0, 6:], torch.zeros(2, H, K))
    _close(out[0, :6], one[0])


def test_gather_initial_states_reads_the_row_or_zeros():
    """Against the kernel's source (its launcher asserts a CUDA tensor): row i is
    state[indices[i]] where has_initial_state[i], else zeros (the index is not read)."""
    from capturelint.adapters.vllm.kernels import kda

    state = torch.arange(5 * 6, dtype=torch.float32).reshape(5, 2, 3)
    got = kda.gather_initial_states(state, torch.tensor([3, -1, 1], dtype=torch.int32),
                                    torch.tensor([True, False, True]))
    assert torch.equal(got, torch.stack([state[3], torch.zeros(2, 3), state[1]]))


def test_the_wrappers_keep_vllms_signatures_and_out_arguments():
    from capturelint.adapters.vllm.kernels import kda
    from capturelint.errors import CapturelintError

    x = torch.load(STORED)["inputs"]
    given = torch.empty(1, 8, H, K)
    o, final = kda.chunk_kda_with_fused_gate(q=x["q"], k=x["k"], v=x["v"], raw_g=x["raw_g"], raw_beta=x["raw_beta"],
                                             A_log=x["A_log"], g_bias=x["dt_bias"], initial_state=None,
                                             output_final_state=False, use_qk_l2norm_in_kernel=True,
                                             cu_seqlens=x["cu_seqlens"], out=given)
    assert o is given and final is None
    expected, _ = kda.reference_chunk_kda(x["q"], x["k"], x["v"], x["raw_g"], x["raw_beta"], x["A_log"], x["dt_bias"],
                                          None, None, x["cu_seqlens"], K ** -0.5, True)
    _close(given, expected, 0)
    state = x["state"].clone()
    out, same = kda.fused_recurrent_kda_packed_decode(x["mixed_qkv"], x["decode_g"], x["decode_beta"], x["A_log"],
                                                      x["dt_bias"], None, state, x["decode_slots"])
    assert same is state and out.shape == (1, 3, H, K)
    with pytest.raises(CapturelintError, match="speculative decoding"):
        kda.fused_recurrent_kda()


@pytest.mark.slow
def test_kda_references_match_vllms_kernels_run_now_in_the_interpreter(tmp_path):
    require_vllm()
    out = tmp_path / "kda.pt"
    done = subprocess.run([sys.executable, str(HERE / "kda_interpreted.py"), str(out)], capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    _check_against(torch.load(out))


def test_kimi_mla_epilogues_concat_and_write_the_latent_at_each_slot():
    """Against the wrappers' documented semantics (the CUDA source is not shipped):
    k_out = [k_nope | k_pe per head], mqa_q = [ql_nope | q_pe], the latent row
    [kv_c_normed | k_pe] at slot_mapping (slot < 0 written nowhere)."""
    from capturelint.adapters.vllm.kernels import kimi_mla
    from capturelint.errors import CapturelintError

    gen = torch.Generator().manual_seed(3)
    tokens, heads, nope, rope, latent, block = 3, 2, 4, 2, 5, 4
    k_nope = torch.randn(tokens, heads, nope, generator=gen)
    k_pe = torch.randn(tokens, 1, rope, generator=gen)
    kv_c = torch.randn(tokens, latent, generator=gen)
    cache = torch.zeros(3, block, latent + rope)
    slots = torch.tensor([5, -1, 8])
    k_out = torch.empty(tokens, heads, nope + rope)
    q = torch.randn(tokens, heads, nope + rope, generator=gen)
    before = q.clone()
    kimi_mla.reference_key_concat_insert(q, k_nope, k_pe, kv_c, k_out, cache, slots, block, None, None)
    assert torch.equal(k_out[..., :nope], k_nope) and torch.equal(k_out[:, 1, nope:], k_pe[:, 0])
    assert torch.equal(q, before)  # NoPE: the query is not rotated
    flat = cache.view(-1, latent + rope)
    assert torch.equal(flat[5], torch.cat([kv_c[0], k_pe[0, 0]])) and torch.equal(flat[8], torch.cat([kv_c[2], k_pe[2, 0]]))
    assert torch.count_nonzero(flat.abs().sum(-1)) == 2  # the padded row wrote nothing
    ql = torch.randn(tokens, heads, latent, generator=gen)
    q_pe = torch.randn(tokens, heads, rope, generator=gen)
    mqa = torch.empty(tokens, heads, latent + rope)
    kimi_mla.reference_decode_q_concat_insert(ql, q_pe, kv_c, k_pe, mqa, cache, torch.tensor([1, 2, -1]), block,
                                              None, None)
    assert torch.equal(mqa, torch.cat([ql, q_pe], -1)) and torch.equal(flat[2], torch.cat([kv_c[1], k_pe[1, 0]]))
    with pytest.raises(CapturelintError, match="NoPE"):
        kimi_mla.reference_decode_q_concat_insert(ql, q_pe, kv_c, k_pe, mqa, cache, slots, block, slots, q_pe)


def test_kimi_linear_checks_clean_in_process():
    """The family's small configuration in the default suite: vLLM's own Kimi-Linear (a
    KDA layer and an MLA layer) on vLLM's own V2 runner, PIECEWISE, three steps."""
    require_vllm()
    from capturelint import api

    report = api.check(engine="vllm", model="KimiLinearForCausalLM", runner="v2", mode="PIECEWISE", layers=2,
                       steps=3, jobs=1)
    assert report.findings == []
    (cfg,) = report.configs
    assert (cfg.runner, cfg.mode) == ("v2", "PIECEWISE")
    assert cfg.numerical.token_agreement == 1.0 and cfg.numerical.max_logit_error == 0.0
    assert cfg.checked.shadowed_steps == 3 and cfg.checked.eager_twin
    selected = report.invariant_selection()
    assert set(selected) == {"kda-eager", "kimi-mla-attention-eager"}
    assert all(count > 0 for count in selected.values()), selected  # both breaks' kernels, eager


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "capturelint", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=1800)


@pytest.mark.slow
def test_kimi_linear_checks_clean_on_both_runners_and_modes():
    require_vllm()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        done = _cli("check", "--engine", "vllm", "--model", "KimiLinearForCausalLM", "--steps", "4", "--jobs", "1",
                    "--format", "json", "-o", str(out))
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(out.read_text())
    assert finding_entries(report) == []
    numbers = {(n["runner"], n["mode"]): n for n in report["numerical"]}
    assert set(numbers) == {("v1", "PIECEWISE"), ("v1", "FULL"), ("v2", "PIECEWISE"), ("v2", "FULL")}
    for n in numbers.values():  # compared, and equal
        assert n["token_agreement"] == 1.0 and n["max_logit_error"] == 0.0 and n["replay_steps"] > 0, n
    assert {(i["id"], i["selected_ops"] > 0) for i in report["invariants"]} == {("kda-eager", True),
                                                                               ("kimi-mla-attention-eager", True)}




@pytest.mark.slow
def test_a_gate_zeroed_in_dummy_runs_is_flagged_where_the_untraced_run_differs(tmp_path):
    """The planted hazard (``data/kda_dummy_run_zero_gate.patch``, in a scratch copy of
    vLLM): V1 captures PIECEWISE graphs in a dummy run without metadata, so the zeroed
    gate is baked into its graphs; V2 builds metadata for its captures."""
    require_vllm()
    from scratch_vllm import check_and_untraced, planted, run_driver  # tests/vllm/scratch_vllm.py

    target = "model_executor/layers/mamba/gdn/kimi_gdn_linear_attn.py"
    copy, lines = planted(tmp_path, target, (HERE / "data" / "kda_dummy_run_zero_gate.patch").read_text())
    branch = lines.index("        if get_forward_context().attn_metadata is None:") + 1
    report_path = tmp_path / "report.json"
    done = run_driver(copy, tmp_path, check_and_untraced("KimiLinearForCausalLM", ("PIECEWISE",), layers=2, steps=4), str(report_path), timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == 1, done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    flagged = {f"{f['runner']}/{f['mode']}" for f in finding_entries(report)}
    diverged = {config for config, (agreement, error) in result["untraced"].items() if error > 1e-3}
    assert flagged == diverged == {"v1/PIECEWISE"}, (finding_entries(report), result["untraced"])
    frames = [f["capture_frame"] for f in finding_entries(report) if f["capture_frame"]]
    assert any(fr["file"].endswith("vllm/" + target) and fr["function"] == "forward" and fr["line"] >= branch
               for fr in frames), frames


MUTATION_DRIVER = """
import sys
from capturelint.cli import main
sys.exit(main(["check", "--engine", "vllm", "--model", "KimiLinearForCausalLM", "--runner", "v2", "--mode",
               "PIECEWISE", "--steps", "4", "--jobs", "1", "--format", "json", "-o", sys.argv[1]]))
"""


@pytest.mark.slow
def test_the_kda_break_removed_is_flagged_by_its_default_invariant(tmp_path):
    """Negative for ``kda-eager``: with the KDA layer's break removed
    (``data/kda_break_removed.patch``) its kernels are captured, and the invariant says
    so (CL201) at vLLM's calls in the layer's file; the MLA invariant stays quiet."""
    require_vllm()
    from scratch_vllm import planted, run_driver  # tests/vllm/scratch_vllm.py

    target = "model_executor/layers/mamba/gdn/kimi_gdn_linear_attn.py"
    copy, _ = planted(tmp_path, target, (HERE / "data" / "kda_break_removed.patch").read_text())
    report_path = tmp_path / "report.json"
    done = run_driver(copy, tmp_path, MUTATION_DRIVER, str(report_path), timeout=1800)
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    cl201 = [f for f in finding_entries(report) if f["code"] == "CL201"]
    assert cl201 and {f["invariant"] for f in cl201} == {"kda-eager"}, finding_entries(report)
    assert all(f["location"]["file"].endswith("vllm/" + target) for f in cl201), [f["location"] for f in cl201]
