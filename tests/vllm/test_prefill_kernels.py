"""The CPU references for the two Triton kernels of vLLM's DeepSeek V4 prefill path
(``models/deepseek_v4/common/ops/cache_utils.py``): ``dequantize_and_gather_k_cache``
and ``combine_topk_swa_indices``, checked against their documented semantics (expected
rows read back with ``dequantize_fp8_ds_mla``, tested in test_reference_kernels.py;
index lists worked out by hand), and together, as ``_forward_prefill`` calls them
through vLLM's own wrappers, against dense sliding-window attention.
"""

from __future__ import annotations

import pytest
import torch

from capturelint.adapters.vllm.kernels import c_ops, fp8_ds_mla, reference, triton_ops
from vllm_required import require_vllm  # tests/vllm/vllm_required.py

BS = 4  # tokens per cache block


def filled_cache(blocks: int, seed: int = 0) -> torch.Tensor:
    """A ``[blocks, BS, 584]`` fp8_ds_mla cache with every slot written by the insert op."""
    g = torch.Generator().manual_seed(seed)
    cache = torch.zeros(blocks, BS * fp8_ds_mla.TOKEN_BYTES, dtype=torch.uint8)
    n = blocks * BS
    kv = (torch.randn(n, 512, generator=g) * 3).bfloat16()
    q = torch.zeros(n, 1, 512, dtype=torch.bfloat16)
    csc = torch.zeros(64, 64)
    csc[:, :32] = 1.0  # cos 1, sin 0: RoPE is the identity
    c_ops.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert(q, kv, cache, torch.arange(n), torch.zeros(n, dtype=torch.long),
                                                         csc, 1, 1e-6, BS)
    return cache.view(blocks, BS, fp8_ds_mla.TOKEN_BYTES)


