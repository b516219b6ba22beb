"""CPU references, in plain torch, for the fused Triton kernels DeepSeek V3.2's attention
(``vllm/models/deepseek_v32``) calls in its captured code, where DeepSeek V4 calls others.

The indexer's top-k (``sparse_attn_indexer``: the paged and ragged MQA logits, the
per-row top-k, the gather of the indexer cache) is the same code as DeepSeek V4's, over
the same indexer cache layout, and keeps ``kernels.compressed``'s references; the
sparse attention is ``kernels.flashmla``'s. What V3.2 adds, written from the kernels in
the vLLM 0.33.0 wheel (``models/deepseek_v32/common/kernels.py``,
``model_executor/layers/fused_embed_norm.py``), not copied:

``fused_embed_norm`` (``_fused_embed_norm_kernel``)
    ``out = table[ids]``; with a chained weight also ``normed = bf16(x * rsqrt(mean(x^2)
    + eps) * w)`` in fp32 (the first layer's ``input_layernorm``).
``fused_norm_rope`` (``_fused_norm_rope_kernel``), per token ``t`` of ``positions``
    ``q_c_out = rms(q_c) * w`` (every row); ``kv_c_out = rms(kv_c) * w`` and the GPT-J
    RoPE of ``k_pe`` at ``positions[t]`` into ``k_pe_out`` (every row when the outputs
    are given); the top-k buffer's first ``T`` rows set to -1 (indexer layers). Where the
    slot mapping is given and ``slot[t] >= 0``: the MLA cache row ``[kv_normed |
    k_pe_roped]`` at the slot (op ``capturelint_vllm::mla_cache_insert``, bf16 cache),
    and the indexer K (LayerNorm with bias, RoPE on its first 64 dims: NeoX halves, or
    interleaved pairs for GLM; UE8M0 fp8 with one fp32 scale ``2^ceil(log2(max(amax,
    1e-4) / 448))`` per row) at the indexer slot (op
    ``capturelint_vllm::indexer_k_insert``; per block ``[bs*128 fp8 | bs*4 fp32]``).
``_C_cache_ops::concat_mla_q`` (``ops.concat_mla_q``, FlashMLA sparse's query)
    ``q_out[:, :H] = [ql_nope | q_pe]``, the other heads of the head-padded buffer left.
``req_index_to_global`` (``_CONVERT_REQ_INDEX_TO_GLOBAL_INDEX_KERNEL``, v1/attention/backends/mla/sparse_utils.py)
    A token's request-local top-k index ``i >= 0`` -> its cache slot
    ``block_table[req, i // bs] * stride_rows + i % bs`` (a prefill token's: its
    workspace row), -1 otherwise; with valid counts, the valid ones first.
``fused_q`` (``_fused_q_kernel``, the bf16 query path FlashMLA sparse takes)
    the GPT-J RoPE of each head of ``q_pe``; the indexer q per head: RoPE on its first
    64 dims as above, fp8 with its own UE8M0 scale, and the weights
    ``w * scale * softmax_scale * head_scale`` in fp32.

The cache writes are ops (their written argument annotated ``Tensor(a!)``) because
which rows they write depends on the slot mapping's values: a tracer records one op per
launch and a replay calls it again on the step's slots. The rest is shape-static torch.

Limits (a one-line ``NotImplementedError``): the bf16 MLA cache (``auto``; not fp8,
``fp8_ds_mla`` or ``nvfp4_ds_mla``), the indexer cache's plain (not shuffled) layout with
fp32 scales (not MX), the bf16 MQA query (``quantize_mqa=False``).
"""

from __future__ import annotations

from typing import Any

import torch

from capturelint.adapters.vllm.kernels.compressed import addressable
from capturelint.adapters.vllm.kernels.fp8_ds_mla import apply_gptj_rope, ceil_log2
from capturelint.adapters.vllm.kernels.library import Impls, no_result_fake, own_op, register_ops

