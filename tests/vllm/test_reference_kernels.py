"""The CPU references for vLLM's DeepSeek V4 fused q-norm/RoPE/KV-insert ops.

Expected values are computed here from the definitions (RMSNorm, GPT-J RoPE, UE8M0 scales,
the fp8_ds_mla byte layout), or by hand for single bytes, not by calling the module's own
helpers; the registered ``torch.ops._C`` ops are checked against the Python functions.
"""

from __future__ import annotations

import math

import pytest
import torch

from capturelint.adapters import vllm_kernels as K

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
    return K.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert(q, kv, cache, slots, positions, csc, padded, EPS, BS, **kw)


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
    torch.testing.assert_close(K.apply_gptj_rope(K.apply_gptj_rope(x, c, s), c, -s), x, atol=1e-5, rtol=1e-5)


def test_rope_at_position_zero_is_identity() -> None:
    q, kv, _ = inputs(n=3, heads=2)
    pos = torch.zeros(3, dtype=torch.int64)
    cache = empty_cache()
    out = quant_insert(q, kv, cache, torch.tensor([0, 5, 10]), pos, padded=2, apply_q_norm=False)
    assert torch.equal(out, q)
    stored = K.dequantize_fp8_ds_mla(cache, torch.tensor([0, 5, 10]), BS)
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
    deq = K.dequantize_fp8_ds_mla(cache, slots, BS)
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
    deq = K.dequantize_fp8_ds_mla(cache, torch.tensor([0]), BS)[0]
    assert deq[:4].tolist() == [448.0, 2.5, 8.0, 2.75]


def test_rope_part_round_trips_exactly_in_bf16() -> None:
    csc = rope_cache()
    q, kv, pos = inputs(n=5, heads=1, kv_scale=1000.0)
    slots = torch.tensor([1, 2, 3, 9, 10])
    cache = empty_cache()
    quant_insert(q, kv, cache, slots, pos, csc, padded=1)
    deq = K.dequantize_fp8_ds_mla(cache, slots, BS)
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
    result = K.fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert(
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
    names = K.register_reference_kernels()
    assert all(hasattr(torch.ops._C, n) for n in K.REFERENCE_KERNELS)
    assert set(names) == set(K.REFERENCE_KERNELS)
    csc = rope_cache()
    q, kv, pos = inputs(n=4, heads=3)
    slots = torch.tensor([2, -1, 7, 8])
    c1, c2 = empty_cache(), empty_cache()
    out_op = torch.ops._C.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert(q, kv, c1, slots, pos, csc, 8, EPS, BS)
    out_py = K.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert(q, kv, c2, slots, pos, csc, 8, EPS, BS)
    assert torch.equal(out_op, out_py) and torch.equal(c1, c2)
    q1, q2 = q.clone(), q.clone()
    b1 = torch.zeros(NUM_BLOCKS, BS, 512, dtype=torch.bfloat16)
    b2 = b1.clone()
    torch.ops._C.fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert(q1, kv, b1, slots, pos, csc, EPS, BS)
    K.fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert(q2, kv, b2, slots, pos, csc, EPS, BS)
    assert torch.equal(q1, q2) and torch.equal(b1, b2) and not torch.equal(q1, q)


def test_registered_schemas_mark_written_arguments() -> None:
    K.register_reference_kernels()
    quant = torch.ops._C.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert.default._schema
    full = torch.ops._C.fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert.default._schema

    def written(schema):
        return [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]

    assert written(quant) == ["k_cache"]
    assert written(full) == ["q", "k_cache"]
    assert len(quant.returns) == 1 and len(full.returns) == 0


def test_registering_twice_is_harmless() -> None:
    first = K.register_reference_kernels()
    second = K.register_reference_kernels()
    assert first == second
    assert all(hasattr(torch.ops._C, n) for n in K.REFERENCE_KERNELS)


def test_meta_tensors_get_the_padded_shape() -> None:
    K.register_reference_kernels()
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
    msg = K.missing_kernel_error("fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_fp8_insert")
    assert msg.startswith(
        "vLLM calls _C.fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_fp8_insert, "
        "which capturelint has no CPU reference for; "
    )
    assert "\n" not in msg
    assert set(K.REFERENCE_KERNELS) == {
        "fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert",
        "fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert",
    }


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
