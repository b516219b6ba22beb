"""The CPU references for what DeepSeek V4's compressed layers call
(``capturelint.adapters.vllm.kernels.compressed``).

Where vLLM 0.33.0's wheel has a torch implementation of the same semantics the
reference is checked against it: the paged MQA logits against
``fp8_paged_mqa_logits_torch`` (v1/attention/ops/rocm_aiter_mla_sparse.py), the decode
top-k against ``SparseIndexerTopk``'s ``torch`` back end, the short-context fill against
``DeepseekV4CPUIndexer._fill_short_context_topk`` (models/deepseek_v4/cpu/cpu_sparse.py),
the slot mappings against ``map_local_to_global_slots_cpu`` (cpu/cpu_utils.py), the
C128A indices against the dense top-k of ``DeepseekV4CPUAttention.forward_mqa`` and the
prefill MQA logits against ``fp8_mqa_logits_torch``; the prefill chunk metadata through
vLLM's own ``build_prefill_chunk_metadata``. The
compressor kernels (Triton, CuTe DSL and C++ in vLLM) and the index-q quantization are
checked against their definitions, computed here in float64. The registered ops are
what is called (``torch.ops``), so the schemas are exercised too.
"""

from __future__ import annotations

import types

import pytest
import torch
from vllm_required import require_vllm  # tests/vllm/vllm_required.py

vllm = require_vllm()

from capturelint.adapters.vllm.kernels import fp8_ds_mla
from capturelint.adapters.vllm.kernels import compressed as C

C.register()
ops = torch.ops.capturelint_vllm
EPS = 1e-6


def rope_cache(max_pos: int = 160, theta: float = 10000.0) -> torch.Tensor:
    inv_freq = theta ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq
    return torch.cat((angles.cos(), angles.sin()), dim=-1).float()