FP8_MAX = 448.0
AMAX_FLOOR = 1e-4
SCALE_BYTES = 4  # one fp32 scale per indexer row


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * rsqrt(mean(x^2) + eps) * w`` in fp32, as the kernels' ``_rms_norm``."""
    x = x.float()
    return x * torch.rsqrt(x.square().sum(dim=-1, keepdim=True) / x.shape[-1] + eps) * w.float()


def fused_embed_norm(input_ids: torch.Tensor, embed_table: torch.Tensor, chain_weight: torch.Tensor | None = None,
                     eps: float = 0.0) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for ``fused_embed_norm``: the rows, and with ``chain_weight`` their norm."""
    out = embed_table[input_ids.view(-1)]
    if chain_weight is None:
        return out
    return out, _rms(out, chain_weight, eps).to(out.dtype)


def _rope_head(x: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor, interleave: bool) -> torch.Tensor:
    """RoPE of the first ``cos_sin_cache.shape[-1]`` dims of fp32 ``x [T, ..., D]`` (the
    indexer's): interleaved pairs, or NeoX halves; the rest as it is."""
    rot = cos_sin_cache.shape[-1]
    half = rot // 2
    rows = cos_sin_cache.float()[positions.long()]
    shape = (rows.shape[0],) + (1,) * (x.dim() - 2) + (half,)
    cos, sin = rows[:, :half].reshape(shape), rows[:, half:].reshape(shape)
    part = x[..., :rot]
    if interleave:
        roped = apply_gptj_rope(part, cos, sin)
    else:
        a, b = part[..., :half], part[..., half:]
        roped = torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)
    return torch.cat((roped, x[..., rot:]), dim=-1)