def slots_of(block_row: list[int], positions: range) -> torch.Tensor:
    return torch.tensor([block_row[p // BS] * BS + p % BS for p in positions])


def test_gather_writes_the_last_gather_len_tokens_of_each_sequence_at_offset() -> None:
    cache = filled_cache(6)
    block_table = torch.tensor([[4, 1, 0], [2, 5, 3]], dtype=torch.int32)
    seq_lens = torch.tensor([6, 9], dtype=torch.int32)
    gather_lens = torch.tensor([3, 5], dtype=torch.int32)
    out = torch.full((2, 8, 512), 7.0, dtype=torch.bfloat16)
    triton_ops.dequantize_and_gather_k_cache(out, cache, seq_lens, gather_lens, block_table, BS, 2)
    flat = cache.view(6, -1)
    for b, (seq_len, gather_len) in enumerate(((6, 3), (9, 5))):
        want = fp8_ds_mla.dequantize_fp8_ds_mla(flat, slots_of(block_table[b].tolist(), range(seq_len - gather_len, seq_len)),
                                       BS).bfloat16()
        assert torch.equal(out[b, 2 : 2 + gather_len], want)
        assert (out[b, :2] == 7).all() and (out[b, 2 + gather_len :] == 7).all()  # nothing else written


def test_gather_without_gather_lens_reads_whole_sequences() -> None:
    cache = filled_cache(3, seed=1)
    block_table = torch.tensor([[2, 0]], dtype=torch.int32)
    out = torch.zeros(1, 6, 512, dtype=torch.bfloat16)
    triton_ops.dequantize_and_gather_k_cache(out, cache, torch.tensor([5], dtype=torch.int32), None, block_table, BS, 0)
    want = fp8_ds_mla.dequantize_fp8_ds_mla(cache.view(3, -1), slots_of([2, 0], range(5)), BS).bfloat16()
    assert torch.equal(out[0, :5], want) and (out[0, 5] == 0).all()


def combine(topk_indices, qsl, seq_lens, gather_lens, *, window, ratio, topk, M, N, width=8):
    out = (torch.zeros(topk_indices.shape[0], width, dtype=torch.int32), torch.zeros(topk_indices.shape[0], dtype=torch.int32))
    return triton_ops.combine_topk_swa_indices(topk_indices, qsl, seq_lens, gather_lens, window, ratio, topk, M, N, out)


def test_combine_swa_only_indexes_the_gathered_window_per_request() -> None:
    # request 0: positions 3, 4 of 5 (prefix 3, gathered from position 1); request 1: positions 0, 1
    # of 2; query_start_loc is a slice of the batch's (rebased to its first entry)
    qsl = torch.tensor([3, 5, 7], dtype=torch.int32)
    idx, lens = combine(torch.zeros(4, 0, dtype=torch.int32), qsl, torch.tensor([5, 2], dtype=torch.int32),
                        torch.tensor([4, 2], dtype=torch.int32), window=3, ratio=1, topk=0, M=8, N=0)
    assert lens.tolist() == [3, 3, 1, 2]
    assert idx.tolist() == [
        [0, 1, 2, -1, -1, -1, -1, -1],  # pos 3: positions 1..3, gathered from 1
        [1, 2, 3, -1, -1, -1, -1, -1],  # pos 4: positions 2..4
        [8, -1, -1, -1, -1, -1, -1, -1],  # request 1 (row block M=8), pos 0
        [8, 9, -1, -1, -1, -1, -1, -1],  # pos 1
    ]


def test_combine_puts_min_pos_plus_one_over_ratio_topk_entries_first() -> None:
    # one request of 9 tokens, queries at positions 6..8, ratio 4, top-k 2, window 2, the
    # compressed rows first in the buffer (N=3), row block M=16
    topk = torch.tensor([[10, 11], [20, 21], [30, 31]], dtype=torch.int32)
    idx, lens = combine(topk, torch.tensor([0, 3], dtype=torch.int32), torch.tensor([9], dtype=torch.int32),
                        torch.tensor([4], dtype=torch.int32), window=2, ratio=4, topk=2, M=16, N=3)
    # pos 6: (6+1)//4 = 1 top-k entry; window 5..6 -> N + p - (9 - 4) = 3, 4
    # pos 7: 2 entries (8//4); window 6..7 -> 4, 5.  pos 8: 2 entries; window 7..8 -> 5, 6
    assert lens.tolist() == [3, 4, 4]
    assert idx[:, :4].tolist() == [[10, 3, 4, -1], [20, 21, 4, 5], [30, 31, 5, 6]]


def test_the_reference_ops_are_registered_with_written_arguments() -> None:
    assert set(reference.register_reference_kernels()) >= {"capturelint_vllm::dequantize_and_gather_k_cache",
                                                   "capturelint_vllm::combine_topk_swa_indices"}
    gather = torch.ops.capturelint_vllm.dequantize_and_gather_k_cache.default._schema
    assert [a.name for a in gather.arguments if a.alias_info is not None and a.alias_info.is_write] == ["out"]
    comb = torch.ops.capturelint_vllm.combine_topk_swa_indices.default._schema
    assert [a.name for a in comb.arguments if a.alias_info is not None and a.alias_info.is_write] == [
        "combined_indices", "combined_lens"]


def test_unsupported_variants_are_refused() -> None:
    with pytest.raises(NotImplementedError, match="FNUZ"):
        triton_ops.DequantizeAndGatherKCache()(None, None, None, None, None, BS, 0, use_fnuz=True)
    with pytest.raises(NotImplementedError, match="in-image"):
        triton_ops.CombineTopkSwaIndices()(None, None, None, None, None, None, 0, 0, TOP_K=0, COMPRESS_RATIO=1, WINDOW_SIZE=2,
                                  max_image_tokens=4)


def test_vllms_prefill_wrappers_with_the_references_give_windowed_attention() -> None:
    """vLLM's ``dequantize_and_gather_k_cache`` and ``combine_topk_swa_indices`` (their
    Python, our kernels, under ``cpu_shim``) and FlashMLA's ``flash_mla_sparse_fwd``,
    called as ``_forward_prefill`` calls them for two prefill requests, give each query
    softmax attention over the dequantized rows of its window."""
    require_vllm()
    from capturelint.adapters.vllm.install import cpu_shim

    window, heads, scale = 3, 2, 0.05
    cache = filled_cache(4, seed=2)
    block_table = torch.tensor([[3, 1], [0, 2]], dtype=torch.int32)
    seq_lens = torch.tensor([6, 3], dtype=torch.int32)
    query_lens = torch.tensor([2, 3], dtype=torch.int32)
    gather_lens = query_lens + (seq_lens - query_lens).clamp(max=window - 1)
    qsl = torch.tensor([0, 2, 5], dtype=torch.int32)
    q = (torch.randn(5, heads, 512, generator=torch.Generator().manual_seed(3))).bfloat16()
    with cpu_shim():
        from vllm.models.deepseek_v4.common.ops import combine_topk_swa_indices, dequantize_and_gather_k_cache
        from vllm.models.deepseek_v4.nvidia import flashmla

        M = int(gather_lens.max())
        kv = torch.zeros(2, M, 512, dtype=torch.bfloat16)
        dequantize_and_gather_k_cache(kv, cache, seq_lens=seq_lens, gather_lens=gather_lens, block_table=block_table,
                                      block_size=BS, offset=0)
        out_idx = torch.zeros(5, 128, dtype=torch.int32)
        out_lens = torch.zeros(5, dtype=torch.int32)
        idx, lens = combine_topk_swa_indices(torch.zeros(5, 0, dtype=torch.int32), qsl, seq_lens, gather_lens, window,
                                             1, 0, M, 0, out=(out_idx, out_lens))
        out = torch.zeros(5, heads, 512, dtype=torch.bfloat16)
        flashmla.flash_mla_sparse_fwd(q=q, kv=kv.view(-1, 1, 512), indices=idx.unsqueeze(1), sm_scale=scale,
                                      topk_length=lens, out=out)
    flat = cache.view(4, -1)
    t = 0
    for b in range(2):
        for i in range(int(query_lens[b])):
            pos = int(seq_lens[b] - query_lens[b]) + i
            rows = fp8_ds_mla.dequantize_fp8_ds_mla(flat, slots_of(block_table[b].tolist(), range(max(pos - window + 1, 0),
                                                                                          pos + 1)), BS)
            rows = rows.bfloat16().double()
            p = torch.softmax(q[t].double() @ rows.T * scale, dim=-1)
            assert torch.allclose(out[t].double(), p @ rows, atol=2e-2, rtol=2e-2), (b, i)
            t += 1
