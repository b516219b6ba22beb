"""The CPU references for vLLM's DeepSeek V4 attention ops: the fused q-norm/RoPE/KV-insert
ops, FlashMLA's sparse decode and prefill, the q/kv RMSNorm and inverse-RoPE Triton
kernels, and ``weak_ref_tensor``.

Expected values are computed here from the definitions (RMSNorm, GPT-J RoPE, UE8M0 scales,
the fp8_ds_mla byte layout, softmax attention in float64), or by hand for single bytes, not
by calling the module's own helpers (the attention tests read the cache back with
``dequantize_fp8_ds_mla``, tested on its own above them); the registered ops are checked
against the Python functions. Tests that need vLLM skip without it, except under ``CI=true``
where a missing vLLM fails them.
"""

from __future__ import annotations

import math
import sys

import pytest
import torch

from capturelint.adapters.vllm.kernels import c_ops, flashmla, fp8_ds_mla, reference, triton_ops
from vllm_required import require_vllm  # tests/vllm/vllm_required.py

EPS = 1e-6
BS = 4  # tokens per cache block
NUM_BLOCKS = 3
SENTINEL = 0xAB


# ------------------------------------------------------------------------------ helpers


def rope_cache(max_pos: int = 64, theta: float = 10000.0) -> torch.Tensor:
    """fp32 [max_pos, 64]: 32 cosines then 32 sines, pair i at frequency theta**(-2i/64)."""
    inv_freq = theta ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq
    return torch.cat((angles.cos(), angles.sin()), dim=-1).float()


def gptj_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Independent GPT-J rotation in fp32 via complex multiplication of (even, odd) pairs."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], 32, 2).contiguous())
    rot = torch.polar(torch.ones_like(cos), torch.atan2(sin, cos))
    return torch.view_as_real(pairs * rot).reshape(x.shape)


def has_op(qualified: str) -> bool:
    namespace, name = qualified.split("::")
    return hasattr(getattr(torch.ops, namespace), name)


def empty_cache() -> torch.Tensor:
    return torch.full((NUM_BLOCKS, BS * 584), SENTINEL, dtype=torch.uint8)


def inputs(n: int = 5, heads: int = 3, seed: int = 0, kv_scale: float = 4.0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(n, heads, 512, generator=g) * 2).bfloat16()
    kv = (torch.randn(n, 512, generator=g) * kv_scale).bfloat16()
    positions = torch.randint(1, 64, (n,), generator=g)
    return q, kv, positions


def quant_insert(q, kv, cache, slots, positions, csc=None, padded=8, **kw):
    csc = rope_cache() if csc is None else csc
    return c_ops.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert(q, kv, cache, slots, positions, csc, padded, EPS, BS, **kw)


def token_span(slot: int) -> tuple[int, slice, slice]:
    """The cache row, token-data bytes and scale bytes of one slot, from the layout."""
    block, t = divmod(slot, BS)
    return block, slice(t * 576, t * 576 + 576), slice(BS * 576 + t * 8, BS * 576 + t * 8 + 8)


def roped_kv(kv: torch.Tensor, positions: torch.Tensor, csc: torch.Tensor) -> torch.Tensor:
    rows = csc[positions]
    rope = gptj_rotate(kv[:, 448:], rows[:, :32], rows[:, 32:])
    return torch.cat((kv[:, :448].float(), rope), dim=1).bfloat16()


# --------------------------------------------------------------------------- Q side


def test_quant_insert_returns_padded_q_of_q_dtype() -> None:
    q, kv, pos = inputs(n=5, heads=3)
    cache = empty_cache()
    out = quant_insert(q, kv, cache, torch.tensor([0, 1, 2, 3, 4]), pos, padded=8)
    assert out.shape == (5, 8, 512) and out.dtype == torch.bfloat16
    assert cache.shape == (NUM_BLOCKS, BS * 584) and cache.dtype == torch.uint8
    assert out.data_ptr() != q.data_ptr()


def test_padding_heads_are_zero_and_live_heads_are_not() -> None:
    q, kv, pos = inputs(n=4, heads=3)
    out = quant_insert(q, kv, empty_cache(), torch.tensor([0, 1, 2, 3]), pos, padded=8)
    assert torch.count_nonzero(out[:, 3:]) == 0
    assert bool((out[:, :3].float().abs().sum(-1) > 0).all())


def test_q_rmsnorm_per_head_matches_definition_at_position_zero() -> None:
    # Position 0 is the identity rotation, so the output is the RMSNorm alone.
    q, kv, _ = inputs(n=3, heads=4)
    pos = torch.zeros(3, dtype=torch.int64)
    out = quant_insert(q, kv, empty_cache(), torch.tensor([0, 1, 2]), pos, padded=4)
    x = q.double()
    expected = (x / torch.sqrt(x.square().mean(-1, keepdim=True) + EPS)).bfloat16()
    torch.testing.assert_close(out, expected, atol=0, rtol=2**-7)
    # every head has unit root-mean-square, whatever its input scale
    rms = out.double().square().mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.ones_like(rms), atol=0, rtol=5e-3)


def test_q_norm_is_per_head_and_scale_invariant() -> None:
    q, kv, pos = inputs(n=2, heads=3)
    slots = torch.tensor([-1, -1])
    base = quant_insert(q, kv, empty_cache(), slots, pos, padded=3)
    scaled = q.clone()
    scaled[:, 1] *= 8  # a power of two: exact in bf16
    out = quant_insert(scaled, kv, empty_cache(), slots, pos, padded=3)
    assert torch.equal(out, base)
    # a head's norm does not leak into the others
    other = q.clone()
    other[:, 1] = (torch.randn(2, 512) * 100).bfloat16()
    out2 = quant_insert(other, kv, empty_cache(), slots, pos, padded=3)
    assert torch.equal(out2[:, [0, 2]], base[:, [0, 2]])
    assert not torch.equal(out2[:, 1], base[:, 1])


