"""CPU references, in plain torch, for the kernels DeepSeek V4's compressed layers call.

``kernels.fp8_ds_mla`` covers what a sliding-window layer (compress ratio 1) reaches. A
compressed-sparse layer (ratio 4: compressor plus indexer) and a heavily compressed
layer (ratio 128: compressor) reach more, on the decode path with metadata and on the
capture paths. Each entry below is written from the kernel's code or docstring in the
vLLM 0.33.0 wheel (paths relative to ``vllm/``), not copied; each is registered as a
``torch.ops`` op with its written arguments annotated (``Tensor(a!)``), so a tracer
sees one op per launch, and reached through a **drop-in** with the call signature of
the entry point vLLM calls (a Triton kernel object, a DeepGEMM wrapper, a kernel
launched as ``kernel[grid](...)``), which ``install`` binds in vLLM's modules for the
duration of ``install.cpu_shim``. vLLM's own Python around them (the wrappers
``get_compressed_slot_mapping``, ``build_c128a_topk_metadata``,
``compress_norm_rope_store_triton``, ``compute_global_topk_indices_and_lens``, the
compressor and indexer forwards, ``sparse_attn_indexer``, the top-k dispatcher) runs
as it is.

Ops (namespace ``capturelint_vllm`` unless said)
------------------------------------------------
``save_partial_states`` (``_SAVE_PARTIAL_STATES_KERNEL``, common/ops/save_partial_states.py)
    Per token with a slot >= 0 (the first ``len(slot_mapping)`` tokens): state row
    ``state_cache[slot // bs, slot % bs]`` gets ``kv[t]`` in ``[0, head)`` and
    ``score[t] + ape[position % ratio]`` in ``[state_width, state_width + head)``, fp32.
``compress_norm_rope_store`` (head 512: the CuTe DSL ``_SPARSE_ATTN_COMPRESSOR_CUTEDSL_KERNEL``
    CUDA uses; head 128: ``_FUSED_KV_COMPRESS_NORM_ROPE_INSERT_INDEXER_TRITON_KERNEL``;
    semantics of the Triton kernels in common/ops/fused_compress_quant_cache.py)
    Per token ``t < num_actual`` with a state slot >= 0 at a boundary
    (``(position + 1) % ratio == 0``): the ``(1 + overlap) * ratio`` states ending at
    the position (earlier than 0 left out; the older ``ratio`` read the first ``head``
    dims of a state, the newer ones the second when ``overlap``) are softmax-weighted
    per dim by their scores and summed; weighted RMSNorm (fp32); GPT-J RoPE on the last
    64 dims at position ``position // ratio * ratio``. Stored at ``kv_slot_mapping[t]``
    (skipped when < 0). Head 512 (``fp8_ds_mla``, the layout of ``kernels.fp8_ds_mla``): dims
    0..447 of ``bf16(normed)`` (before RoPE) as UE8M0 fp8 in 7 blocks of 64, the RoPE'd
    dims 448..511 as bf16. Head 128 (the indexer's cache, per block ``[bs*128 fp8 |
    bs*4 fp32 scale]``): the whole RoPE'd row rounded to bf16, one block, its scale
    ``2^e`` stored as fp32. Scales: ``e = ceil(log2(max(amax, 1e-4) * fl32(1/448)))``.
``fused_indexer_q_rope_quant`` (common/ops/fused_indexer_q.py, FP8 path)
    Index q ``[T, H, 128]``: GPT-J RoPE on dims 64..127 (fp32, rounded to bf16), one
    scale per (token, head) ``2^ceil(log2(max(amax, 1e-4) / 448))`` over the roped and
    the NoPE values, q as e4m3 ``x / scale``; ``weights_out = w * scale * softmax_scale
    * head_scale`` in fp32 (the FP8 weight-fold contract of its docstring).
``fp8_paged_mqa_logits`` (``fp8_fp4_paged_mqa_logits``, utils/deep_gemm.py, FP8 Q)
    ``logits[b*next_n + j, t] = k_scale[t] * sum_h relu(q[b,j,h] . k[t]) * w[b*next_n+j, h]``
    over the paged indexer cache for ``t < context_lens[b, j]``, fp32 ``[B*next_n,
    max_model_len]``; columns past a row's length (which DeepGEMM leaves as they are)
    are ``-inf``.
``_C::top_k_per_row_decode`` (``ops.top_k_per_row_decode``, the ``per_row`` back end of
    ``SparseIndexerTopk``, model_executor/layers/indexer_topk.py)
    Row ``r`` has length ``L = seq_lens[r // next_n] - next_n + 1 + r % next_n``. A row
    with ``L <= topk`` selects every column, ``0..L-1`` in order (what
    ``_fill_short_context_topk_indices`` writes for the same rows: vLLM's indexer
    treats the two as interchangeable, attention.py:1121-1141); a longer one the
    indices of its ``topk`` largest logits by decreasing value (ties: lower index
    first). ``-1`` past ``L``.
``compute_global_topk_indices_and_lens`` (``_COMPUTE_GLOBAL_TOPK_INDICES_AND_LENS_KERNEL``,
    common/ops/cache_utils.py)
    Local compressed index ``i >= 0`` of token ``t`` -> slot
    ``block_table[req, i // bs] * bs + i % bs`` (else -1); ``lens[t]`` the count of
    valid entries, 0 for a token that is not valid.
``fill_short_context_topk_indices`` (``_fill_short_context_topk_indices``, attention.py:75)
    Row ``t``: ``arange(topk)`` below ``(positions[t] + 1) // ratio``, ``-1`` after.
``build_c128a_topk_metadata`` (``_BUILD_C128A_TOPK_METADATA_KERNEL``, sparse_mla.py)
    Decode token: the slots of its ``min((position + 1) // ratio, width)`` compressed
    entries, ``-1`` up to ``width``; its length (0 when its slot is < 0). Prefill token:
    local indices ``0..n-1``, ``-1`` after.
``compressed_slot_mapping`` (``_COMPRESSED_SLOT_MAPPING_KERNEL``,
    v1/attention/backends/mla/compressor_utils.py)
    Token at a boundary with a slot >= 0 -> the slot of compressed entry
    ``position // ratio`` in its request's blocks; others keep what the wrapper filled
    (-1). DCP is not covered (world size 1). The kernel reads the slots of query tokens
    only: a slot mapping longer than the output (V2 pads it) is read to the output's
    length.

The indexer's prefill (``sparse_attn_indexer``'s prefill chunks):

``build_prefill_chunk_metadata`` (``_BUILD_PREFILL_CHUNK_METADATA_KERNEL``,
    v1/attention/backends/mla/indexer.py)
    Prefill token ``t`` of request ``b`` at position ``p`` (inside the query slice):
    ``ks[t] = row_start[b]`` and ``ke[t] = row_start[b] + (p + 1) // ratio``, the
    request's entries the token may see among the gathered ones;
    ``token_to_seq[cu[b]..cu[b+1]) = b``. No DCP.
``_C_cache_ops::cp_gather_indexer_k_quant_cache`` (CUDA, ``ops.cp_gather_indexer_k_quant_cache``)
    Request ``b``'s first ``cu[b+1] - cu[b]`` entries of the paged indexer cache
    (``[bs*128 fp8 | bs*4 fp32 scale]`` per block, its block table) into rows
    ``cu[b]..`` of ``dst_k`` (fp8 ``[N, 128]``) and ``dst_scale`` (the scale's 4 bytes).
``fp8_mqa_logits`` (DeepGEMM ``fp8_fp4_mqa_logits``, utils/deep_gemm.py, FP8 Q)
    ``full[i, n] = k_scale[n] * sum_h relu(q[i,h] . k[n]) * w[i,h]`` (fp32), returned
    compressed as DeepGEMM documents it: row ``i`` holds ``[ks[i], ke[i])`` from column
    0, ``-inf`` after (``[M, max_seqlen_k]``). fp32, so vLLM's ``as_fp32_logits``
    returns it as it is.
``_C::top_k_per_row_prefill`` (CUDA, ``ops.top_k_per_row_prefill``)
    Row ``r``, columns ``[row_starts[r], row_ends[r])``: a row of at most ``topk``
    columns selects every one in order, a longer one the columns of its ``topk``
    largest logits, largest first; ``-1`` after. vLLM's CUDA path passes row starts
    of 0 (the logits are compressed), so the columns are the request's entry indices.

Limits
------
* FP8 only: the MXFP4 indexer cache and MXFP4 q, the plain bf16/fp8 full-cache
  compressor stores, SM100's MX scales and DCP raise ``NotImplementedError``.
* The top-k's order and tie-breaking are this reference's (the CUDA kernels' order is
  not specified; the attention that reads the indices does not depend on it beyond
  summation order).
* The paged logits are fp32 with ``-inf`` past each row; SM100's bf16 logits are not
  modelled.
* ``SparseAttnIndexer.forward_cuda`` calls ``torch.ops.vllm.sparse_attn_indexer``, a
  custom op with a Python body: a FULL graph records it as one op, which replay calls
  again (its host decisions taken from the replayed step's metadata, where a GPU graph
  keeps the capture's). Calling the body directly instead shows its kernels, but then
  ``topk_indices_buffer[:n] = -1`` (``aten.lift_fresh`` of a Python number feeding
  ``fill_.Tensor``, a value a GPU graph bakes in) reads to the checker as a fresh input
  each step (CL104): the checker's model of wrapped numbers needs that first.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch

from capturelint.adapters.vllm.kernels.fp8_ds_mla import (
    FP8_MAX,
    NOPE_DIM,
    NUM_QUANT_BLOCKS,
    QUANT_BLOCK,
    ROPE_DIM,
    SCALE_BYTES_PER_TOKEN,
    TOKEN_DATA_BYTES,
    UE8M0_BIAS,
    apply_gptj_rope,
    ceil_log2,
    slot_offsets,
)
from capturelint.adapters.vllm.kernels.library import register_ops

NS = "capturelint_vllm"
AMAX_FLOOR = 1e-4
INDEXER_HEAD_DIM = 128
INDEXER_SCALE_BYTES = 4  # one fp32 scale per token
_INV_FP8_MAX = torch.tensor(1.0 / FP8_MAX, dtype=torch.float32)  # the Triton constexpr, as fp32


# ------------------------------------------------------------------ compressor


def save_partial_states(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, positions: torch.Tensor,
                        state_cache: torch.Tensor, slot_mapping: torch.Tensor, block_size: int, state_width: int,
                        compress_ratio: int) -> None:
    """Write ``[kv | score + ape]`` state rows (see the module docstring)."""
    n = slot_mapping.shape[0]
    tokens = torch.nonzero(slot_mapping >= 0).flatten()
    if n == 0 or tokens.numel() == 0:
        return
    slots = slot_mapping[tokens]
    head = kv.shape[-1]
    block, offset = torch.div(slots, block_size, rounding_mode="floor"), slots % block_size
    rows = positions[tokens].long() % compress_ratio
    state_cache[block, offset, :head] = kv[tokens].float()
    state_cache[block, offset, state_width:state_width + head] = score[tokens].float() + ape.float()[rows]


def _rope_tail(x: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """GPT-J RoPE of the last 64 dims of fp32 rows ``x`` at ``positions``."""
    rows = cos_sin_cache.float()[positions.long()]
    half = ROPE_DIM // 2
    rope = apply_gptj_rope(x[:, -ROPE_DIM:], rows[:, :half], rows[:, half:])
    return torch.cat((x[:, :-ROPE_DIM], rope), dim=-1)


def _scale_exponent(amax: torch.Tensor) -> torch.Tensor:
    """``ceil(log2(max(amax, 1e-4) * fl32(1/448)))`` (int32), as the Triton kernels."""
    return ceil_log2(amax.clamp_min(AMAX_FLOOR) * _INV_FP8_MAX.to(amax.device))


def _fp8_bytes(x: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """``clamp(x * 2^-e, +-448)`` as e4m3 bytes; ``exponent`` broadcasts over the last dim."""
    scaled = (x * torch.ldexp(torch.ones_like(x), -exponent)).clamp(-FP8_MAX, FP8_MAX)
    return scaled.to(torch.float8_e4m3fn).view(torch.uint8)


def _store_fp8_ds_mla(kv_cache: torch.Tensor, normed: torch.Tensor, roped: torch.Tensor, slots: torch.Tensor) -> None:
    """Head-512 store into ``kv_cache [blocks, bs, 584]`` (uint8)."""
    bs = kv_cache.shape[1]
    flat = kv_cache.view(kv_cache.shape[0], -1)
    n = normed.shape[0]
    nope = normed[:, :NOPE_DIM].to(torch.bfloat16).float().reshape(n, NUM_QUANT_BLOCKS, QUANT_BLOCK)
    exponent = _scale_exponent(nope.abs().amax(dim=-1))
    data = torch.cat((_fp8_bytes(nope, exponent[..., None]).reshape(n, NOPE_DIM),
                      roped[:, NOPE_DIM:].to(torch.bfloat16).contiguous().view(torch.uint8)), dim=1)
    scales = torch.cat(((exponent + UE8M0_BIAS).clamp(0, 255).to(torch.uint8),
                        torch.zeros(n, 1, dtype=torch.uint8, device=flat.device)), dim=1)
    block, data_at, scale_at = slot_offsets(slots, bs)
    flat[block[:, None], data_at[:, None] + torch.arange(TOKEN_DATA_BYTES, device=flat.device)] = data
    flat[block[:, None], scale_at[:, None] + torch.arange(SCALE_BYTES_PER_TOKEN, device=flat.device)] = scales


def _store_indexer_fp8(kv_cache: torch.Tensor, roped: torch.Tensor, slots: torch.Tensor) -> None:
    """Head-128 store into the indexer cache ``[blocks, bs, 132]`` (uint8)."""
    bs = kv_cache.shape[1]
    flat = kv_cache.view(kv_cache.shape[0], -1)
    x = roped.to(torch.bfloat16).float()
    exponent = _scale_exponent(x.abs().amax(dim=-1))
    data = _fp8_bytes(x, exponent[:, None])
    scale = torch.ldexp(torch.ones_like(exponent, dtype=torch.float32), exponent)[:, None].view(torch.uint8)
    block = torch.div(slots, bs, rounding_mode="floor")
    offset = slots - block * bs
    cols = torch.arange(INDEXER_HEAD_DIM, device=flat.device)
    flat[block[:, None], offset[:, None] * INDEXER_HEAD_DIM + cols] = data
    scale_cols = bs * INDEXER_HEAD_DIM + offset[:, None] * INDEXER_SCALE_BYTES + torch.arange(4, device=flat.device)
    flat[block[:, None], scale_cols] = scale


def compress_norm_rope_store(state_cache: torch.Tensor, token_to_req_indices: torch.Tensor, positions: torch.Tensor,
                             slot_mapping: torch.Tensor, block_table: torch.Tensor, block_size: int,
                             state_width: int, cos_sin_cache: torch.Tensor, kv_cache: torch.Tensor,
                             kv_slot_mapping: torch.Tensor, num_actual: int, head_dim: int, rope_head_dim: int,
                             compress_ratio: int, overlap: bool, rms_norm_weight: torch.Tensor,
                             rms_norm_eps: float) -> None:
    """Compress, norm, RoPE and store the boundary tokens (see the module docstring)."""
    if rope_head_dim != ROPE_DIM or head_dim not in (NOPE_DIM + ROPE_DIM, INDEXER_HEAD_DIM):
        raise NotImplementedError(f"compress_norm_rope_store: head_dim {head_dim} / rope {rope_head_dim}")
    t = torch.arange(num_actual, device=positions.device)
    pos = positions[:num_actual].long()
    # A compressed slot view shorter than the state slots (V2 pads the slot mappings, not
    # the metadata's token count): the kernel reads on into the builder's buffer, which
    # get_compressed_slot_mapping fills with PAD whole (compressor_utils.py:206-211).
    kv_slot_mapping = torch.nn.functional.pad(kv_slot_mapping[:num_actual],
                                              (0, max(num_actual - kv_slot_mapping.shape[0], 0)), value=-1)
    keep = (slot_mapping[:num_actual] >= 0) & ((pos + 1) % compress_ratio == 0) & (kv_slot_mapping >= 0)
    t, pos = t[keep], pos[keep]
    if t.numel() == 0:
        return
    window = (1 + int(overlap)) * compress_ratio
    offsets = torch.arange(window, device=pos.device)
    at = pos[:, None] - window + 1 + offsets  # [n, window]
    valid = at >= 0
    safe = at.clamp_min(0)
    req = token_to_req_indices[t].long()
    blocks = block_table.long()[req[:, None], torch.div(safe, block_size, rounding_mode="floor")]
    rows = state_cache[blocks, safe % block_size].float()  # [n, window, 2*state_width]
    half = (offsets >= compress_ratio).long() * head_dim  # the newer ratio tokens read the second half
    cols = half[:, None] + torch.arange(head_dim, device=pos.device)  # [window, head]
    kv = rows.gather(2, cols.expand(rows.shape[0], -1, -1))
    score = rows.gather(2, (cols + state_width).expand(rows.shape[0], -1, -1))
    score = score.masked_fill(~valid[..., None], float("-inf"))
    kv = kv.masked_fill(~valid[..., None], 0.0)
    compressed = (kv * torch.softmax(score, dim=1)).sum(dim=1)  # [n, head] fp32
    rrms = torch.rsqrt(compressed.square().sum(dim=-1, keepdim=True) / head_dim + rms_norm_eps)
    normed = compressed * rrms * rms_norm_weight.float()
    roped = _rope_tail(normed, cos_sin_cache, torch.div(pos, compress_ratio, rounding_mode="floor") * compress_ratio)
    slots = kv_slot_mapping[t].long()
    if head_dim == INDEXER_HEAD_DIM:
        _store_indexer_fp8(kv_cache, roped, slots)
    else:
        _store_fp8_ds_mla(kv_cache, normed, roped, slots)


# --------------------------------------------------------------------- indexer


def fused_indexer_q_rope_quant(positions: torch.Tensor, index_q: torch.Tensor, cos_sin_cache: torch.Tensor,
                               weights: torch.Tensor, softmax_scale: float,
                               head_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE and FP8-quantize the index q; fold the q scales into the weights."""
    dim = index_q.shape[-1]
    rows = cos_sin_cache.float()[positions.long()]
    half = ROPE_DIM // 2
    x = index_q.float()
    rope = apply_gptj_rope(x[..., dim - ROPE_DIM:], rows[:, None, :half], rows[:, None, half:])
    x = torch.cat((x[..., :dim - ROPE_DIM], rope.to(torch.bfloat16).float()), dim=-1)
    amax = x.abs().amax(dim=-1).clamp_min(AMAX_FLOOR)
    scale = torch.ldexp(torch.ones_like(amax), ceil_log2(amax / FP8_MAX))
    q_fp8 = (x / scale[..., None]).to(torch.float8_e4m3fn)
    weights_out = weights.float() * scale
    weights_out = weights_out * softmax_scale
    weights_out = weights_out * head_scale
    return q_fp8, weights_out


