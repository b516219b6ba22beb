"""The Mamba2 hybrid family (``adapters/vllm/mamba2.py``: vLLM's own NemotronH, one
MambaMixer2 and one Attention layer, on vLLM's own runners): a clean check in process
(default suite) and on both runners and modes (slow), a planted region hazard flagged
exactly where an untraced graph run differs from its eager twin (slow), and the
state-space kernel references (``kernels/mamba_ssm.py``) against vLLM's Triton kernel in
Triton's interpreter and against the token recurrence the SSD scan computes by chunks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from capturelint.report import finding_entries
import torch

from vllm_required import require_vllm  # tests/vllm/vllm_required.py

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
ARCH = "NemotronHForCausalLM"


def test_the_tiny_hybrid_is_one_mixer_then_one_attention_layer():
    require_vllm()
    from capturelint.adapters.vllm import families, mamba2

    assert mamba2.pattern(2) == "M*" and mamba2.pattern(3) == "M*M"
    hf = mamba2.hf_config(mamba2.ARCHS[ARCH], 2)
    assert hf.hybrid_override_pattern == "M*" and hf.num_hidden_layers == 2
    assert families.of(ARCH).name == "Mamba2 hybrid" and families.of(ARCH).load() is mamba2


def test_a_mamba2_hybrid_checks_clean_in_process():
    """The family's small configuration in the default suite: vLLM's own NemotronH (a
    Mamba2 mixer and an attention layer) on vLLM's own V2 runner, PIECEWISE, three steps."""
    require_vllm()
    from capturelint import api

    report = api.check(engine="vllm", model=ARCH, runner="v2", mode="PIECEWISE", layers=2, steps=3, jobs=1)
    assert report.findings == []
    (cfg,) = report.configs
    assert (cfg.runner, cfg.mode) == ("v2", "PIECEWISE")
    assert cfg.numerical.token_agreement == 1.0 and cfg.numerical.max_logit_error == 0.0
    assert cfg.checked.shadowed_steps == 3 and cfg.checked.eager_twin
    selected = report.invariant_selection()
    # the mixer's kernels in their break, the attention in its break
    assert set(selected) == {"mamba2-mixer-eager", "hybrid-attention-eager"} and all(selected.values()), selected


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "capturelint", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)