def test_apply_q_norm_false_only_ropes() -> None:
    q, kv, pos = inputs(n=3, heads=2)
    out = quant_insert(q, kv, empty_cache(), torch.tensor([-1, -1, -1]), pos, padded=2, apply_q_norm=False)
    assert torch.equal(out[..., :448], q[..., :448])
    assert not torch.equal(out[..., 448:], q[..., 448:])


def test_rope_is_gptj_interleaved_with_cos_then_sin_halves() -> None:
    # A hand-made cache: pair i at position 1 turns by angle 0.1*(i+1).
    angles = 0.1 * torch.arange(1, 33, dtype=torch.float64)
    csc = torch.zeros(2, 64)
    csc[0, :32] = 1.0
    csc[1, :32], csc[1, 32:] = angles.cos().float(), angles.sin().float()
    q = torch.zeros(1, 1, 512, dtype=torch.bfloat16)
    q[0, 0, 448] = 1.0  # x_even of pair 0
    q[0, 0, 451] = 1.0  # x_odd of pair 1
    out = quant_insert(q, q[:, 0].clone(), empty_cache(), torch.tensor([-1]), torch.tensor([1]), csc, padded=1,
                       apply_q_norm=False)[0, 0].float()
    expected = torch.zeros(512)
    expected[448], expected[449] = math.cos(0.1), math.sin(0.1)  # (1, 0) turned by 0.1
    expected[450], expected[451] = -math.sin(0.2), math.cos(0.2)  # (0, 1) turned by 0.2
    torch.testing.assert_close(out, expected.bfloat16().float(), atol=0, rtol=0)


def test_rope_round_trip_with_the_inverse_rotation() -> None:
    csc = rope_cache()
    q, kv, pos = inputs(n=6, heads=2)
    out = quant_insert(q, kv, empty_cache(), torch.full((6,), -1), pos, csc, padded=2, apply_q_norm=False)
    rows = csc[pos][:, None, :]
    back = gptj_rotate(out[..., 448:].float(), rows[..., :32], -rows[..., 32:])
    # one bf16 rounding of the rotated values, then an exact-ish inverse in fp32
    torch.testing.assert_close(back, q[..., 448:].float(), atol=2e-2, rtol=2**-7)
    # the module's own helper inverts itself in fp32
    x = torch.randn(6, 64)
    c, s = csc[pos, :32], csc[pos, 32:]
    torch.testing.assert_close(fp8_ds_mla.apply_gptj_rope(fp8_ds_mla.apply_gptj_rope(x, c, s), c, -s), x, atol=1e-5, rtol=1e-5)


def test_rope_at_position_zero_is_identity() -> None:
    q, kv, _ = inputs(n=3, heads=2)
    pos = torch.zeros(3, dtype=torch.int64)
    cache = empty_cache()
    out = quant_insert(q, kv, cache, torch.tensor([0, 5, 10]), pos, padded=2, apply_q_norm=False)
    assert torch.equal(out, q)
    stored = fp8_ds_mla.dequantize_fp8_ds_mla(cache, torch.tensor([0, 5, 10]), BS)
    assert torch.equal(stored[:, 448:], kv[:, 448:].float())


# -------------------------------------------------------------------------- KV side


def test_kv_bytes_of_one_token_by_hand() -> None:
    # NoPE all 1.0: amax 1, e = ceil(log2(1/448)) = -8, byte 119; 1 * 2**8 = 256 = e4m3 0x78.
    # RoPE dims 1.5 at position 0: bf16 0x3FC0, little-endian C0 3F.
    kv = torch.ones(1, 512, dtype=torch.bfloat16)
    kv[0, 448:] = 1.5
    cache = empty_cache()
    quant_insert(kv[:, None].clone(), kv, cache, torch.tensor([6]), torch.tensor([0]), padded=1)
    block, data, scales = token_span(6)
    assert block == 1
    token = cache[block, data]
    assert bool((token[:448] == 0x78).all())
    assert token[448:].tolist() == [0xC0, 0x3F] * 64
    assert cache[block, scales].tolist() == [119] * 7 + [0]


def test_kv_writes_land_at_their_slots_and_nothing_else_changes() -> None:
    csc = rope_cache()
    q, kv, pos = inputs(n=5, heads=2)
    slots = torch.tensor([0, 5, 11, 3, 6])  # blocks 0, 1, 2, 0, 1
    cache = empty_cache()
    quant_insert(q, kv, cache, slots, pos, csc, padded=2)
    touched = torch.zeros_like(cache, dtype=torch.bool)
    expected_rows = roped_kv(kv, pos, csc)
    for i, slot in enumerate(slots.tolist()):
        block, data, scales = token_span(slot)
        touched[block, data] = True
        touched[block, scales] = True
        # the RoPE half is the roped row's bf16 bytes, verbatim
        assert torch.equal(cache[block, data][448:], expected_rows[i, 448:].contiguous().view(torch.uint8))
        assert cache[block, scales][7] == 0
    assert bool((cache[~touched] == SENTINEL).all())
    assert not bool((cache[touched] == SENTINEL).all())


def test_negative_slot_writes_nothing_but_q_is_still_computed() -> None:
    q, kv, pos = inputs(n=3, heads=2)
    cache = empty_cache()
    out = quant_insert(q, kv, cache, torch.tensor([-1, -1, -1]), pos, padded=2)
    assert bool((cache == SENTINEL).all())
    assert torch.count_nonzero(out) > 0
    # mixed: only the token with a slot lands
    quant_insert(q, kv, cache, torch.tensor([-1, 7, -1]), pos, padded=2)
    block, data, scales = token_span(7)
    mask = torch.zeros_like(cache, dtype=torch.bool)
    mask[block, data] = True
    mask[block, scales] = True
    assert bool((cache[~mask] == SENTINEL).all())