def fp8_paged_mqa_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                         block_tables: torch.Tensor, max_model_len: int) -> torch.Tensor:
    """Paged FP8 MQA logits of the indexer (see the module docstring)."""
    batch, next_n, heads, dim = q.shape
    num_blocks, bs = kv_cache.shape[0], kv_cache.shape[1]
    flat = kv_cache.reshape(num_blocks, -1)
    cols = torch.arange(max_model_len, device=q.device)
    blocks = block_tables.long()[:, torch.div(cols, bs, rounding_mode="floor").clamp_max(block_tables.shape[1] - 1)]
    offset = cols % bs
    data_at = offset[None, :, None] * dim + torch.arange(dim, device=q.device)
    values = flat[blocks[:, :, None], data_at.expand(batch, -1, -1)].contiguous().view(torch.float8_e4m3fn).float()
    scale_at = bs * dim + offset[None, :, None] * INDEXER_SCALE_BYTES + torch.arange(4, device=q.device)
    scales = flat[blocks[:, :, None], scale_at.expand(batch, -1, -1)].contiguous().view(torch.float32)[..., 0]
    dots = torch.einsum("bjhd,btd->bjht", q.float(), values).relu()
    w = weights.float().reshape(batch, next_n, heads)
    logits = (dots * w[..., None]).sum(dim=2) * scales[:, None, :]  # [b, next_n, T]
    lens = context_lens.reshape(batch, -1).long()
    if lens.shape[1] != next_n:
        lens = lens[:, -1:] - next_n + 1 + torch.arange(next_n, device=q.device)
    logits = logits.masked_fill(cols[None, None, :] >= lens[..., None], float("-inf"))
    return logits.reshape(batch * next_n, max_model_len)


