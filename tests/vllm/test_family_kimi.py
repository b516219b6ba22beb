"""The Kimi linear + MLA family (``KimiLinearForCausalLM``): the KDA kernel references
(``kernels/kda.py``) against vLLM's own KDA kernels run in Triton's interpreter
(``tests/vllm/kda_interpreted.py``: live in the slow test, stored outputs in the fast
ones) and against the kernels' documented semantics where the interpreter cannot run
them."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vllm_required import require_vllm  # tests/vllm/vllm_required.py

HERE = Path(__file__).resolve().parent
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