def test_tokens_past_slot_mapping_get_q_but_no_insert() -> None:
    # DP padding: slot_mapping shorter than q.
    q, kv, pos = inputs(n=4, heads=2)
    cache = empty_cache()
    out = quant_insert(q, kv, cache, torch.tensor([0, 1]), pos, padded=2)
    full = quant_insert(q, kv, empty_cache(), torch.tensor([0, 1, -1, -1]), pos, padded=2)
    assert torch.equal(out, full)
    written = cache != SENTINEL
    assert bool(written[0, : 2 * 576].any()) and not bool(written[0, 2 * 576 : BS * 576].any())


def test_fp8_round_trip_within_e4m3_bound_and_scales_are_minimal_powers_of_two() -> None:
    csc = rope_cache()
    g = torch.Generator().manual_seed(3)
    n = 6
    # blocks spanning many magnitudes, one all-zero block, one block at exactly 448
    mags = torch.logspace(-3, 4, n * 7).reshape(n, 7, 1)
    nope = (torch.randn(n, 7, 64, generator=g) * mags).reshape(n, 448)
    kv = torch.cat((nope, torch.randn(n, 64, generator=g)), dim=1).bfloat16()
    kv[1, 64:128] = 0.0
    kv[2, :64] = 0.0
    kv[2, 5] = 448.0
    q = torch.zeros(n, 1, 512, dtype=torch.bfloat16)
    slots = torch.tensor([0, 2, 4, 6, 8, 10])
    pos = torch.arange(n)
    cache = empty_cache()
    quant_insert(q, kv, cache, slots, pos, csc, padded=1)
    deq = fp8_ds_mla.dequantize_fp8_ds_mla(cache, slots, BS)
    x = kv[:, :448].float()
    for i, slot in enumerate(slots.tolist()):
        block, _, scales = token_span(slot)
        sbytes = cache[block, scales][:7].long()
        scale = torch.pow(2.0, (sbytes - 127).double()).float()  # [7]
        amax = x[i].reshape(7, 64).abs().amax(-1)
        live = amax >= 1e-4  # below the 1e-4 floor the scale stops shrinking
        # minimal power of two with amax / scale <= 448
        assert bool((amax[live] / scale[live] <= 448).all())
        assert bool((amax[live] / scale[live] > 224).all())
        err = (deq[i, :448] - x[i]).reshape(7, 64).abs()
        bound = x[i].reshape(7, 64).abs() * 2**-4 + scale[:, None] * 2**-10  # half an e4m3 step
        assert bool((err <= bound).all()), (err - bound).max()
        # and within ~2^-3 of the block's scale-relative range, as the brief states it
        assert bool((err <= scale[:, None] * 448 * 2**-3).all())
    assert cache[token_span(2)[0], token_span(2)[2]][1] == 105  # zero block: e = ceil(log2(1e-4/448)) = -22
    assert cache[token_span(4)[0], token_span(4)[2]][0] == 127  # amax 448: scale 1
    assert bool((deq[1, 64:128] == 0).all())


def test_fp8_rounds_to_nearest_even() -> None:
    # amax 448 gives scale 1; 2.625 lies halfway between 2.5 (even) and 2.75; 7.75 between
    # 7.5 and 8 (even); 2.7 is nearer 2.75.
    kv = torch.zeros(1, 512, dtype=torch.bfloat16)
    kv[0, 0], kv[0, 1], kv[0, 2], kv[0, 3] = 448.0, 2.625, 7.75, 2.7
    cache = empty_cache()
    quant_insert(kv[:, None].clone(), kv, cache, torch.tensor([0]), torch.tensor([0]), padded=1)
    deq = fp8_ds_mla.dequantize_fp8_ds_mla(cache, torch.tensor([0]), BS)[0]
    assert deq[:4].tolist() == [448.0, 2.5, 8.0, 2.75]


def test_rope_part_round_trips_exactly_in_bf16() -> None:
    csc = rope_cache()
    q, kv, pos = inputs(n=5, heads=1, kv_scale=1000.0)
    slots = torch.tensor([1, 2, 3, 9, 10])
    cache = empty_cache()
    quant_insert(q, kv, cache, slots, pos, csc, padded=1)
    deq = fp8_ds_mla.dequantize_fp8_ds_mla(cache, slots, BS)
    assert torch.equal(deq[:, 448:], roped_kv(kv, pos, csc)[:, 448:].float())


def test_dequantize_respects_a_padded_block_row() -> None:
    # The 2-D view's rows may be longer than block_size*584; offsets stay within a row.
    q, kv, pos = inputs(n=2, heads=1)
    wide = torch.full((NUM_BLOCKS, BS * 584 + 40), SENTINEL, dtype=torch.uint8)
    quant_insert(q, kv, wide, torch.tensor([4, 9]), pos, padded=1)
    tight = empty_cache()
    quant_insert(q, kv, tight, torch.tensor([4, 9]), pos, padded=1)
    assert torch.equal(wide[:, : BS * 584], tight)
    assert bool((wide[:, BS * 584 :] == SENTINEL).all())


# ----------------------------------------------------------------- bf16 full cache