def top_k_per_row_decode(logits: torch.Tensor, next_n: int, seq_lens: torch.Tensor, topk_indices: torch.Tensor,
                         num_rows: int, stride0: int, stride1: int, topk_tokens: int) -> None:
    """Per row, the indices of the ``topk_tokens`` largest logits within its length."""
    rows = logits.as_strided((num_rows, logits.shape[1]), (stride0, stride1), logits.storage_offset()).float()
    r = torch.arange(num_rows, device=logits.device)
    lens = seq_lens.reshape(-1).long()[torch.div(r, next_n, rounding_mode="floor")] - next_n + 1 + r % next_n
    cols = torch.arange(rows.shape[1], device=logits.device)
    masked = rows.masked_fill(cols[None, :] >= lens[:, None], float("-inf"))
    order = torch.sort(masked, dim=1, descending=True, stable=True).indices[:, :topk_tokens]
    k = torch.arange(order.shape[1], device=logits.device)[None, :]
    order = torch.where(lens[:, None] <= topk_tokens, k, order)  # a short row: every column, in order
    picked = k < lens[:, None]
    out = torch.full((num_rows, topk_tokens), -1, dtype=topk_indices.dtype, device=topk_indices.device)
    out[:, :order.shape[1]] = torch.where(picked, order, -1).to(topk_indices.dtype)
    topk_indices[:num_rows, :topk_tokens] = out