def rotate(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """GPT-J rotation of the last 64 dims, float64, by complex multiplication."""
    pairs = torch.view_as_complex(x[..., -64:].double().reshape(*x.shape[:-1], 32, 2).contiguous())
    turn = torch.polar(torch.ones_like(rows[..., :32].double()), torch.atan2(rows[..., 32:].double(),
                                                                              rows[..., :32].double()))
    return torch.cat((x[..., :-64].double(), torch.view_as_real(pairs * turn).reshape(*x.shape[:-1], 64)), dim=-1)


def assert_fp8_close(got: torch.Tensor, expected: torch.Tensor, scale: torch.Tensor) -> None:
    """e4m3 rounding of ``expected / scale``: half a step of 3 mantissa bits, or half
    the smallest subnormal (2^-9) for small values, times the scale."""
    bound = torch.maximum(expected.abs() * 2 ** -4, scale * 2 ** -10)
    assert bool(((got - expected).abs() <= bound).all()), (got - expected).abs().max()


# ------------------------------------------------------------------ compressor


def test_save_partial_states_writes_kv_and_score_plus_ape_and_skips_pads():
    g = torch.Generator().manual_seed(0)
    head, width, bs = 6, 8, 4
    state = torch.full((3, bs, 2 * width), 7.0)
    kv, score = torch.randn(3, head, generator=g), torch.randn(3, head, generator=g)
    ape = torch.randn(4, head, generator=g)
    positions = torch.tensor([5, 6, 7])
    ops.save_partial_states(kv, score, ape, positions, state, torch.tensor([9, -1, 2]), bs, width, 4)
    assert torch.equal(state[2, 1, :head], kv[0]) and torch.equal(state[0, 2, :head], kv[2])
    assert torch.equal(state[2, 1, width:width + head], score[0] + ape[1])  # position 5 -> ape row 1
    assert torch.equal(state[0, 2, width:width + head], score[2] + ape[3])
    untouched = torch.ones(3, bs, dtype=torch.bool)
    untouched[2, 1] = untouched[0, 2] = False
    assert bool((state[untouched] == 7.0).all())  # the pad (slot -1) wrote nothing
    assert bool((state[2, 1, head:width] == 7.0).all())  # only head dims of each half


def _states(ratio: int, head: int, positions: int, seed: int = 1):
    """A state cache whose rows hold known kv/score for positions 0..positions-1 of
    request 0, with a shuffled block table."""
    overlap = ratio == 4
    coff = 1 + overlap
    bs = 4 if ratio == 4 else 8
    nblocks = -(-positions // bs)
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn(positions, coff * head, generator=g)
    score = torch.randn(positions, coff * head, generator=g)
    table = torch.randperm(nblocks, generator=g).int()[None, :]
    state = torch.full((nblocks, bs, 2 * coff * head), float("nan"))
    p = torch.arange(positions)
    state[table[0, p // bs].long(), p % bs] = torch.cat((kv, score), dim=1)
    return state, table, bs, kv, score


def _compressed_row(kv, score, position, ratio, head, weight, csc):
    """The compressed, normed, roped row of the boundary at ``position`` (float64):
    ``(normed, roped)``."""
    window = (2 if ratio == 4 else 1) * ratio
    ks, ss = [], []
    for i, p in enumerate(range(position - window + 1, position + 1)):
        if p < 0:
            continue
        half = head if (ratio == 4 and i >= ratio) else 0
        ks.append(kv[p, half:half + head].double())
        ss.append(score[p, half:half + head].double())
    k, s = torch.stack(ks), torch.stack(ss)
    compressed = (torch.softmax(s, dim=0) * k).sum(0)
    normed = compressed / torch.sqrt(compressed.square().mean() + EPS) * weight.double()
    roped = rotate(normed[None], csc[position // ratio * ratio][None])[0]
    return normed, roped


@pytest.mark.parametrize("ratio, position", [(4, 3), (4, 11), (128, 127)])
def test_compress_head512_stores_the_softmax_pooled_normed_roped_row(ratio, position):
    head = 512
    state, table, bs, kv, score = _states(ratio, head, position + 1)
    csc = rope_cache()
    weight = (1 + 0.1 * torch.randn(head, generator=torch.Generator().manual_seed(3))).bfloat16()
    cache = torch.full((2, 4, 584), 0xAB, dtype=torch.uint8)
    positions = torch.tensor([position, position - 1])  # the second is no boundary
    ops.compress_norm_rope_store(state, torch.tensor([0, 0]), positions, torch.tensor([0, 0]), table, bs,
                                 state.shape[-1] // 2, csc, cache, torch.tensor([6, 1]), 2, head, 64, ratio,
                                 ratio == 4, weight, EPS)
    normed, roped = _compressed_row(kv, score, position, ratio, head, weight, csc)
    got = fp8_ds_mla.dequantize_fp8_ds_mla(cache.view(2, -1), torch.tensor([6]), 4)[0].double()
    torch.testing.assert_close(got[448:], roped[448:].bfloat16().double(), atol=0, rtol=2 ** -7)
    nope = normed[:448].bfloat16().double().reshape(7, 64)
    scale = 2.0 ** torch.ceil(torch.log2(nope.abs().amax(-1, keepdim=True) / 448))
    assert_fp8_close(got[:448].reshape(7, 64), nope, scale)
    assert cache.view(2, -1)[1, 576 * 4 + 2 * 8 + 7] == 0  # the scale pad byte
    assert bool((cache.view(2, -1)[0, 576:2 * 576] == 0xAB).all())  # slot 1 (no boundary) untouched


def test_compress_head128_stores_the_indexer_layout_and_skips_pads():
    head, ratio, position = 128, 4, 7
    state, table, bs, kv, score = _states(ratio, head, position + 1, seed=4)
    csc = rope_cache()
    weight = torch.ones(head).bfloat16()
    cache = torch.full((1, 8, 132), 0xAB, dtype=torch.uint8)
    ops.compress_norm_rope_store(state, torch.tensor([0, 0]), torch.tensor([position, position]),
                                 torch.tensor([0, -1]), table, bs, state.shape[-1] // 2, csc, cache,
                                 torch.tensor([3, 4]), 2, head, 64, ratio, True, weight, EPS)
    _, roped = _compressed_row(kv, score, position, ratio, head, weight, csc)
    flat = cache.view(-1)
    values = flat[3 * 128:4 * 128].view(torch.float8_e4m3fn).double()
    scale = flat[8 * 128 + 3 * 4:8 * 128 + 4 * 4].view(torch.float32).double()
    expected = roped.bfloat16().double()
    assert scale.item() == 2.0 ** torch.ceil(torch.log2(expected.abs().max() / 448)).item()
    assert_fp8_close(values * scale, expected, scale)
    assert bool((flat[4 * 128:5 * 128] == 0xAB).all())  # token 1's state slot was -1


def test_compress_reads_pad_past_a_shorter_compressed_slot_view():
    """V2 PIECEWISE: the state slots span the padded tokens, the compressed slot mapping
    the real ones (``out[:num_tokens]`` of a buffer filled with PAD): a token past the
    view stores nothing, as the kernel reading PAD there."""
    head, ratio, position = 128, 4, 7
    state, table, bs, *_ = _states(ratio, head, position + 1, seed=5)
    cache = torch.full((1, 8, 132), 0xAB, dtype=torch.uint8)
    ops.compress_norm_rope_store(state, torch.tensor([0, 0]), torch.tensor([position, position]),
                                 torch.tensor([0, 1]), table, bs, state.shape[-1] // 2, rope_cache(), cache,
                                 torch.tensor([3]), 2, head, 64, ratio, True, torch.ones(head).bfloat16(), EPS)
    flat = cache.view(-1)
    assert not bool((flat[3 * 128:4 * 128] == 0xAB).all())  # token 0: stored at slot 3
    assert bool((flat[:3 * 128] == 0xAB).all()) and bool((flat[4 * 128:8 * 128] == 0xAB).all())  # nothing else


def test_a_kernels_pointer_arguments_address_the_whole_buffer():
    """``addressable``: what a kernel given a view as a pointer can read (the rows of the
    buffer from the view's offset), outside any dispatch mode."""
    buffer = torch.arange(40, dtype=torch.int32).view(10, 4)
    view = buffer[2:3]
    got = C.addressable(view)
    assert got.shape == (8, 4) and got.data_ptr() == view.data_ptr() and torch.equal(got, buffer[2:])
    flat = torch.arange(16)
    assert torch.equal(C.addressable(flat[:3]), flat)


# --------------------------------------------------------------------- indexer


def test_index_q_rope_quant_folds_the_scale_into_the_weights():
    g = torch.Generator().manual_seed(5)
    q = (torch.randn(3, 4, 128, generator=g) * 3).bfloat16()
    weights = torch.randn(3, 4, generator=g).bfloat16()
    positions = torch.tensor([0, 17, 130])
    csc = rope_cache()
    q8, w = ops.fused_indexer_q_rope_quant(positions, q, csc, weights, 0.125, 0.5)
    assert q8.dtype == torch.float8_e4m3fn and w.dtype == torch.float32
    x = torch.cat((q[..., :64].double(), rotate(q, csc[positions][:, None]).bfloat16().double()[..., 64:]), -1)
    scale = 2.0 ** torch.ceil(torch.log2(x.abs().amax(-1) / 448))
    assert_fp8_close(q8.double() * scale[..., None], x, scale[..., None])
    assert torch.equal(w.double(), weights.double() * scale * 0.125 * 0.5)


def _indexer_cache(blocks: int, bs: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    cache = torch.empty(blocks, bs, 1, 132, dtype=torch.uint8)
    flat = cache.view(blocks, -1)
    flat[:, :bs * 128] = (torch.randn(blocks, bs * 128, generator=g) * 50).to(torch.float8_e4m3fn).view(torch.uint8)
    scales = torch.ldexp(torch.ones(blocks, bs), torch.randint(-6, -2, (blocks, bs), generator=g))
    flat[:, bs * 128:] = scales.view(torch.uint8)
    return cache


def test_paged_mqa_logits_match_vllms_torch_implementation():
    from vllm.v1.attention.ops.rocm_aiter_mla_sparse import fp8_paged_mqa_logits_torch

    g = torch.Generator().manual_seed(6)
    cache = _indexer_cache(5, 4, 7)
    q = (torch.randn(2, 1, 4, 128, generator=g) * 20).to(torch.float8_e4m3fn)
    weights = torch.randn(2, 4, generator=g)
    lens = torch.tensor([[7], [12]], dtype=torch.int32)
    table = torch.tensor([[3, 0, 4, 1], [2, 4, 1, 0]], dtype=torch.int32)
    ours = C.fp8_fp4_paged_mqa_logits_dropin((q, None), cache, weights, lens, table, None, 16)
    theirs = fp8_paged_mqa_logits_torch(q, cache, weights, lens, table, 16)
    for row, n in enumerate((7, 12)):
        torch.testing.assert_close(ours[row, :n], theirs[row, :n], rtol=1e-5, atol=1e-4)
        assert bool((ours[row, n:] == float("-inf")).all())


def test_top_k_matches_vllms_torch_backend_and_selects_short_rows_in_order():
    from vllm.model_executor.layers.indexer_topk import SparseIndexerTopk

    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(8))
    seq_lens = torch.tensor([[40], [33], [5]], dtype=torch.int32)
    ours = torch.full((3, 8), 99, dtype=torch.int32)
    torch.ops._C.top_k_per_row_decode(logits, 1, seq_lens, ours, 3, logits.stride(0), logits.stride(1), 8)
    theirs = torch.empty(3, 8, dtype=torch.int32)
    SparseIndexerTopk("torch").forward(logits, seq_lens, 1, theirs, 8, 40)
    assert torch.equal(ours[:2], theirs[:2])  # long rows: the 8 largest, largest first
    assert ours[2].tolist() == [0, 1, 2, 3, 4, -1, -1, -1]  # a short row: every column, in order
    assert set(theirs[2, :5].tolist()) == set(range(5)) and theirs[2, 5:].tolist() == [-1, -1, -1]


# ------------------------------------------------------------- indexer prefill


def test_mqa_logits_match_vllms_torch_implementation_from_each_rows_start():
    """DeepGEMM's non-paged logits are compressed: row ``i`` holds K ``[ks[i], ke[i])``
    from column 0 (utils/deep_gemm.py:665-668); vLLM's torch version returns them in
    place (``fp8_mqa_logits_torch``, ``[M, N]``)."""
    from vllm.v1.attention.ops.rocm_aiter_mla_sparse import fp8_mqa_logits_torch

    g = torch.Generator().manual_seed(9)
    q = (torch.randn(3, 4, 128, generator=g) * 20).to(torch.float8_e4m3fn)
    k = (torch.randn(9, 128, generator=g) * 20).to(torch.float8_e4m3fn)
    scale = torch.ldexp(torch.ones(9), torch.randint(-6, -2, (9,), generator=g))
    weights = torch.randn(3, 4, generator=g)
    ks, ke = torch.tensor([0, 0, 4], dtype=torch.int32), torch.tensor([2, 4, 9], dtype=torch.int32)
    ours = C.fp8_fp4_mqa_logits_dropin((q, None), (k, scale), weights, ks, ke, 5)
    theirs = fp8_mqa_logits_torch(q, (k, scale), weights, ks, ke)
    for row in range(3):
        n = int(ke[row] - ks[row])
        # vLLM's torch version rounds each q.k to bf16 (its einsum runs in bf16); DeepGEMM accumulates in fp32
        torch.testing.assert_close(ours[row, :n], theirs[row, int(ks[row]):int(ke[row])], rtol=2 ** -7, atol=1e-3)
        assert bool((ours[row, n:] == float("-inf")).all())


def test_top_k_prefill_picks_the_largest_in_each_rows_range_and_short_rows_in_order():
    logits = torch.randn(2, 40, generator=torch.Generator().manual_seed(10))
    starts, ends = torch.zeros(2, dtype=torch.int32), torch.tensor([40, 5], dtype=torch.int32)
    out = torch.full((2, 8), 99, dtype=torch.int32)
    torch.ops._C.top_k_per_row_prefill(logits, starts, ends, out, 2, logits.stride(0), logits.stride(1), 8)
    assert out[0].tolist() == torch.topk(logits[0], 8).indices.tolist()  # largest first
    assert out[1].tolist() == [0, 1, 2, 3, 4, -1, -1, -1]


def test_cp_gather_lays_each_requests_entries_out_contiguously():
    cache = _indexer_cache(5, 4, 11)
    flat = cache.view(5, -1)
    table = torch.tensor([[3, 1], [2, 0]], dtype=torch.int32)
    cu = torch.tensor([0, 6, 9], dtype=torch.int32)
    k = torch.zeros(9, 128, dtype=torch.float8_e4m3fn)
    scale = torch.zeros(9, 4, dtype=torch.uint8)
    torch.ops._C_cache_ops.cp_gather_indexer_k_quant_cache(cache, k, scale, table, cu)
    for row, (req, t) in enumerate([(0, t) for t in range(6)] + [(1, t) for t in range(3)]):
        block, offset = int(table[req, t // 4]), t % 4
        assert torch.equal(k[row].view(torch.uint8), flat[block, offset * 128:(offset + 1) * 128])
        assert torch.equal(scale[row], flat[block, 4 * 128 + offset * 4:4 * 128 + offset * 4 + 4])


def test_prefill_chunk_metadata_through_vllms_builder_function(monkeypatch):
    import vllm.v1.attention.backends.mla.indexer as indexer

    monkeypatch.setattr(indexer, "_BUILD_PREFILL_CHUNK_METADATA_KERNEL", C.BuildPrefillChunkMetadataKernel())
    # two prefills at ratio 4: positions 7..9 (10 tokens in all) and 0..5
    qsl = torch.tensor([0, 3, 9], dtype=torch.int32)
    seq_lens = torch.tensor([10, 6], dtype=torch.int32)
    compressed = seq_lens // 4
    chunk = indexer.build_prefill_chunk_metadata(0, 2, qsl, qsl.clone(), seq_lens, compressed, compressed.clone(),
                                                 torch.zeros(2, 1, dtype=torch.int32), 4)
    assert chunk.total_seq_lens == 3 and chunk.token_to_seq.tolist() == [0, 0, 1]
    # each token sees its request's entries that its position closed: (pos + 1) // 4
    assert chunk.cu_seqlen_ks.tolist() == [0, 0, 0, 2, 2, 2, 2, 2, 2]
    assert chunk.cu_seqlen_ke.tolist() == [2, 2, 2, 2, 2, 2, 3, 3, 3]
    empty = indexer.build_prefill_chunk_metadata(1, 2, qsl, qsl.clone(), torch.tensor([10, 3], dtype=torch.int32),
                                                 torch.tensor([2, 0], dtype=torch.int32),
                                                 torch.tensor([2, 0], dtype=torch.int32),
                                                 torch.zeros(2, 1, dtype=torch.int32), 4)
    assert empty is None  # a prefill with no compressed entry yet: no chunk, no kernel


def test_short_context_fill_matches_vllms_cpu_indexer():
    from vllm.models.deepseek_v4.cpu.cpu_sparse import DeepseekV4CPUIndexer

    positions = torch.tensor([2, 9, 40, 130])
    ours = torch.full((6, 16), 99, dtype=torch.int32)
    C.FillShortContextKernel()[(4,)](ours, positions, TOP_K=16, COMPRESS_RATIO=4, PADDED_TOP_K=16, num_warps=8)
    theirs = torch.full((6, 16), 99, dtype=torch.int32)
    owner = types.SimpleNamespace(topk_indices_buffer=theirs, topk_tokens=16, compress_ratio=4)
    DeepseekV4CPUIndexer._fill_short_context_topk(owner, positions, 4)
    assert torch.equal(ours, theirs)
    assert bool((ours[4:] == 99).all())  # rows past the launch untouched


# ------------------------------------------------------------------ metadata


def test_global_topk_slots_match_vllms_cpu_mapping_and_count_valid_entries():
    from vllm.models.deepseek_v4.cpu.cpu_utils import map_local_to_global_slots_cpu

    local = torch.tensor([[0, 5, -1, 3], [7, -1, -1, -1], [1, 2, 3, 4]], dtype=torch.int32)
    req = torch.tensor([1, 0, 1], dtype=torch.int32)
    table = torch.tensor([[4, 2], [3, 6]], dtype=torch.int32)
    slots, lens = torch.empty_like(local), torch.empty(3, dtype=torch.int32)
    C.ComputeGlobalTopkKernel()(slots, lens, local, req, table, 4, torch.tensor([True, True, False]))
    assert torch.equal(slots.long(), map_local_to_global_slots_cpu(local, req, table, 4))
    assert lens.tolist() == [3, 1, 0]  # a token that is not valid attends to nothing compressed


def test_c128a_indices_match_the_dense_topk_of_vllms_cpu_attention():
    from vllm.models.deepseek_v4.cpu.cpu_utils import map_local_to_global_slots_cpu

    positions = torch.tensor([126, 127, 300, 5, 260])
    req = torch.tensor([0, 1, 1, 0, 1], dtype=torch.int32)
    table = torch.tensor([[5, 1], [2, 7]], dtype=torch.int32)
    decode, lens, prefill = (torch.full((8, 128), 99, dtype=torch.int32), torch.full((8,), 99, dtype=torch.int32),
                             torch.full((8, 128), 99, dtype=torch.int32))
    slot_mapping = torch.tensor([10, -1, 12, 13, 14])
    C.BuildC128AKernel()(decode, lens, prefill, positions, 128, 128, 3, req, table, 2, slot_mapping)
    width = 128
    n = torch.div(positions + 1, 128, rounding_mode="floor")
    k = torch.arange(width)
    local = torch.where(k[None] < n[:, None], k[None], -1)  # cpu_sparse.py forward_mqa's C128A top-k
    assert torch.equal(decode[:3].long(), map_local_to_global_slots_cpu(local[:3], req[:3], table, 2))
    assert lens[:3].tolist() == [0, 0, 2]  # token 1's slot is -1: nothing to attend
    assert torch.equal(prefill[:2], local[3:].int())
    assert bool((decode[3:] == 99).all()) and bool((prefill[2:] == 99).all())


def test_compressed_slot_mapping_through_vllms_wrapper(monkeypatch):
    import vllm.v1.attention.backends.mla.compressor_utils as cu

    monkeypatch.setattr(cu, "_COMPRESSED_SLOT_MAPPING_KERNEL", C.CompressedSlotMappingKernel())
    # request 0: a 6-token extend from position 1 (positions 1..6); request 1: a decode at 11
    query_start_loc = torch.tensor([0, 6, 7], dtype=torch.int32)
    seq_lens = torch.tensor([7, 12], dtype=torch.int32)
    slot_mapping = torch.tensor([1, 2, 3, 4, -1, 6, 40])  # position 5 is a PAD token
    table = torch.tensor([[3, 9], [5, 1]], dtype=torch.int32)
    out = torch.full((10,), 77, dtype=torch.int64)
    got = cu.get_compressed_slot_mapping(7, slot_mapping, query_start_loc, seq_lens, table, 2, 4, out=out)
    # boundaries: position 3 (req 0, entry 0 -> block 3, slot 6) and 11 (req 1, entry 2 -> block 1, slot 2)
    assert got.tolist() == [-1, -1, 6, -1, -1, -1, 2]
    assert out[7:].tolist() == [-1, -1, -1]  # the wrapper clears the whole buffer
    # V2 pads the slot mapping past the metadata's token count: the kernel reads query tokens only
    padded = torch.cat((slot_mapping, torch.tensor([-1, -1, -1])))
    again = cu.get_compressed_slot_mapping(7, padded, query_start_loc, seq_lens, table, 2, 4, out=out)
    assert again.tolist() == [-1, -1, 6, -1, -1, -1, 2]


def test_mm_with_an_fp32_output_dtype_runs_on_cpu():
    a = torch.randn(3, 8).bfloat16()
    b = torch.randn(8, 5).bfloat16()
    out = torch.mm(a, b, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, a.float() @ b.float())