def test_full_cache_bf16_insert_writes_rows_and_ropes_q_in_place() -> None:
    csc = rope_cache()
    q, kv, pos = inputs(n=4, heads=3)
    expected_q = quant_insert(q, kv, empty_cache(), torch.full((4,), -1), pos, csc, padded=3)
    q_inout = q.clone()
    ptr = q_inout.data_ptr()
    cache = torch.full((NUM_BLOCKS, BS, 512), 7.0, dtype=torch.bfloat16)
    slots = torch.tensor([5, -1, 0, 11])
    result = c_ops.fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert(
        q_inout, kv, cache, slots, pos, csc, EPS, BS
    )
    assert result is None
    assert q_inout.data_ptr() == ptr and q_inout.shape == q.shape
    assert torch.equal(q_inout, expected_q)
    rows = roped_kv(kv, pos, csc)
    written = torch.zeros(NUM_BLOCKS, BS, dtype=torch.bool)
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        assert torch.equal(cache[slot // BS, slot % BS], rows[i])
        written[slot // BS, slot % BS] = True
    assert bool((cache[~written] == 7.0).all())


# ---------------------------------------------------------------------- registration


def test_registered_ops_exist_and_match_the_python_functions() -> None:
    names = reference.register_reference_kernels()
    assert all(has_op(n) for n in reference.REFERENCE_KERNELS)
    assert set(names) == set(reference.REFERENCE_KERNELS)
    csc = rope_cache()
    q, kv, pos = inputs(n=4, heads=3)
    slots = torch.tensor([2, -1, 7, 8])
    c1, c2 = empty_cache(), empty_cache()
    out_op = torch.ops._C.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert(q, kv, c1, slots, pos, csc, 8, EPS, BS)
    out_py = c_ops.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert(q, kv, c2, slots, pos, csc, 8, EPS, BS)
    assert torch.equal(out_op, out_py) and torch.equal(c1, c2)
    q1, q2 = q.clone(), q.clone()
    b1 = torch.zeros(NUM_BLOCKS, BS, 512, dtype=torch.bfloat16)
    b2 = b1.clone()
    torch.ops._C.fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert(q1, kv, b1, slots, pos, csc, EPS, BS)
    c_ops.fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert(q2, kv, b2, slots, pos, csc, EPS, BS)
    assert torch.equal(q1, q2) and torch.equal(b1, b2) and not torch.equal(q1, q)


def test_registered_schemas_mark_written_arguments() -> None:
    reference.register_reference_kernels()
    quant = torch.ops._C.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert.default._schema
    full = torch.ops._C.fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert.default._schema

    def written(schema):
        return [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]

    assert written(quant) == ["k_cache"]
    assert written(full) == ["q", "k_cache"]
    assert len(quant.returns) == 1 and len(full.returns) == 0


def test_registering_twice_is_harmless() -> None:
    first = reference.register_reference_kernels()
    second = reference.register_reference_kernels()
    assert first == second
    assert all(has_op(n) for n in reference.REFERENCE_KERNELS)


def test_meta_tensors_get_the_padded_shape() -> None:
    reference.register_reference_kernels()
    q = torch.empty(5, 3, 512, dtype=torch.bfloat16, device="meta")
    out = torch.ops._C.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert(
        q,
        torch.empty(5, 512, dtype=torch.bfloat16, device="meta"),
        torch.empty(NUM_BLOCKS, BS * 584, dtype=torch.uint8, device="meta"),
        torch.empty(5, dtype=torch.int64, device="meta"),
        torch.empty(5, dtype=torch.int64, device="meta"),
        torch.empty(64, 64, device="meta"),
        16,
        EPS,
        BS,
    )
    assert out.shape == (5, 16, 512) and out.dtype == torch.bfloat16 and out.device.type == "meta"


# ------------------------------------------------------------------------ refusals


def test_missing_kernel_error_is_one_line_naming_the_op() -> None:
    msg = reference.missing_kernel_error("fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_fp8_insert")
    assert msg.startswith(
        "vLLM calls _C.fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_fp8_insert, "
        "which capturelint has no CPU reference for; "
    )
    assert "\n" not in msg
    assert set(reference.REFERENCE_KERNELS) == {
        "_C::fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert",
        "_C::fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert",
        "_C::weak_ref_tensor",
        "_flashmla_C::sparse_decode_fwd",
        "_flashmla_C::sparse_prefill_fwd",
        "capturelint_vllm::fused_q_kv_rmsnorm",
        "capturelint_vllm::fused_inv_rope_fp8_quant",
        "capturelint_vllm::dequantize_and_gather_k_cache",
        "capturelint_vllm::combine_topk_swa_indices",
    }
    assert all(n in msg for n in reference.REFERENCE_KERNELS)
    qualified = reference.missing_kernel_error("_flashmla_C::dense_decode_fwd")
    assert qualified.startswith("vLLM calls _flashmla_C.dense_decode_fwd, which capturelint has no CPU reference for; ")


def test_unsupported_arguments_are_refused() -> None:
    q, kv, pos = inputs(n=2, heads=3)
    slots = torch.tensor([0, 1])
    with pytest.raises(NotImplementedError):
        quant_insert(q, kv, empty_cache(), slots, pos, padded=4, kv_mxfp8=True)
    with pytest.raises(NotImplementedError):
        quant_insert(q, kv, empty_cache(), slots, pos, padded=4, is_q_interleaved=True)
    with pytest.raises(ValueError, match="q_head_padded"):
        quant_insert(q, kv, empty_cache(), slots, pos, padded=2)
    with pytest.raises(ValueError, match="bytes"):
        quant_insert(q, kv, torch.zeros(NUM_BLOCKS, BS * 576, dtype=torch.uint8), slots, pos, padded=4)


# ------------------------------------------------------------- FlashMLA sparse decode

TOKEN = 584


def filled_cache(num_blocks: int, block_size: int, seed: int, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A FlashMLA-shaped ``[num_blocks, block_size, 1, 584]`` cache with every slot written
    through the quant-insert reference (rows padded by ``pad`` bytes), and its rows
    read back as fp32 ``[num_blocks*block_size, 512]``."""
    g = torch.Generator().manual_seed(seed)
    n = num_blocks * block_size
    kv = (torch.randn(n, 512, generator=g) * 2).bfloat16()
    flat = torch.full((num_blocks, block_size * TOKEN + pad), SENTINEL, dtype=torch.uint8)
    c_ops.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert(
        torch.zeros(n, 1, 512, dtype=torch.bfloat16), kv, flat, torch.arange(n),
        torch.randint(0, 64, (n,), generator=g), rope_cache(), 1, EPS, block_size,
    )
    rows = fp8_ds_mla.dequantize_fp8_ds_mla(flat, torch.arange(n), block_size)
    return flat[:, : block_size * TOKEN].view(num_blocks, block_size, 1, TOKEN), rows


def dense_attention(q, row_sets, scale, sink=None):
    """float64 softmax attention, one query and head at a time: ``row_sets[b][s]`` is
    the list of K/V rows (fp32 [512]) query (b, s) sees. Returns out [b, s, h, 512] and
    lse [b, h, s] with the conventions of FlashMLA (no valid row: 0 and +inf)."""
    b, s_q, h_q, _ = q.shape
    out = torch.zeros(b, s_q, h_q, 512, dtype=torch.float64)
    lse = torch.full((b, h_q, s_q), math.inf, dtype=torch.float64)
    for i in range(b):
        for j in range(s_q):
            rows = row_sets[i][j]
            if not rows:
                continue
            kv = torch.stack(rows).double()
            for h in range(h_q):
                logits = (kv @ q[i, j, h].double()) * scale
                m = logits.max()
                weights = torch.exp(logits - m)
                total = weights.sum()
                lse[i, h, j] = m + torch.log(total)
                if sink is not None:
                    total = total + math.exp(float(sink[h]) - float(m))
                out[i, j, h] = (weights[:, None] * kv).sum(0) / total
    return out, lse


def decode(q, cache, idx, **kw):
    args = dict(topk_length=None, attn_sink=None, tile_scheduler_metadata=None, num_splits=None,
                extra_k_cache=None, extra_indices_in_kvcache=None, extra_topk_length=None,
                head_dim_v=512, softmax_scale=0.04, out=None, enable_batch_invariant=False)
    args.update(kw)
    return flashmla.sparse_decode_fwd(q, cache, idx, **args)


def test_sparse_decode_matches_dense_attention_over_both_caches() -> None:
    # main cache block size 4, extra (compressed) cache block size 2 with padded block rows
    cache, rows = filled_cache(3, 4, seed=1)
    extra, extra_rows = filled_cache(5, 2, seed=2, pad=24)
    g = torch.Generator().manual_seed(5)
    b, s_q, h_q = 3, 2, 4
    q = torch.randn(b, s_q, h_q, 512, generator=g).bfloat16()
    idx = torch.tensor([
        [[0, 5, -1, 11, 3], [7, 7, 2, -1, -1]],  # a repeated slot counts twice
        [[1, 2, 3, 4, 6], [8, -1, 9, 10, 0]],    # topk_length 3 cuts the tails
        [[-1, -1, -1, -1, -1], [12, 40, 4, -1, 6]],  # no main rows; 12 and 40 are out of range
    ], dtype=torch.int32)
    topk_length = torch.tensor([5, 3, 5], dtype=torch.int32)
    extra_idx = torch.tensor([
        [[9, 0, 4], [-1, -1, -1]],
        [[1, 2, 3], [5, 6, 7]],
        [[-1, 8, -1], [2, -1, 1]],
    ], dtype=torch.int32)
    extra_length = torch.tensor([3, 2, 3], dtype=torch.int32)
    sink = torch.tensor([0.5, -1.0, 3.0, float("-inf")])
    scale = 0.04

    out, lse, meta, splits = decode(
        q, cache, idx, topk_length=topk_length, attn_sink=sink, extra_k_cache=extra,
        extra_indices_in_kvcache=extra_idx, extra_topk_length=extra_length, softmax_scale=scale,
    )

    sets = [[[] for _ in range(s_q)] for _ in range(b)]
    for i in range(b):
        for j in range(s_q):
            for k, slot in enumerate(idx[i, j].tolist()):
                if k < topk_length[i] and 0 <= slot < 12:
                    sets[i][j].append(rows[slot])
            for k, slot in enumerate(extra_idx[i, j].tolist()):
                if k < extra_length[i] and slot >= 0:
                    sets[i][j].append(extra_rows[slot])
    want, want_lse = dense_attention(q, sets, scale, sink)
    assert out.shape == (b, s_q, h_q, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (b, h_q, s_q) and lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), want.bfloat16().double(), atol=1e-3, rtol=2**-7)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-4, rtol=1e-5)
    assert meta.shape == (1, 8) and meta.dtype == torch.int32 and not meta.any()
    assert splits.shape == (b + 1,) and splits.dtype == torch.int32 and not splits.any()


def test_sparse_decode_query_without_rows_gives_zero_and_lse_inf() -> None:
    cache, _ = filled_cache(2, 4, seed=3)
    q = torch.randn(2, 1, 3, 512).bfloat16()
    idx = torch.tensor([[[-1, -1, 8, 100]], [[0, 1, 2, 3]]], dtype=torch.int32)  # 8 slots: 8, 100 out of range
    for sink in (None, torch.tensor([0.0, 5.0, -5.0]), torch.full((3,), float("inf"))):
        out, lse, _, _ = decode(q, cache, idx, attn_sink=sink)
        assert not out[0].any() and bool(torch.isinf(lse[0]).all()) and bool((lse[0] > 0).all())
        assert bool(torch.isfinite(lse[1]).all())
    # topk_length 0 empties a query too
    out, lse, _, _ = decode(q, cache, idx, topk_length=torch.tensor([4, 0], dtype=torch.int32))
    assert not out.any() and bool((lse == math.inf).all())


def test_sparse_decode_sink_scales_output_and_leaves_lse() -> None:
    cache, _ = filled_cache(2, 4, seed=4)
    q = torch.randn(1, 2, 2, 512).bfloat16()
    idx = torch.tensor([[[0, 3, 5], [1, 2, 7]]], dtype=torch.int32)
    plain, lse, _, _ = decode(q, cache, idx)
    no_effect, lse_neg, _, _ = decode(q, cache, idx, attn_sink=torch.full((2,), float("-inf")))
    assert torch.equal(plain, no_effect) and torch.equal(lse, lse_neg)
    sink = torch.tensor([0.3, -2.0])
    sunk, lse_sunk, _, _ = decode(q, cache, idx, attn_sink=sink)
    assert torch.equal(lse, lse_sunk)
    factor = 1.0 / (1.0 + torch.exp(sink[None, :, None] - lse))  # [1, h, s]
    expected = plain.float() * factor.permute(0, 2, 1)[..., None]
    torch.testing.assert_close(sunk.float(), expected, atol=1e-3, rtol=2**-7)
    zero, _, _, _ = decode(q, cache, idx, attn_sink=torch.full((2,), float("inf")))
    assert not zero.any()


def test_sparse_decode_topk_length_is_masking_the_tail() -> None:
    cache, _ = filled_cache(3, 4, seed=6)
    q = torch.randn(2, 2, 2, 512).bfloat16()
    idx = torch.randint(0, 12, (2, 2, 6), dtype=torch.int32)
    lengths = torch.tensor([2, 5], dtype=torch.int32)
    masked = idx.clone()
    masked[0, :, 2:] = -1
    masked[1, :, 5:] = -1
    a = decode(q, cache, idx, topk_length=lengths)
    b = decode(q, cache, masked)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_sparse_decode_garbage_in_skipped_slots_does_not_leak() -> None:
    # Bytes 0xFF decode to fp8 NaN; a slot nobody selects must not matter.
    cache, _ = filled_cache(2, 4, seed=7)
    q = torch.randn(1, 1, 2, 512).bfloat16()
    idx = torch.tensor([[[0, 1, -1, 2]]], dtype=torch.int32)
    clean = decode(q, cache, idx, topk_length=torch.tensor([2], dtype=torch.int32))[0]
    dirty = cache.clone()
    dirty.view(2, -1)[0, 2 * 576 : 3 * 576] = 0xFF  # slot 2's data
    assert torch.equal(decode(q, dirty, idx, topk_length=torch.tensor([2], dtype=torch.int32))[0], clean)
    assert bool(torch.isfinite(clean.float()).all())


def test_sparse_decode_writes_out_and_passes_scheduler_tensors_through() -> None:
    cache, _ = filled_cache(2, 4, seed=8)
    q = torch.randn(2, 1, 3, 512).bfloat16()
    idx = torch.tensor([[[0, 1]], [[2, 7]]], dtype=torch.int32)
    fresh, lse, meta, splits = decode(q, cache, idx)
    out = torch.full((2, 1, 3, 512), 9.0, dtype=torch.bfloat16)
    got, lse2, meta2, splits2 = decode(q, cache, idx, out=out, tile_scheduler_metadata=meta, num_splits=splits)
    assert got is out and torch.equal(out, fresh) and torch.equal(lse, lse2)
    assert meta2 is meta and splits2 is splits


def test_sparse_decode_refuses_other_cache_layouts() -> None:
    q = torch.zeros(1, 1, 1, 512, dtype=torch.bfloat16)
    idx = torch.zeros(1, 1, 1, dtype=torch.int32)
    for width in (528, 656):
        with pytest.raises(NotImplementedError, match="584"):
            decode(q, torch.zeros(2, 4, 1, width, dtype=torch.uint8), idx)
    with pytest.raises(ValueError, match="head_dim_v"):
        decode(q, torch.zeros(2, 4, 1, TOKEN, dtype=torch.uint8), idx, head_dim_v=448)


def test_sparse_prefill_matches_dense_attention() -> None:
    g = torch.Generator().manual_seed(9)
    s_q, h_q, s_kv, topk = 3, 2, 6, 4
    q = torch.randn(s_q, h_q, 512, generator=g).bfloat16()
    kv = torch.randn(s_kv, 1, 512, generator=g).bfloat16()
    idx = torch.tensor([[[0, 2, 5, -1]], [[1, 6, 3, 3]], [[-1, -1, -1, -1]]], dtype=torch.int32)
    lengths = torch.tensor([4, 3, 4], dtype=torch.int32)
    sink = torch.tensor([1.0, -0.5])
    out, max_logits, lse = flashmla.sparse_prefill_fwd(q, kv, idx, 0.05, 512, sink, lengths, None)
    sets = [[[kv[s, 0].float() for k, s in enumerate(idx[i, 0].tolist()) if k < lengths[i] and 0 <= s < s_kv]]
            for i in range(s_q)]
    want, want_lse = dense_attention(q[:, None], sets, 0.05, sink)
    assert out.shape == (s_q, h_q, 512) and max_logits.shape == lse.shape == (s_q, h_q)
    torch.testing.assert_close(out.double(), want[:, 0].bfloat16().double(), atol=1e-3, rtol=2**-7)
    torch.testing.assert_close(lse.double(), want_lse[:, :, 0], atol=1e-4, rtol=1e-5)
    for i in range(2):
        rows = torch.stack(sets[i][0]).double()
        expected_max = (q[i].double() @ rows.T * 0.05).amax(-1)
        torch.testing.assert_close(max_logits[i].double(), expected_max, atol=1e-4, rtol=1e-5)
    assert not out[2].any() and bool((lse[2] == math.inf).all()) and bool((max_logits[2] == -math.inf).all())


def test_flashmla_ops_registered_with_written_out() -> None:
    reference.register_reference_kernels()
    cache, _ = filled_cache(2, 4, seed=10)
    q = torch.randn(1, 1, 2, 512).bfloat16()
    idx = torch.tensor([[[0, 3, 6]]], dtype=torch.int32)
    via_op = torch.ops._flashmla_C.sparse_decode_fwd(
        q, cache, idx, None, None, None, None, None, None, None, 512, 0.04, None, False
    )
    direct = decode(q, cache, idx)
    assert all(torch.equal(a, b) for a, b in zip(via_op, direct))

    def written(op):
        return [a.name for a in op.default._schema.arguments if a.alias_info is not None and a.alias_info.is_write]

    assert written(torch.ops._flashmla_C.sparse_decode_fwd) == ["out"]
    assert written(torch.ops._flashmla_C.sparse_prefill_fwd) == ["out"]
    meta_out = torch.ops._flashmla_C.sparse_decode_fwd(
        q.to("meta"), cache.to("meta"), idx.to("meta"), None, None, None, None, None, None, None,
        512, 0.04, None, False,
    )
    assert [t.shape for t in meta_out] == [(1, 1, 2, 512), (1, 2, 1), (1, 8), (2,)]


def test_vllm_flash_mla_interface_reaches_the_reference() -> None:
    require_vllm()
    flashmla.install_flashmla_stub()
    assert "vllm._flashmla_C" in sys.modules
    assert flashmla.install_flashmla_stub() is False  # idempotent
    reference.register_reference_kernels()
    from vllm.third_party.flashmla import flash_mla_interface as F

    cache, _ = filled_cache(3, 4, seed=11)
    extra, _ = filled_cache(2, 2, seed=12)
    q = torch.randn(2, 1, 4, 512).bfloat16()
    idx = torch.tensor([[[0, 1, 9, -1]], [[3, 4, -1, -1]]], dtype=torch.int32)
    extra_idx = torch.tensor([[[0, 3]], [[1, -1]]], dtype=torch.int32)
    sink = torch.zeros(4)
    sched, _ = F.get_mla_metadata()
    out = torch.empty(2, 1, 4, 512, dtype=torch.bfloat16)
    kwargs = dict(is_fp8_kvcache=True, indices=idx, attn_sink=sink, extra_k_cache=extra,
                  extra_indices_in_kvcache=extra_idx, softmax_scale=0.05, out=out)
    o, lse = F.flash_mla_with_kvcache(q, cache, None, None, 512, sched, **kwargs)
    want = decode(q, cache, idx, attn_sink=sink, extra_k_cache=extra, extra_indices_in_kvcache=extra_idx,
                  softmax_scale=0.05)
    assert o is out and torch.equal(o, want[0]) and torch.equal(lse, want[1])
    meta = sched.tile_scheduler_metadata
    F.flash_mla_with_kvcache(q, cache, None, None, 512, sched, **kwargs)  # reuses the scheduler tensors
    assert sched.tile_scheduler_metadata is meta


# ------------------------------------------------------------------ fused_q_kv_rmsnorm


def test_fused_q_kv_rmsnorm_matches_the_formula() -> None:
    g = torch.Generator().manual_seed(13)
    for dtype in (torch.bfloat16, torch.float32):
        qr_kv = (torch.randn(5, 96 + 64, generator=g) * 3).to(dtype)
        qr, kv = qr_kv.split([96, 64], dim=-1)  # strided views, as vLLM passes them
        q_w = (torch.rand(96, generator=g) + 0.5).to(dtype)
        kv_w = (torch.rand(64, generator=g) + 0.5).to(dtype)
        q_out, kv_out = triton_ops.reference_fused_q_kv_rmsnorm(qr, kv, q_w, kv_w, EPS)
        for x, w, got in ((qr, q_w, q_out), (kv, kv_w, kv_out)):
            xd = x.double()
            want = xd / torch.sqrt(xd.square().mean(-1, keepdim=True) + EPS) * w.double()
            assert got.dtype == dtype and got.shape == x.shape and got.is_contiguous()
            assert got.data_ptr() != x.data_ptr()
            tol = 2**-7 if dtype == torch.bfloat16 else 1e-5
            torch.testing.assert_close(got.double(), want.to(dtype).double(), atol=1e-5, rtol=tol)
            if dtype == torch.bfloat16:
                # fp32 math, weight multiplied before the single cast (not a bf16 product)
                xf = x.float()
                exact = (xf * torch.rsqrt(xf.square().sum(-1, keepdim=True) / x.shape[1] + EPS) * w.float())
                assert torch.equal(got, exact.bfloat16())


def test_fused_q_kv_rmsnorm_wrapper_dispatches_one_op() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    qr, kv = torch.randn(3, 32).bfloat16(), torch.randn(3, 16).bfloat16()
    w1, w2 = torch.ones(32, dtype=torch.bfloat16), torch.ones(16, dtype=torch.bfloat16)
    want = triton_ops.reference_fused_q_kv_rmsnorm(qr, kv, w1, w2, EPS)
    with Record() as rec:
        got = triton_ops.fused_q_kv_rmsnorm(qr, kv, w1, w2, EPS)
    assert rec.names == ["capturelint_vllm.fused_q_kv_rmsnorm.default"]
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# ------------------------------------------------------------ fused_inv_rope_fp8_quant


def rope_heads(o: torch.Tensor, positions: torch.Tensor, csc: torch.Tensor) -> torch.Tensor:
    """Forward GPT-J RoPE on dims 448..511 of every head, kept in fp32."""
    rows = csc[positions][:, None, :].expand(-1, o.shape[1], -1)
    rope = gptj_rotate(o[..., 448:], rows[..., :32], rows[..., 32:])
    return torch.cat((o[..., :448].float(), rope), dim=-1)


def test_inv_rope_undoes_rope_and_groups_heads() -> None:
    csc = rope_cache()
    g = torch.Generator().manual_seed(14)
    T, groups, per_group = 5, 2, 3
    original = torch.randn(T, groups * per_group, 512, generator=g).bfloat16()
    positions = torch.randint(0, 64, (T,), generator=g)
    roped = rope_heads(original, positions, csc).bfloat16()
    out, scale = triton_ops.fused_inv_rope_fp8_quant(roped, positions, csc, groups, per_group, quantize=False)
    d = per_group * 512
    assert out.shape == (T, groups, d) and out.dtype == torch.bfloat16
    assert out.stride() == (d, T * d, 1)  # group-major buffer, as the grouped bmm reads it
    assert scale.numel() == 0 and scale.dtype == torch.float32
    assert triton_ops.fused_inv_rope_fp8_quant(roped, positions, csc, groups, per_group, tma_aligned_scales=True,
                                      quantize=False)[1].dtype == torch.int32
    back = out.reshape(T, groups, per_group, 512).reshape(T, groups * per_group, 512)
    assert torch.equal(back[..., :448], original[..., :448])  # NoPE dims pass through
    torch.testing.assert_close(back.float(), original.float(), atol=2e-2, rtol=2**-7)
    # head g*per_group + j sits at out[t, g, j*512:(j+1)*512]
    one = torch.zeros_like(roped)
    one[:, 4] = 1.0
    hit = triton_ops.fused_inv_rope_fp8_quant(one, torch.zeros(T, dtype=torch.int64), csc, groups, per_group, quantize=False)[0]
    assert bool((hit[:, 1, 512:1024] == 1).all()) and int(torch.count_nonzero(hit)) == T * 512
    # the o-projection's bmm runs on it as vLLM writes it
    weight = torch.randn(groups, 7, d).bfloat16()
    z = torch.empty(T, groups, 7, dtype=torch.bfloat16)
    torch.bmm(out.transpose(0, 1), weight.transpose(1, 2), out=z.transpose(0, 1))
    expected = torch.einsum("tgd,grd->tgr", out.float(), weight.float())
    torch.testing.assert_close(z.float(), expected, atol=0.1, rtol=2e-2)


def test_inv_rope_rotates_by_minus_the_angle() -> None:
    # Pair 0 at position 1 turns by -0.1: (1, 0) -> (cos 0.1, -sin 0.1).
    angles = 0.1 * torch.arange(1, 33, dtype=torch.float64)
    csc = torch.zeros(2, 64)
    csc[0, :32] = 1.0
    csc[1, :32], csc[1, 32:] = angles.cos().float(), angles.sin().float()
    o = torch.zeros(1, 1, 512, dtype=torch.bfloat16)
    o[0, 0, 448] = 1.0
    out = triton_ops.reference_fused_inv_rope_fp8_quant(o, torch.tensor([1]), csc, 1, 1, quantize=False)[0][0, 0]
    assert out[448].item() == torch.tensor(math.cos(0.1)).bfloat16().item()
    assert out[449].item() == torch.tensor(-math.sin(0.1)).bfloat16().item()


def test_inv_rope_quantized_blocks_and_scale_layouts() -> None:
    csc = rope_cache()
    g = torch.Generator().manual_seed(15)
    T, groups, per_group = 3, 2, 2
    mags = torch.logspace(-2, 3, T * groups * per_group * 4).reshape(T, groups * per_group, 4, 1)
    o = (torch.randn(T, groups * per_group, 4, 128, generator=g) * mags).reshape(T, groups * per_group, 512).bfloat16()
    positions = torch.tensor([0, 7, 33])
    rotated = triton_ops.reference_fused_inv_rope_fp8_quant(o, positions, csc, groups, per_group, quantize=False)[0].float()
    values, scales = triton_ops.fused_inv_rope_fp8_quant(o, positions, csc, groups, per_group)
    d = per_group * 512
    assert values.dtype == torch.float8_e4m3fn and values.shape == (T, groups, d) and values.stride() == (d, T * d, 1)
    blocks = d // 128
    padded = 4  # align(3, 4)
    assert scales.dtype == torch.float32 and scales.shape == (T, groups, blocks)
    assert scales.stride() == (1, blocks * padded, padded)
    amax = rotated.reshape(T, groups, blocks, 128).abs().amax(-1)
    assert bool((amax / scales <= 448).all()) and bool((amax / scales > 224).all())
    assert bool((torch.log2(scales) == torch.log2(scales).round()).all())
    deq = values.float().reshape(T, groups, blocks, 128) * scales[..., None]
    err = (deq - rotated.reshape(T, groups, blocks, 128)).abs()
    assert bool((err <= rotated.reshape(T, groups, blocks, 128).abs() * 2**-4 + scales[..., None] * 2**-9).all())
    # SM100 layout: the same exponents, biased, four bytes per little-endian int32
    values_p, packed = triton_ops.fused_inv_rope_fp8_quant(o, positions, csc, groups, per_group, tma_aligned_scales=True)
    assert torch.equal(values_p.view(torch.uint8), values.view(torch.uint8))
    assert packed.dtype == torch.int32 and packed.shape == (T, groups, blocks // 4)
    assert packed.stride() == (1, (blocks // 4) * padded, padded)
    unpacked = torch.stack([(packed >> (8 * k)) & 0xFF for k in range(4)], dim=-1).reshape(T, groups, blocks)
    assert torch.equal(unpacked, torch.log2(scales).long().int() + 127)


# --------------------------------------------------------------------- weak_ref_tensor


def test_weak_ref_tensor_is_an_alias() -> None:
    reference.register_reference_kernels()
    base = torch.arange(40.0).reshape(5, 8)
    view = base[1:, ::2]
    ref = torch.ops._C.weak_ref_tensor(view)
    assert ref.data_ptr() == view.data_ptr()
    assert ref.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    assert (ref.shape, ref.stride(), ref.storage_offset()) == (view.shape, view.stride(), view.storage_offset())
    ref[0, 0] = -1.0
    assert base[1, 0] == -1.0
    schema = torch.ops._C.weak_ref_tensor.default._schema
    assert schema.returns[0].alias_info is not None and not schema.arguments[0].alias_info.is_write
    meta = torch.ops._C.weak_ref_tensor(torch.empty(3, 4, device="meta"))
    assert meta.shape == (3, 4) and meta.device.type == "meta"