# ---------------------------------------------------------- indexer prefill


def cp_gather_indexer_k_quant_cache(kv_cache: torch.Tensor, dst_k: torch.Tensor, dst_scale: torch.Tensor,
                                    block_table: torch.Tensor, cu_seq_lens: torch.Tensor) -> None:
    """Each request's indexer entries, contiguous (see the module docstring)."""
    flat = kv_cache.reshape(kv_cache.shape[0], -1)
    bs = flat.shape[1] // (INDEXER_HEAD_DIM + INDEXER_SCALE_BYTES)
    values, scales = dst_k.view(torch.uint8), dst_scale.view(torch.uint8)
    for b in range(block_table.shape[0]):
        start, end = int(cu_seq_lens[b]), int(cu_seq_lens[b + 1])
        t = torch.arange(end - start, device=flat.device)
        blocks = block_table[b].long()[torch.div(t, bs, rounding_mode="floor")][:, None]
        offset = (t % bs)[:, None]
        values[start:end] = flat[blocks, offset * INDEXER_HEAD_DIM + torch.arange(INDEXER_HEAD_DIM)]
        scales[start:end] = flat[blocks, bs * INDEXER_HEAD_DIM + offset * INDEXER_SCALE_BYTES + torch.arange(4)]


def fp8_mqa_logits(q: torch.Tensor, k: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
                   cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor, max_seqlen_k: int) -> torch.Tensor:
    """FP8 MQA logits, compressed rows (see the module docstring)."""
    dots = torch.einsum("mhd,nd->mhn", q.float(), k.float()) * k_scale.reshape(-1).float()
    full = (dots.relu() * weights.float()[..., None]).sum(dim=1)  # [M, N]
    cols = cu_seqlen_ks.long()[:, None] + torch.arange(max_seqlen_k, device=q.device)
    valid = cols < cu_seqlen_ke.long()[:, None]
    if full.shape[1] == 0:
        return torch.full((q.shape[0], max_seqlen_k), float("-inf"), device=q.device)
    return full.gather(1, cols.clamp(max=full.shape[1] - 1)).masked_fill(~valid, float("-inf"))


def top_k_per_row_prefill(logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                          topk_indices: torch.Tensor, num_rows: int, stride0: int, stride1: int,
                          topk_tokens: int) -> None:
    """Per row, the columns of the ``topk_tokens`` largest logits in ``[start, end)``."""
    rows = logits.as_strided((num_rows, logits.shape[1]), (stride0, stride1), logits.storage_offset()).float()
    cols = torch.arange(rows.shape[1], device=logits.device)
    starts, ends = row_starts.long()[:num_rows, None], row_ends.long()[:num_rows, None]
    masked = rows.masked_fill((cols < starts) | (cols >= ends), float("-inf"))
    width = min(topk_tokens, rows.shape[1])
    order = torch.sort(masked, dim=1, descending=True, stable=True).indices[:, :width]
    k = torch.arange(width, device=logits.device)[None, :]
    lens = ends - starts
    order = torch.where(lens <= topk_tokens, starts + k, order)  # a short row: every column, in order
    out = torch.full((num_rows, topk_tokens), -1, dtype=topk_indices.dtype, device=topk_indices.device)
    out[:, :width] = torch.where(k < lens, order, -1).to(topk_indices.dtype)
    topk_indices[:num_rows, :topk_tokens] = out