@pytest.mark.slow
def test_a_mamba2_hybrid_checks_clean_on_both_runners_and_modes(tmp_path):
    require_vllm()
    out = tmp_path / "report.json"
    done = _cli("check", "--engine", "vllm", "--model", ARCH, "--steps", "4", "--jobs", "1", "--format", "json",
                "-o", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert finding_entries(report) == []
    seen = {(n["runner"], n["mode"]): n for n in report["numerical"]}
    assert set(seen) == {("v1", "PIECEWISE"), ("v1", "FULL"), ("v2", "PIECEWISE"), ("v2", "FULL")}
    for n in seen.values():  # compared, and equal
        assert n["token_agreement"] == 1.0 and n["max_logit_error"] == 0.0 and n["replay_steps"] > 0
    checked = {(c["runner"], c["mode"]): c["checked"] for c in report["configurations"]}
    assert all(checked[(r, "PIECEWISE")]["shadowed_steps"] == 4 for r in ("v1", "v2"))
    assert all(checked[(r, "FULL")]["bare_replays"] > 0 for r in ("v1", "v2"))  # the decode steps' FULL graphs
    assert {i["id"] for i in report["invariants"] if i["selected_ops"] > 0} == {"mamba2-mixer-eager",
                                                                                "hybrid-attention-eager"}




@pytest.mark.slow
def test_a_gate_dropped_in_dummy_runs_is_flagged_where_the_untraced_run_differs(tmp_path):
    """The planted hazard (``data/mamba2_dummy_run_drops_gate.patch``, in a scratch copy
    of vLLM): V1 captures PIECEWISE graphs in a dummy run without metadata, so the zero
    gate is baked into the mixer's captured code; V2 builds metadata for its captures."""
    require_vllm()
    from scratch_vllm import check_and_untraced, planted, run_driver  # tests/vllm/scratch_vllm.py

    target = "model_executor/layers/mamba/mamba_mixer2.py"
    copy, lines = planted(tmp_path, target, (DATA / "mamba2_dummy_run_drops_gate.patch").read_text())
    branch = lines.index("        if get_forward_context().attn_metadata is None:") + 1

    report_path = tmp_path / "report.json"
    done = run_driver(copy, tmp_path, check_and_untraced("NemotronHForCausalLM", ("PIECEWISE",), layers=2, steps=4), str(report_path), timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == 1, done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    flagged = {f"{f['runner']}/{f['mode']}" for f in finding_entries(report)}
    diverged = {config for config, (agreement, error) in result["untraced"].items() if error > 1e-3}
    assert flagged == diverged == {"v1/PIECEWISE"}, (finding_entries(report), result["untraced"])
    located = [f for f in finding_entries(report) if f["capture_frame"]
               and f["capture_frame"]["file"].endswith("vllm/" + target)]
    assert located, finding_entries(report)
    frame = located[0]["capture_frame"]
    assert frame["function"] == "forward" and frame["line"] >= branch, (frame, branch)


# -- the state-space kernel references -------------------------------------------------

SSM = "vllm.model_executor.layers.mamba.ops.mamba_ssm"
LINES, ROWS, HEADS, DIM, DSTATE, GROUPS = 5, 3, 4, 8, 16, 2


def _decode_inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    state = torch.randn(LINES, HEADS, DIM, DSTATE, generator=gen)
    x = torch.randn(ROWS, HEADS, DIM, generator=gen)
    # as the mixer passes them: per-head values expanded over the head dimension
    dt = torch.randn(ROWS, HEADS, generator=gen)[:, :, None].expand(-1, -1, DIM)
    A = (-torch.rand(HEADS, generator=gen))[:, None, None].expand(-1, DIM, DSTATE)
    B = torch.randn(ROWS, GROUPS, DSTATE, generator=gen)
    C = torch.randn(ROWS, GROUPS, DSTATE, generator=gen)
    D = torch.randn(HEADS, generator=gen)[:, None].expand(-1, DIM)
    dt_bias = torch.randn(HEADS, generator=gen)[:, None].expand(-1, DIM)
    return state, x, dt, A, B, C, D, dt_bias


def _vllm_state_update(monkeypatch, *args, **kwargs):
    import triton
    import triton.language as tl
    from triton_twin import run  # tests/vllm/triton_twin.py

    # its softplus calls tl.math.log1p, which this Triton's language (and so its
    # interpreter) lacks: log(1 + v), what it computes
    monkeypatch.setattr(tl.math, "log1p", lambda v, **kw: tl.math.log(v + 1.0), raising=False)

    given = {"HAS_DT_BIAS": "dt_bias_ptr", "HAS_D": "D_ptr", "HAS_Z": "z_ptr",
             "HAS_STATE_BATCH_INDICES": "state_batch_indices_ptr", "IS_SPEC_DECODING": "num_accepted_tokens_ptr",
             "IS_VARLEN": "cu_seqlens_ptr"}
    flags = {flag: (lambda a, n=name: a[n] is not None) for flag, name in given.items()}
    flags["BLOCK_SIZE_DSTATE"] = lambda a: triton.next_power_of_2(a["dstate"])
    # its launch configuration comes from a table keyed by the GPU's name
    return run(SSM, "selective_state_update", *args, heuristics={"_selective_scan_update_kernel": flags},
               patch={"try_get_optimal_ssm_config": lambda *a, **k: (8, 4)}, **kwargs)


@pytest.mark.parametrize("gated", [False, True], ids=["no-z", "z"])
def test_selective_state_update_reference_matches_vllms_triton_kernel(gated, monkeypatch):
    from capturelint.adapters.vllm.kernels.mamba_ssm import selective_state_update

    state, x, dt, A, B, C, D, dt_bias = _decode_inputs()
    z = torch.randn(ROWS, HEADS, DIM, generator=torch.Generator().manual_seed(9)) if gated else None
    lines = torch.tensor([2, 0, 4], dtype=torch.int32)  # row 1 padded: the null block
    theirs_state, ours_state = state.clone(), state.clone()
    theirs, ours = torch.zeros_like(x), torch.zeros_like(x)
    _vllm_state_update(monkeypatch, theirs_state, x, dt, A, B, C, D, dt_bias, z=z, dt_softplus=True, state_batch_indices=lines,
                       dst_state_batch_indices=lines, out=theirs)
    selective_state_update(ours_state, x, dt, A, B, C, D, dt_bias, z=z, dt_softplus=True, state_batch_indices=lines,
                           dst_state_batch_indices=lines, out=ours)
    assert torch.allclose(ours, theirs, atol=1e-4), (ours - theirs).abs().max()
    assert torch.allclose(ours_state, theirs_state, atol=1e-5)
    assert torch.equal(ours_state[[0, 1, 3]], state[[0, 1, 3]])  # only rows 0 and 2's lines written
    assert not torch.equal(ours_state[[2, 4]], state[[2, 4]])


def test_the_chunk_scan_reference_is_the_token_recurrence_of_the_state_update():
    """The SSD scan computes, by chunks, the recurrence the decode update steps: so the
    scan over a prefill equals the update applied token by token from the same state."""
    from capturelint.adapters.vllm.kernels.mamba_ssm import (mamba_chunk_scan_combined_varlen,
                                                             reference_selective_state_update)

    gen = torch.Generator().manual_seed(3)
    lens = [4, 1, 3]
    tokens = sum(lens)
    x = torch.randn(tokens, HEADS, DIM, generator=gen)
    dt = torch.randn(tokens, HEADS, generator=gen)
    A = -torch.rand(HEADS, generator=gen)
    B = torch.randn(tokens, GROUPS, DSTATE, generator=gen)
    C = torch.randn(tokens, GROUPS, DSTATE, generator=gen)
    D = torch.randn(HEADS, generator=gen)
    dt_bias = torch.randn(HEADS, generator=gen)
    initial = torch.randn(3, HEADS, DIM, DSTATE, generator=gen)
    cu = torch.tensor([0, 4, 5, 8], dtype=torch.int32)
    states = torch.zeros(6, HEADS, DIM, DSTATE)
    out = torch.zeros(tokens, HEADS, DIM)
    returned = mamba_chunk_scan_combined_varlen(x, dt, A, B, C, 16, cu, None, None, None, out, D=D, dt_bias=dt_bias,
                                                initial_states=initial, dt_softplus=True, state_dtype=torch.float32,
                                                final_states_out=states, final_state_indices=torch.tensor([5, 1, 3]))
    assert returned is None
    for seq, (start, end, line) in enumerate(((0, 4, 5), (4, 5, 1), (5, 8, 3))):
        stepped = initial[seq:seq + 1].clone()
        for t in range(start, end):
            y = torch.zeros(1, HEADS, DIM)
            reference_selective_state_update(
                stepped, x[t:t + 1], dt[t:t + 1, :, None].expand(-1, -1, DIM), A[:, None, None].expand(-1, DIM, DSTATE),
                B[t:t + 1], C[t:t + 1], D[:, None].expand(-1, DIM), dt_bias[:, None].expand(-1, DIM), None, True,
                None, None, 0, y)
            assert torch.allclose(out[t], y[0], atol=1e-5), (t, (out[t] - y[0]).abs().max())
        assert torch.allclose(states[line], stepped[0], atol=1e-5)
    assert torch.equal(states[[0, 2, 4]], torch.zeros(3, HEADS, DIM, DSTATE))


def test_the_state_kernels_refuse_what_they_do_not_implement_in_one_line():
    from capturelint.adapters.vllm.kernels.mamba_ssm import mamba_chunk_scan_combined_varlen, selective_state_update
    from capturelint.errors import CapturelintError

    state, x, dt, A, B, C, D, dt_bias = _decode_inputs()
    with pytest.raises(CapturelintError, match="speculative decoding .*kernels/mamba_ssm.py"):
        selective_state_update(state, x, dt, A, B, C, D, dt_bias, out=torch.zeros_like(x),
                               num_accepted_tokens=torch.ones(ROWS, dtype=torch.int32))
    with pytest.raises(CapturelintError, match="intermediate states .*kernels/mamba_ssm.py"):
        mamba_chunk_scan_combined_varlen(x, dt[..., 0], A[:, 0, 0], B, C, 16, torch.tensor([0, 3]), None, None, None,
                                         torch.zeros_like(x), return_intermediate_states=True)