def _ue8m0_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of fp32 ``x``: e4m3 values ``x / scale`` and the fp32 scale
    ``2^ceil(log2(max(amax, 1e-4) / 448))``."""
    amax = x.abs().amax(dim=-1).clamp_min(AMAX_FLOOR)
    scale = torch.ldexp(torch.ones_like(amax), ceil_log2(amax / FP8_MAX))
    return (x / scale[..., None]).to(torch.float8_e4m3fn), scale


def mla_cache_insert(kv_normed: torch.Tensor, k_pe_roped: torch.Tensor, slot_mapping: torch.Tensor,
                     kv_cache: torch.Tensor) -> None:
    """Row ``[kv_normed[t] | k_pe_roped[t]]`` of the bf16 MLA cache at ``slot[t] >= 0``."""
    n = kv_normed.shape[0]
    slots = slot_mapping[:n].long()
    keep = slots >= 0
    bs = kv_cache.shape[1]
    slots = slots[keep]
    rows = torch.cat((kv_normed[keep], k_pe_roped[keep]), dim=-1).to(kv_cache.dtype)
    kv_cache[torch.div(slots, bs, rounding_mode="floor"), slots % bs] = rows


def indexer_k_insert(index_k: torch.Tensor, gate: torch.Tensor, slot_mapping: torch.Tensor,
                     kv_cache: torch.Tensor) -> None:
    """Indexer K rows ``index_k[t]`` (fp32) as fp8 + scale where ``gate[t] >= 0`` (the
    MLA slot) and ``slot[t] >= 0``, into ``kv_cache [blocks, bs, 132]`` (uint8)."""
    n = index_k.shape[0]
    slots = slot_mapping[:n].long()
    keep = (gate[:n] >= 0) & (slots >= 0)
    values, scale = _ue8m0_fp8(index_k[keep].float())
    slots = slots[keep]
    bs, dim = kv_cache.shape[1], index_k.shape[-1]
    flat = kv_cache.view(kv_cache.shape[0], -1)
    block = torch.div(slots, bs, rounding_mode="floor")
    offset = slots - block * bs
    cols = torch.arange(dim, device=flat.device)
    flat[block[:, None], offset[:, None] * dim + cols] = values.view(torch.uint8)
    scale_cols = bs * dim + offset[:, None] * SCALE_BYTES + torch.arange(SCALE_BYTES, device=flat.device)
    flat[block[:, None], scale_cols] = scale[:, None].contiguous().view(torch.uint8)


def concat_mla_q(ql_nope: torch.Tensor, q_pe: torch.Tensor, q_out: torch.Tensor) -> None:
    """``q_out[:, :H] = [ql_nope | q_pe]`` per head (``q_out`` may have more heads: the
    backend's head-padded buffer, whose other heads are left as they are)."""
    heads, nope = ql_nope.shape[1], ql_nope.shape[2]
    q_out[:, :heads, :nope] = ql_nope
    q_out[:, :heads, nope:nope + q_pe.shape[2]] = q_pe


def req_index_to_global(req_id: torch.Tensor, block_table: torch.Tensor, token_indices: torch.Tensor,
                        out: torch.Tensor, valid_counts: torch.Tensor | None, prefill_request_ids: torch.Tensor | None,
                        workspace_starts: torch.Tensor | None, idx_mapping: torch.Tensor | None, block_size: int,
                        block_stride_rows: int, compact: bool) -> None:
    """Per request-local index ``i >= 0`` of token ``t``: the slot
    ``block_table[req, i // block_size] * block_stride_rows + i % block_size`` (-1 for
    ``i < 0`` or a block past the table); a prefill token (``prefill_request_ids[t] >= 0``)
    its workspace row ``workspace_starts[p] + i`` instead. ``compact``: the valid ones
    moved to the front in their order, -1 after; ``valid_counts[t]`` their count."""
    n, k = token_indices.shape
    req = req_id[:n].long()
    if idx_mapping is not None:
        req = idx_mapping.long()[req].clamp_min(0)
    tok = token_indices.long()
    block = torch.div(tok, block_size, rounding_mode="floor")
    valid = (tok >= 0) & (block < block_table.shape[1])
    base = block_table.long()[req[:, None], block.clamp(0, block_table.shape[1] - 1)]
    value = base * block_stride_rows + tok % block_size
    if prefill_request_ids is not None and workspace_starts is not None:
        p = prefill_request_ids[:n].long()
        prefill = p >= 0
        starts = workspace_starts.long()[p.clamp_min(0)]
        value = torch.where(prefill[:, None], starts[:, None] + tok, value)
        valid = (tok >= 0) & (valid | prefill[:, None])
    value = torch.where(valid, value, -1)
    if compact:
        order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices
        value = value.gather(1, order)
    out.copy_(value.to(out.dtype))
    if valid_counts is not None:
        valid_counts.copy_(valid.sum(dim=1).to(valid_counts.dtype))


class ReqIndexToGlobalKernel:
    """Stands in for ``_CONVERT_REQ_INDEX_TO_GLOBAL_INDEX_KERNEL`` (its ``__call__``),
    without decode context parallelism."""

    def __call__(self, req_id, block_table, token_indices, out, valid_counts, prefill_workspace_request_ids,
                 prefill_workspace_starts, idx_mapping, *, workspace_rank_stride, max_num_blocks_per_req, BLOCK_SIZE,
                 BLOCK_STRIDE_ROWS, BLOCK_N, NUM_TOPK_TOKENS, HAS_PREFILL_WORKSPACE, HAS_IDX_MAPPING, COUNT_VALID,
                 COMPACT_TO_FRONT, DCP_SIZE, DCP_RANK, DCP_INTERLEAVE) -> None:
        if DCP_SIZE != 1:
            raise NotImplementedError("convert_req_index_to_global_index: decode context parallelism is not covered")
        prefill = (prefill_workspace_request_ids, prefill_workspace_starts) if HAS_PREFILL_WORKSPACE else (None, None)
        own_op("req_index_to_global", IMPLS)(req_id, block_table, token_indices, out,
                                             valid_counts if COUNT_VALID else None, *prefill, idx_mapping,
                                             int(BLOCK_SIZE), int(BLOCK_STRIDE_ROWS), bool(COMPACT_TO_FRONT))


IMPLS: Impls = {
    "capturelint_vllm::req_index_to_global": (
        "(Tensor req_id, Tensor block_table, Tensor token_indices, Tensor(a!) out, Tensor(b!)? valid_counts, "
        "Tensor? prefill_request_ids, Tensor? workspace_starts, Tensor? idx_mapping, int block_size, "
        "int block_stride_rows, bool compact) -> ()", req_index_to_global, no_result_fake),
    "_C_cache_ops::concat_mla_q": ("(Tensor ql_nope, Tensor q_pe, Tensor(a!) q_out) -> ()", concat_mla_q,
                                   no_result_fake),
    "capturelint_vllm::mla_cache_insert": ("(Tensor kv_normed, Tensor k_pe_roped, Tensor slot_mapping, "
                                           "Tensor(a!) kv_cache) -> ()", mla_cache_insert, no_result_fake),
    "capturelint_vllm::indexer_k_insert": ("(Tensor index_k, Tensor gate, Tensor slot_mapping, "
                                           "Tensor(a!) kv_cache) -> ()", indexer_k_insert, no_result_fake),
}


def fused_norm_rope(positions: torch.Tensor, q_c: torch.Tensor, q_rms_norm_w: torch.Tensor, q_rms_eps: float,
                    kv_c: torch.Tensor, kv_rms_norm_w: torch.Tensor, kv_rms_eps: float, k_pe: torch.Tensor,
                    k_rope_cos_sin_cache: torch.Tensor, index_k: torch.Tensor | None,
                    index_k_layer_norm_w: torch.Tensor | None, index_k_layer_norm_bias: torch.Tensor | None,
                    index_k_layer_norm_eps: float, index_k_rope_cos_sin_cache: torch.Tensor | None,
                    topk_indices_buffer: torch.Tensor, slot_mapping: torch.Tensor | None = None,
                    indexer_slot_mapping: torch.Tensor | None = None, indexer_k_cache: torch.Tensor | None = None,
                    indexer_cache_shuffled: bool = False, mla_kv_cache: torch.Tensor | None = None,
                    mla_kv_cache_dtype: str = "auto", mla_k_scale: torch.Tensor | None = None,
                    has_indexer: bool = True, index_rope_interleave: bool = False,
                    q_c_out: torch.Tensor | None = None, kv_c_out: torch.Tensor | None = None,
                    k_pe_out: torch.Tensor | None = None, index_k_out: torch.Tensor | None = None,
                    skip_scale: bool = False) -> torch.Tensor:
    """Drop-in for ``fused_norm_rope`` (see the module docstring)."""
    if mla_kv_cache is not None and mla_kv_cache_dtype not in ("auto", "bfloat16"):
        raise NotImplementedError(f"fused_norm_rope: the reference covers the bf16 MLA cache, not "
                                  f"{mla_kv_cache_dtype}")
    if indexer_k_cache is not None and indexer_cache_shuffled:
        raise NotImplementedError("fused_norm_rope: the reference covers the plain indexer cache layout, not shuffled")
    n = positions.shape[0]
    if indexer_k_cache is None and mla_kv_cache is None:
        slot_mapping = None
    q = _rms(q_c, q_rms_norm_w, q_rms_eps)
    if q_c_out is None:
        q_c_out = torch.empty_like(q_c)
    q_c_out.copy_(q.to(q_c_out.dtype))
    if has_indexer:
        topk_indices_buffer[:n].fill_(-1)
    kv = _rms(kv_c, kv_rms_norm_w, kv_rms_eps)
    half = k_rope_cos_sin_cache.shape[-1] // 2
    rows = k_rope_cos_sin_cache.float()[positions.long()]
    pe = apply_gptj_rope(k_pe.float(), rows[:, :half], rows[:, half:])
    if kv_c_out is not None:
        kv_c_out.copy_(kv.to(kv_c_out.dtype))
    if k_pe_out is not None:
        k_pe_out.copy_(pe.to(k_pe_out.dtype))
    if slot_mapping is not None:
        slots = addressable(slot_mapping)
        if mla_kv_cache is not None:
            own_op("mla_cache_insert", IMPLS)(kv, pe, slots, mla_kv_cache)
        if has_indexer and index_k is not None:
            assert index_k_layer_norm_w is not None and index_k_layer_norm_bias is not None
            assert index_k_rope_cos_sin_cache is not None
            x = index_k.float()
            mean = x.mean(dim=-1, keepdim=True)
            var = (x - mean).square().mean(dim=-1, keepdim=True)
            normed = (x - mean) * torch.rsqrt(var + index_k_layer_norm_eps) * index_k_layer_norm_w.float() \
                + index_k_layer_norm_bias.float()
            k = _rope_head(normed, index_k_rope_cos_sin_cache, positions, index_rope_interleave)
            if index_k_out is not None:
                index_k_out.copy_(k.to(index_k_out.dtype))  # every row (the kernel skips those without a slot)
            if indexer_k_cache is not None:
                islots = slots if indexer_slot_mapping is None else addressable(indexer_slot_mapping)
                own_op("indexer_k_insert", IMPLS)(k, slots, islots, indexer_k_cache.view(torch.uint8))
    elif has_indexer and index_k is not None and index_k_out is not None:
        raise NotImplementedError("fused_norm_rope: the reference does not cover index_k_out without a slot mapping")
    return q_c_out


def fused_q(positions: torch.Tensor, q_pe: torch.Tensor, q_pe_cos_sin_cache: torch.Tensor,
            index_q: torch.Tensor | None, index_q_cos_sin_cache: torch.Tensor | None, ql_nope: torch.Tensor,
            q_scale: torch.Tensor, index_weights: torch.Tensor | None, index_weights_softmax_scale: float,
            index_weights_head_scale: float, has_indexer: bool = True, index_rope_interleave: bool = False,
            quantize_mqa: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drop-in for ``fused_q`` (bf16 MQA query; see the module docstring)."""
    if quantize_mqa:
        raise NotImplementedError("fused_q: the reference covers the bf16 MQA query (FlashMLA sparse), not fp8")
    half = q_pe_cos_sin_cache.shape[-1] // 2
    rows = q_pe_cos_sin_cache.float()[positions.long()]
    mqa_q = apply_gptj_rope(q_pe.float(), rows[:, None, :half], rows[:, None, half:]).to(q_pe.dtype)
    if not has_indexer or index_q is None or index_weights is None:
        return (torch.empty((1, 1, 1), dtype=torch.float8_e4m3fn, device=q_pe.device),
                torch.empty((1, 1), dtype=torch.float32, device=q_pe.device), mqa_q)
    assert index_q_cos_sin_cache is not None
    x = _rope_head(index_q.float(), index_q_cos_sin_cache, positions, index_rope_interleave)
    index_q_fp8, scale = _ue8m0_fp8(x)
    weights = index_weights.float() * scale
    weights = weights * index_weights_softmax_scale
    weights = weights * index_weights_head_scale
    return index_q_fp8, weights, mqa_q


def install(patches: Any) -> None:
    """Bind the drop-ins in vLLM's DeepSeek V3.2 modules through ``patches``."""
    from vllm.model_executor.layers import fused_embed_norm as embed
    from vllm.models.deepseek_v32 import attention
    from vllm.models.deepseek_v32.nvidia import model

    register_ops(IMPLS)
    patches.set(embed, "fused_embed_norm", fused_embed_norm)
    patches.set(model, "fused_embed_norm", fused_embed_norm)
    patches.set(attention, "fused_norm_rope", fused_norm_rope)
    patches.set(attention, "fused_q", fused_q)
    from vllm.v1.attention.backends.mla import sparse_utils

    patches.set(sparse_utils, "_CONVERT_REQ_INDEX_TO_GLOBAL_INDEX_KERNEL", ReqIndexToGlobalKernel())
    import triton

    # vLLM's placeholder (Triton is disabled without a GPU driver) lacks the host helper
    # _remap_tiling reads, next_power_of_2; the installed package's is the one a GPU runs
    patches.set(sparse_utils, "triton", triton)


__all__ = ["IMPLS", "fused_embed_norm", "fused_norm_rope", "fused_q", "indexer_k_insert", "install",
           "mla_cache_insert"]