def build_prefill_chunk_metadata(query_start_loc: torch.Tensor, uncompressed_seq_lens: torch.Tensor,
                                 cu_seq_lens: torch.Tensor, row_start_cu: torch.Tensor, token_to_seq: torch.Tensor,
                                 cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor, query_slice_start: int,
                                 query_slice_stop: int, compress_ratio: int) -> None:
    """Per prefill token its K range in the gathered entries, per entry its request."""
    num_reqs = cu_seq_lens.shape[0] - 1
    for b in range(num_reqs):
        query_start, query_end = int(query_start_loc[b]), int(query_start_loc[b + 1])
        start_pos = int(uncompressed_seq_lens[b]) - (query_end - query_start)
        row_start = int(row_start_cu[b])
        for t in range(query_start, query_end):
            if query_slice_start <= t < query_slice_stop:
                cu_seqlen_ks[t - query_slice_start] = row_start
                cu_seqlen_ke[t - query_slice_start] = row_start + (start_pos + 1 + t - query_start) // compress_ratio
        token_to_seq[int(cu_seq_lens[b]):int(cu_seq_lens[b + 1])] = b


# ------------------------------------------------------------------ metadata


def _slots_of(local: torch.Tensor, req: torch.Tensor, block_table: torch.Tensor, block_size: int) -> torch.Tensor:
    """Flat slots of per-request local indices ``local [n, k]`` (``-1`` where < 0)."""
    valid = local >= 0
    safe = local.long().clamp_min(0)
    blocks = block_table.long()[req.long()[:, None], torch.div(safe, block_size, rounding_mode="floor")]
    return torch.where(valid, blocks * block_size + safe % block_size, -1)


def compute_global_topk_indices_and_lens(global_topk_indices: torch.Tensor, topk_lens: torch.Tensor,
                                         topk_indices: torch.Tensor, token_to_req_indices: torch.Tensor,
                                         block_table: torch.Tensor, block_size: int,
                                         is_valid_token: torch.Tensor) -> None:
    """Local top-k indices -> global slots, and valid counts."""
    n = topk_indices.shape[0]
    if n == 0:
        return
    slots = _slots_of(topk_indices, token_to_req_indices[:n], block_table, block_size)
    global_topk_indices.copy_(slots.to(global_topk_indices.dtype))
    count = (topk_indices >= 0).sum(dim=1).to(topk_lens.dtype)
    topk_lens.copy_(torch.where(is_valid_token[:n].bool(), count, 0))


def fill_short_context_topk_indices(output: torch.Tensor, positions: torch.Tensor, num_rows: int, top_k: int,
                                    compress_ratio: int) -> None:
    """Select every compressed candidate of the first ``num_rows`` tokens."""
    num_compressed = torch.div(positions[:num_rows].long() + 1, compress_ratio, rounding_mode="floor")
    k = torch.arange(top_k, device=output.device)
    rows = output.view(-1)[:num_rows * top_k].view(num_rows, top_k)
    rows.copy_(torch.where(k[None, :] < num_compressed[:, None], k[None, :], -1).to(output.dtype))


def build_c128a_topk_metadata(global_decode: torch.Tensor, decode_lens: torch.Tensor, prefill_local: torch.Tensor,
                              positions: torch.Tensor, compress_ratio: int, max_compressed_tokens: int,
                              num_decode_tokens: int, token_to_req_indices: torch.Tensor, block_table: torch.Tensor,
                              block_size: int, slot_mapping: torch.Tensor) -> None:
    """C128A decode slots and lengths, prefill local indices (see the module docstring)."""
    n = positions.shape[0]
    width = max_compressed_tokens
    num_compressed = torch.div(positions.long() + 1, compress_ratio, rounding_mode="floor").clamp_max(width)
    k = torch.arange(width, device=positions.device)
    local = torch.where(k[None, :] < num_compressed[:, None], k[None, :], -1)
    d = min(num_decode_tokens, n)
    if d:
        slots = _slots_of(local[:d], token_to_req_indices[:d], block_table, block_size)
        global_decode[:d, :width] = slots.to(global_decode.dtype)
        lens = torch.where(slot_mapping[:d] >= 0, num_compressed[:d], 0)
        decode_lens[:d] = lens.to(decode_lens.dtype)
    if n > d:
        prefill_local[:n - d, :width] = local[d:].to(prefill_local.dtype)


def compressed_slot_mapping(out: torch.Tensor, slot_mapping: torch.Tensor, query_start_loc: torch.Tensor,
                            seq_lens: torch.Tensor, block_table: torch.Tensor, block_size: int, compress_ratio: int,
                            dcp_world_size: int, cp_interleave: int) -> None:
    """Compressed-state slots of the boundary tokens, per request."""
    if dcp_world_size != 1:
        raise NotImplementedError("compressed_slot_mapping: decode context parallelism is not covered")
    num_reqs = block_table.shape[0]
    starts, ends = query_start_loc[:num_reqs].long(), query_start_loc[1:num_reqs + 1].long()
    lens = ends - starts
    token = torch.arange(out.shape[0], device=out.device)
    req = torch.searchsorted(ends, token, right=True)
    live = req < num_reqs
    req_c = req.clamp_max(num_reqs - 1)
    pos = seq_lens.long()[req_c] - lens[req_c] + (token - starts[req_c])
    slot = torch.full_like(token, -1)
    k = min(out.shape[0], slot_mapping.shape[0])  # the kernel reads the slots of query tokens only
    slot[:k] = slot_mapping[:k].long()
    boundary = live & ((pos + 1) % compress_ratio == 0) & (slot != -1)
    entry = torch.div(pos.clamp_min(0), compress_ratio, rounding_mode="floor")
    slots = _slots_of(entry[:, None], req_c, block_table, block_size)[:, 0]
    out.copy_(torch.where(boundary, slots, out.long()).to(out.dtype))


# -------------------------------------------------------------- registration

