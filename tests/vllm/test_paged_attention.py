"""The generic attention family's kernel references (``kernels/paged_attention.py``): the
paged attention against vLLM's own ``unified_attention`` Triton kernel, run as it is in
Triton's interpreter (``kernels.interpreter``) on the same inputs (a mixed batch: a
prefill over context, a fresh prefill, a decode; grouped KV heads; padded rows; a
sliding window); the cache write against its documented semantics (slots < 0 skipped)."""

from __future__ import annotations

import pytest
import torch

from vllm_required import require_vllm  # tests/vllm/vllm_required.py

BLOCK, BLOCKS, HKV, GROUP, D = 16, 12, 2, 2, 32
DTYPE = torch.float32  # the interpreter computes bf16 tiles wrongly (numpy has no bf16); the references are dtype-generic


def _batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    query_lens, seq_lens = [3, 2, 1], [20, 2, 35]  # prefill over context, fresh prefill, decode
    tokens = sum(query_lens) + 2  # two padded rows
    q = torch.randn(tokens, HKV * GROUP, D, generator=gen).to(DTYPE)
    k = torch.randn(BLOCKS, BLOCK, HKV, D, generator=gen).to(DTYPE)
    v = torch.randn(BLOCKS, BLOCK, HKV, D, generator=gen).to(DTYPE)
    cu = torch.tensor([0, 3, 5, 6], dtype=torch.int32)
    seqused = torch.tensor(seq_lens, dtype=torch.int32)
    table = torch.tensor([[1, 4, 0], [2, 0, 0], [5, 7, 9]], dtype=torch.int32)
    return q, k, v, cu, seqused, table


def _vllm_attention(q, k, v, cu, seqused, table, window):
    from capturelint.adapters.vllm.kernels.interpreter import interpret_modules

    require_vllm()
    from vllm.v1.attention.ops import triton_unified_attention as tua

    out = torch.full_like(q, 7.0)
    with interpret_modules(("vllm.v1.attention.ops.triton_unified_attention",)):
        tua.unified_attention(q=q, k=k, v=v, out=out, cu_seqlens_q=cu, max_seqlen_q=3, seqused_k=seqused,
                              max_seqlen_k=35, softmax_scale=D ** -0.5, causal=True, window_size=window,
                              block_table=table, softcap=0, q_descale=None, k_descale=None, v_descale=None,
                              seq_threshold_3D=1, num_par_softmax_segments=16,
                              softmax_segm_output=torch.empty(8, HKV * GROUP, 16, D),
                              softmax_segm_max=torch.empty(8, HKV * GROUP, 16),
                              softmax_segm_expsum=torch.empty(8, HKV * GROUP, 16))
    return out


@pytest.mark.parametrize("window", [(-1, -1), (7, 0)], ids=["full", "window-8"])
def test_unified_attention_reference_matches_vllms_triton_kernel(window):
    from capturelint.adapters.vllm.kernels.paged_attention import reference_unified_attention

    q, k, v, cu, seqused, table = _batch()
    theirs = _vllm_attention(q, k, v, cu, seqused, table, window)
    ours = torch.full_like(q, 7.0)
    reference_unified_attention(q, k, v, ours, cu, seqused, table, D ** -0.5, True, window[0], 0.0)
    real = int(cu[-1])
    assert torch.allclose(ours[:real].float(), theirs[:real].float(), atol=2e-2, rtol=2e-2), \
        (ours[:real] - theirs[:real]).abs().max()
    # the padded rows past cu_seqlens_q[-1]: neither writes them
    assert torch.equal(ours[real:], torch.full_like(ours[real:], 7.0))
    # the window changes the long decode's result (it sees 8 of its 35 keys)
    if window[0] >= 0:
        full = torch.full_like(q, 7.0)
        reference_unified_attention(q, k, v, full, cu, seqused, table, D ** -0.5, True, -1, 0.0)
        assert not torch.allclose(full[5].float(), ours[5].float(), atol=1e-2)


def test_reshape_and_cache_reference_writes_each_slot_and_skips_padding():
    """Against the kernel's documented semantics (its launcher asks a real CUDA device for
    its capability, so it is not run here): token t lands at slot_mapping[t]."""
    from capturelint.adapters.vllm.kernels.paged_attention import reference_reshape_and_cache

    gen = torch.Generator().manual_seed(1)
    key = torch.randn(5, HKV, D, generator=gen).to(torch.bfloat16)
    value = torch.randn(5, HKV, D, generator=gen).to(torch.bfloat16)
    slots = torch.tensor([17, 18, -1, 40, 3], dtype=torch.int64)  # -1: padding, written nowhere
    key_cache, value_cache = (torch.zeros(BLOCKS, BLOCK, HKV, D, dtype=torch.bfloat16) for _ in range(2))
    reference_reshape_and_cache(key, value, key_cache, value_cache, slots)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(key_cache[slot // BLOCK, slot % BLOCK], key[t])
            assert torch.equal(value_cache[slot // BLOCK, slot % BLOCK], value[t])
    assert int((key_cache != 0).any(dim=(2, 3)).sum()) == 4  # four slots written, not the padded row's
    assert torch.equal(key_cache[0, 0], torch.zeros(HKV, D, dtype=torch.bfloat16))  # slot 0 (the null block) kept


def test_unified_attention_refuses_what_the_reference_lacks():
    from capturelint.adapters.vllm.kernels.paged_attention import unified_attention
    from capturelint.errors import CapturelintError

    q, k, v, cu, seqused, table = _batch()
    with pytest.raises(CapturelintError, match="sinks"):
        unified_attention(q, k, v, torch.empty_like(q), cu, 3, seqused, 35, 0.1, True, (-1, -1), table, 0, None,
                          None, None, sinks=torch.zeros(4))