_SCHEMAS = {
    "save_partial_states": "(Tensor kv, Tensor score, Tensor ape, Tensor positions, Tensor(a!) state_cache, "
                           "Tensor slot_mapping, int block_size, int state_width, int compress_ratio) -> ()",
    "compress_norm_rope_store": "(Tensor state_cache, Tensor token_to_req_indices, Tensor positions, "
                                "Tensor slot_mapping, Tensor block_table, int block_size, int state_width, "
                                "Tensor cos_sin_cache, Tensor(a!) kv_cache, Tensor kv_slot_mapping, int num_actual, "
                                "int head_dim, int rope_head_dim, int compress_ratio, bool overlap, "
                                "Tensor rms_norm_weight, float rms_norm_eps) -> ()",
    "fused_indexer_q_rope_quant": "(Tensor positions, Tensor index_q, Tensor cos_sin_cache, Tensor weights, "
                                  "float softmax_scale, float head_scale) -> (Tensor, Tensor)",
    "fp8_paged_mqa_logits": "(Tensor q, Tensor kv_cache, Tensor weights, Tensor context_lens, Tensor block_tables, "
                            "int max_model_len) -> Tensor",
    "top_k_per_row_decode": "(Tensor logits, int next_n, Tensor seq_lens, Tensor(a!) topk_indices, int num_rows, "
                            "int stride0, int stride1, int topk_tokens) -> ()",
    "compute_global_topk_indices_and_lens": "(Tensor(a!) global_topk_indices, Tensor(b!) topk_lens, "
                                            "Tensor topk_indices, Tensor token_to_req_indices, Tensor block_table, "
                                            "int block_size, Tensor is_valid_token) -> ()",
    "fill_short_context_topk_indices": "(Tensor(a!) output, Tensor positions, int num_rows, int top_k, "
                                       "int compress_ratio) -> ()",
    "build_c128a_topk_metadata": "(Tensor(a!) global_decode, Tensor(b!) decode_lens, Tensor(c!) prefill_local, "
                                 "Tensor positions, int compress_ratio, int max_compressed_tokens, "
                                 "int num_decode_tokens, Tensor token_to_req_indices, Tensor block_table, "
                                 "int block_size, Tensor slot_mapping) -> ()",
    "compressed_slot_mapping": "(Tensor(a!) out, Tensor slot_mapping, Tensor query_start_loc, Tensor seq_lens, "
                               "Tensor block_table, int block_size, int compress_ratio, int dcp_world_size, "
                               "int cp_interleave) -> ()",
    "cp_gather_indexer_k_quant_cache": "(Tensor kv_cache, Tensor(a!) dst_k, Tensor(b!) dst_scale, "
                                       "Tensor block_table, Tensor cu_seq_lens) -> ()",
    "fp8_mqa_logits": "(Tensor q, Tensor k, Tensor k_scale, Tensor weights, Tensor cu_seqlen_ks, "
                      "Tensor cu_seqlen_ke, int max_seqlen_k) -> Tensor",
    "top_k_per_row_prefill": "(Tensor logits, Tensor row_starts, Tensor row_ends, Tensor(a!) topk_indices, "
                             "int num_rows, int stride0, int stride1, int topk_tokens) -> ()",
    "build_prefill_chunk_metadata": "(Tensor query_start_loc, Tensor uncompressed_seq_lens, Tensor cu_seq_lens, "
                                    "Tensor row_start_cu, Tensor(a!) token_to_seq, Tensor(b!) cu_seqlen_ks, "
                                    "Tensor(c!) cu_seqlen_ke, int query_slice_start, int query_slice_stop, "
                                    "int compress_ratio) -> ()",
}


def _none(*args: Any, **kwargs: Any) -> None:
    return None


def _q_quant_fake(positions, index_q, cos_sin_cache, weights, softmax_scale, head_scale):
    return index_q.new_empty(index_q.shape, dtype=torch.float8_e4m3fn), weights.new_empty(weights.shape,
                                                                                          dtype=torch.float32)


def _logits_fake(q, kv_cache, weights, context_lens, block_tables, max_model_len):
    return q.new_empty((q.shape[0] * q.shape[1], max_model_len), dtype=torch.float32)


def _mqa_logits_fake(q, k, k_scale, weights, cu_seqlen_ks, cu_seqlen_ke, max_seqlen_k):
    return q.new_empty((q.shape[0], max_seqlen_k), dtype=torch.float32)


_REFERENCES = {
    "save_partial_states": (save_partial_states, _none),
    "compress_norm_rope_store": (compress_norm_rope_store, _none),
    "fused_indexer_q_rope_quant": (fused_indexer_q_rope_quant, _q_quant_fake),
    "fp8_paged_mqa_logits": (fp8_paged_mqa_logits, _logits_fake),
    "top_k_per_row_decode": (top_k_per_row_decode, _none),
    "compute_global_topk_indices_and_lens": (compute_global_topk_indices_and_lens, _none),
    "fill_short_context_topk_indices": (fill_short_context_topk_indices, _none),
    "build_c128a_topk_metadata": (build_c128a_topk_metadata, _none),
    "compressed_slot_mapping": (compressed_slot_mapping, _none),
    "cp_gather_indexer_k_quant_cache": (cp_gather_indexer_k_quant_cache, _none),
    "fp8_mqa_logits": (fp8_mqa_logits, _mqa_logits_fake),
    "top_k_per_row_prefill": (top_k_per_row_prefill, _none),
    "build_prefill_chunk_metadata": (build_prefill_chunk_metadata, _none),
}
# vLLM calls these as torch.ops.<namespace>.<name>
_VLLM_NAMESPACES = {"top_k_per_row_decode": "_C", "top_k_per_row_prefill": "_C",
                    "cp_gather_indexer_k_quant_cache": "_C_cache_ops"}
IMPLS = {f"{_VLLM_NAMESPACES.get(name, NS)}::{name}": (_SCHEMAS[name], *_REFERENCES[name]) for name in _SCHEMAS}
#: The ops this module has a reference for, as ``namespace::name``.
REFERENCE_KERNELS: tuple[str, ...] = tuple(IMPLS)


_aten_impls: list[torch.library.Library] = []


def mm_dtype(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """``torch.mm(a, b, out_dtype=...)`` (``aten::mm.dtype``, CUDA only in PyTorch): the
    product accumulated in fp32 from the 16-bit inputs, cast once to ``out_dtype``."""
    return torch.mm(a.float(), b.float()).to(out_dtype)


def register() -> tuple[str, ...]:
    """Register every op above where its namespace lacks it (``kernels.library.register_ops``),
    and a CPU kernel for ``aten::mm.dtype``, which the compressor's input GEMM calls
    (attention.py:698) and PyTorch has only for CUDA."""
    if not _aten_impls and not torch._C._dispatch_has_kernel_for_dispatch_key("aten::mm.dtype", "CPU"):
        library = torch.library.Library("aten", "IMPL")
        library.impl("mm.dtype", mm_dtype, "CPU")
        _aten_impls.append(library)
    return register_ops(IMPLS)


def _op(name: str) -> Any:
    register()
    return getattr(getattr(torch.ops, _VLLM_NAMESPACES.get(name, NS)), name)


# ----------------------------------------------------------------- drop-ins


class SavePartialStatesKernel:
    """Stands in for ``_SAVE_PARTIAL_STATES_KERNEL`` (its ``__call__`` signature)."""

    def __call__(self, kv, score, ape, positions, state_cache, slot_mapping, block_size, state_width, compress_ratio,
                 pdl_kwargs=None) -> None:
        _op("save_partial_states")(kv, score, ape, positions, state_cache, slot_mapping, block_size, state_width,
                                   compress_ratio)


class CompressNormRopeStoreKernel:
    """Stands in for the head-512 CuTe DSL compressor and the head-128 Triton indexer
    compressor (the keyword arguments ``_compress_norm_rope_store`` and
    ``compress_norm_rope_store_triton`` pass)."""

    def __call__(self, *, state_cache, num_actual, token_to_req_indices, positions, slot_mapping, block_table,
                 block_size, state_width, cos_sin_cache, kv_cache, k_cache_metadata, head_dim, rope_head_dim,
                 compress_ratio, overlap, use_fp4_cache, rms_norm_weight, rms_norm_eps, store_full_kv=False,
                 store_full_fp8=False, **unused: Any) -> None:
        if use_fp4_cache or store_full_kv or store_full_fp8 or kv_cache.dtype != torch.uint8:
            raise NotImplementedError("compress_norm_rope_store: the reference covers the FP8 caches only")
        _op("compress_norm_rope_store")(state_cache, addressable(token_to_req_indices), positions, slot_mapping,
                                        addressable(block_table), block_size, state_width, cos_sin_cache, kv_cache,
                                        addressable(k_cache_metadata.slot_mapping), num_actual, head_dim,
                                        rope_head_dim, compress_ratio, overlap, rms_norm_weight, rms_norm_eps)


def addressable(t: torch.Tensor) -> torch.Tensor:
    """What a kernel given ``t`` as a pointer (and its row stride) can address: ``t``'s
    allocation from ``t``'s offset on, rows of ``t``'s width. The kernels above take the
    block table, the compressed slot mapping and (``compress_norm_rope_store``) the token
    to request map so: they index them by request and by token (grid over ``num_actual``
    tokens, the padded slot mapping's length), never by the view's row count, which V2
    sizes by the unpadded batch under PIECEWISE (a capture's dummy batch and a smaller
    real one read the same rows of the builder's persistent buffer). The view is taken
    outside any dispatch mode: it is the launch's argument, not an op of the step."""
    from torch.utils._python_dispatch import _disable_current_modes

    total = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
    with _disable_current_modes():
        if t.dim() == 1 and t.stride(0) == 1:
            return t.as_strided((total,), (1,), t.storage_offset())
        if t.dim() == 2 and t.stride(1) == 1 and t.stride(0) >= t.shape[1] > 0:
            rows = (total - t.shape[1]) // t.stride(0) + 1
            return t.as_strided((rows, t.shape[1]), t.stride(), t.storage_offset())
    return t


def fused_indexer_q_rope_quant_dropin(positions, index_q, index_q_cos_sin_cache, index_weights,
                                      index_weights_softmax_scale, index_weights_head_scale, use_fp4=False,
                                      weights_out_dtype=torch.float32):
    """Drop-in for ``fused_indexer_q_rope_quant`` (FP8 path)."""
    if use_fp4 or weights_out_dtype != torch.float32:
        raise NotImplementedError("fused_indexer_q_rope_quant: the reference covers the FP8 path only")
    return _op("fused_indexer_q_rope_quant")(positions, index_q, index_q_cos_sin_cache, index_weights,
                                             float(index_weights_softmax_scale), float(index_weights_head_scale))


def fp8_fp4_paged_mqa_logits_dropin(q, kv_cache, weights, context_lens, block_tables, schedule_metadata,
                                    max_model_len, indices=None):
    """Drop-in for ``vllm.utils.deep_gemm.fp8_fp4_paged_mqa_logits`` (FP8 q, no scale)."""
    values, scale = q
    if scale is not None or indices is not None:
        raise NotImplementedError("fp8_fp4_paged_mqa_logits: the reference covers FP8 q without varlen indices")
    return _op("fp8_paged_mqa_logits")(values, kv_cache, weights, context_lens, block_tables, max_model_len)


def fp8_fp4_mqa_logits_dropin(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, max_seqlen_k):
    """Drop-in for ``vllm.utils.deep_gemm.fp8_fp4_mqa_logits`` (FP8 q with its scale
    folded into the weights, fp32 K scales)."""
    (q_values, q_scale), (k_values, k_scale) = q, kv
    if q_scale is not None or k_scale.dtype != torch.float32:
        raise NotImplementedError("fp8_fp4_mqa_logits: the reference covers FP8 q without scale, fp32 K scales")
    return _op("fp8_mqa_logits")(q_values, k_values, k_scale, weights, cu_seqlen_ks, cu_seqlen_ke, int(max_seqlen_k))


class BuildPrefillChunkMetadataKernel:
    """Stands in for the Triton ``_BUILD_PREFILL_CHUNK_METADATA_KERNEL`` (indexer.py)
    without decode context parallelism."""

    def __call__(self, query_start_loc, uncompressed_seq_lens, cu_seq_lens, row_start_cu, token_to_seq,
                 cu_seqlen_ks, cu_seqlen_ke, query_slice_start, query_slice_stop, dcp_rank, dcp_world,
                 dcp_interleave, *, num_reqs, COMPRESS_RATIO) -> None:
        if dcp_world != 1:
            raise NotImplementedError("build_prefill_chunk_metadata: decode context parallelism is not covered")
        _op("build_prefill_chunk_metadata")(query_start_loc[: num_reqs + 1], uncompressed_seq_lens[:num_reqs],
                                            cu_seq_lens[: num_reqs + 1], row_start_cu[: num_reqs + 1], token_to_seq,
                                            cu_seqlen_ks, cu_seqlen_ke, int(query_slice_start),
                                            int(query_slice_stop), COMPRESS_RATIO)


class ComputeGlobalTopkKernel:
    """Stands in for ``_COMPUTE_GLOBAL_TOPK_INDICES_AND_LENS_KERNEL``."""

    def __call__(self, global_topk_indices, topk_lens, topk_indices, token_to_req_indices, block_table, block_size,
                 is_valid_token) -> None:
        _op("compute_global_topk_indices_and_lens")(global_topk_indices, topk_lens, topk_indices,
                                                    token_to_req_indices, block_table, block_size, is_valid_token)


class FillShortContextKernel:
    """Stands in for the Triton ``_fill_short_context_topk_indices``, launched as
    ``kernel[(num_tokens,)](output, positions, TOP_K=, COMPRESS_RATIO=, ...)``."""

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def launch(output, positions, TOP_K, COMPRESS_RATIO, **unused: Any) -> None:
            _op("fill_short_context_topk_indices")(output, positions, int(grid[0]), TOP_K, COMPRESS_RATIO)
        return launch


class BuildC128AKernel:
    """Stands in for ``_BUILD_C128A_TOPK_METADATA_KERNEL``."""

    def __call__(self, global_decode_buffer, decode_lens_buffer, prefill_buffer, positions, compress_ratio,
                 max_compressed_tokens, num_decode_tokens, token_to_req_indices, block_table, block_size,
                 slot_mapping) -> None:
        _op("build_c128a_topk_metadata")(global_decode_buffer, decode_lens_buffer, prefill_buffer, positions,
                                         compress_ratio, max_compressed_tokens, num_decode_tokens,
                                         token_to_req_indices, block_table, block_size, slot_mapping)


class CompressedSlotMappingKernel:
    """Stands in for ``_COMPRESSED_SLOT_MAPPING_KERNEL``."""

    def __call__(self, compressed_slot_mapping, slot_mapping, query_start_loc, seq_lens, block_table, block_size,
                 compress_ratio, dcp_world_size, cp_interleave) -> None:
        _op("compressed_slot_mapping")(compressed_slot_mapping, slot_mapping, query_start_loc, seq_lens, block_table,
                                       block_size, compress_ratio, dcp_world_size, cp_interleave)


class _CudaView:
    """``current_platform`` as the modules of the CUDA path see it: ``is_cuda()`` is
    True (``DeepseekCompressor`` takes its CUDA branches: the C128 skip at
    compressor.py:410-417 and the head-512 CuTe DSL store); the rest is the CPU
    platform's."""

    def __init__(self, platform: Any):
        self._platform = platform

    def is_cuda(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._platform, name)


CUTEDSL_COMPRESSOR = "vllm.models.deepseek_v4.nvidia.ops.sparse_attn_compress_cutedsl"


def install(patches: Any) -> None:
    """Bind the drop-ins in vLLM's modules through ``patches`` (``install.Patches``,
    undone when ``cpu_shim`` exits); register the ops."""
    import vllm.model_executor.layers.sparse_attn_indexer as indexer_layer
    import vllm.models.deepseek_v4.common.ops.fused_compress_quant_cache as fused_compress
    from vllm.models.deepseek_v4 import attention, compressor, sparse_mla
    from vllm.models.deepseek_v4.common.ops import cache_utils
    from vllm.models.deepseek_v4.nvidia import flashmla
    from vllm.v1.attention.backends.mla import compressor_utils
    from vllm.v1.attention.backends.mla import indexer as indexer_backend

    register()
    store = CompressNormRopeStoreKernel()
    patches.set(_cutedsl_compressor_module(), "_SPARSE_ATTN_COMPRESSOR_CUTEDSL_KERNEL", store)
    patches.set(compressor, "current_platform", _CudaView(compressor.current_platform))
    patches.set(compressor, "_SAVE_PARTIAL_STATES_KERNEL", SavePartialStatesKernel())
    patches.set(fused_compress, "_FUSED_KV_COMPRESS_NORM_ROPE_INSERT_INDEXER_TRITON_KERNEL", store)
    patches.set(attention, "fused_indexer_q_rope_quant", fused_indexer_q_rope_quant_dropin)
    patches.set(attention, "_fill_short_context_topk_indices", FillShortContextKernel())
    patches.set(attention, "triton", _TritonHelpers(attention.triton))  # its launch reads triton.next_power_of_2
    patches.set(indexer_layer, "fp8_fp4_paged_mqa_logits", fp8_fp4_paged_mqa_logits_dropin)
    patches.set(indexer_layer, "fp8_fp4_mqa_logits", fp8_fp4_mqa_logits_dropin)
    patches.set(indexer_backend, "_BUILD_PREFILL_CHUNK_METADATA_KERNEL", BuildPrefillChunkMetadataKernel())
    patches.set(cache_utils, "_COMPUTE_GLOBAL_TOPK_INDICES_AND_LENS_KERNEL", ComputeGlobalTopkKernel())
    patches.set(sparse_mla, "_BUILD_C128A_TOPK_METADATA_KERNEL", BuildC128AKernel())
    patches.set(compressor_utils, "_COMPRESSED_SLOT_MAPPING_KERNEL", CompressedSlotMappingKernel())
    assert flashmla.compute_global_topk_indices_and_lens is cache_utils.compute_global_topk_indices_and_lens


class _TritonHelpers:
    """vLLM's ``triton`` placeholder (Triton is disabled without a GPU driver) with
    the host helper the kernel launches read, ``next_power_of_2``."""

    def __init__(self, placeholder: Any):
        self._placeholder = placeholder

    @staticmethod
    def next_power_of_2(n: int) -> int:
        return 1 << (int(n) - 1).bit_length() if n > 0 else 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._placeholder, name)


def _cutedsl_compressor_module() -> types.ModuleType:
    """vLLM's CuTe DSL compressor module, or, where it cannot import (it needs
    ``cutlass``), an empty module in its place in ``sys.modules`` (kept, like
    ``kernels.flashmla.install_flashmla_stub``), for the drop-in to be bound in."""
    import importlib

    try:
        return importlib.import_module(CUTEDSL_COMPRESSOR)
    except ImportError:
        pass
    module = sys.modules.get(CUTEDSL_COMPRESSOR)
    if module is None:
        module = types.ModuleType(CUTEDSL_COMPRESSOR, "capturelint stand-in: the CuTe DSL compressor is a CPU reference")
        module.__capturelint_stub__ = True  # type: ignore[attr-defined]
        sys.modules[CUTEDSL_COMPRESSOR] = module
    return module


__all__ = [
    "IMPLS", "REFERENCE_KERNELS", "BuildC128AKernel", "CompressNormRopeStoreKernel", "CompressedSlotMappingKernel",
    "ComputeGlobalTopkKernel", "FillShortContextKernel", "SavePartialStatesKernel", "build_c128a_topk_metadata",
    "compress_norm_rope_store", "compressed_slot_mapping", "compute_global_topk_indices_and_lens",
    "fill_short_context_topk_indices", "fp8_paged_mqa_logits", "fused_indexer_q_rope_quant", "install", "register",
    "save_partial_states", "top_k_per_row_decode",
]
