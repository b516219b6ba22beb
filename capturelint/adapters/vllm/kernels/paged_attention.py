"""CPU references for the two Triton kernels of vLLM's Triton attention backend
(``v1/attention/backends/triton_attn.py``), which the generic attention family runs:

``reference_reshape_and_cache`` / ``reshape_and_cache_flash``
    vLLM's ``triton_reshape_and_cache_flash`` (``v1/attention/ops/
    triton_reshape_and_cache_flash.py``), called by ``TritonAttentionImpl.
    do_kv_cache_update`` from ``unified_kv_cache_update``, **in captured code**: token
    ``t`` with ``slot_mapping[t] >= 0`` writes its key and value rows to
    ``key_cache[slot // block_size, slot % block_size]`` (and the value cache alike);
    ``slot < 0`` (padding, a dummy run) writes nothing. Registered as
    ``torch.ops.capturelint_vllm.reshape_and_cache_flash``.
``reference_unified_attention`` / ``unified_attention``
    vLLM's ``unified_attention`` (``v1/attention/ops/triton_unified_attention.py``),
    called by ``TritonAttentionImpl.forward`` inside the eager break
    ``unified_attention_with_output`` (and captured whole in FULL graphs): query row ``t``
    of request ``b`` (``cu_seqlens_q[b] <= t < cu_seqlens_q[b+1]``) sits at position
    ``seqused_k[b] - query_len[b] + (t - cu_seqlens_q[b])`` and attends, with
    ``softmax_scale`` and grouped KV heads (query head ``h`` reads KV head
    ``h // (Hq // Hkv)``), to the keys of positions ``j < seqused_k[b]`` read through
    ``block_table[b]`` (causal: ``j <= position``; a sliding window ``window_size[0] =
    W - 1 >= 0``: ``j > position - W``; ``softcap > 0``: ``softcap * tanh(s /
    softcap)``). Rows past ``cu_seqlens_q[-1]`` are not written (the kernel launches no
    program for them). Registered as ``torch.ops.capturelint_vllm.unified_attention``.

Why references and not Triton's interpreter (``kernels.interpreter``), which runs
vLLM's own source: the cache write is captured in every mode, and in FULL graphs the
attention is captured too, and the interpreter reads its arguments into numpy, which a
capture would record as copies of capture-time values. Both references are written in
tensor ops with no host read (the request of each row by ``searchsorted``, the keys by
gathering the block table's slots, masked), so they are capture-safe; they compute in
float32 (the kernel's accumulator) and cast once to the output's dtype, where the
kernel casts the probabilities to the cache's dtype before ``P @ V``.
``tests/vllm/test_paged_attention.py`` runs vLLM's ``unified_attention`` in Triton's
interpreter against the attention reference (fp32: the interpreter computes bf16 tiles
wrongly) and checks the cache write against its documented semantics (its launcher asks
a CUDA device for its capability).

Limits: a bf16/fp16/fp32 cache (``kv_cache_dtype="auto"``); no ALiBi, attention sinks,
multimodal prefix ranges, R-SWA, chunked lookback, per-token-head quantisation or
output scale (a call with one is a one-line error naming it); the 2D/3D kernel split
(``seq_threshold_3D``) and its softmax-segment scratch are the kernel's launch choice
and do not change the result.
"""

from __future__ import annotations

from typing import Any

import torch

from capturelint.adapters.vllm.kernels.library import OWN_NAMESPACE, Impls, no_result_fake, own_op
from capturelint.errors import CapturelintError

RESHAPE_AND_CACHE = "reshape_and_cache_flash"
UNIFIED_ATTENTION = "unified_attention"


def reference_reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                                value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write ``key``/``value [T, H, D]`` rows to the paged caches ``[blocks, block_size, H,
    D]`` at ``slot_mapping [n]`` (``n <= T``; slot < 0 skipped)."""
    if key_cache.dim() != 4 or key.dim() != 3 or key.shape[1:] != key_cache.shape[2:]:
        raise ValueError(f"key {tuple(key.shape)} and key_cache {tuple(key_cache.shape)} must be [T, H, D] and "
                         "[blocks, block_size, H, D]")
    n = slot_mapping.shape[0]
    block_size = key_cache.shape[1]
    # slot < 0 is skipped: those rows write the value already in slot 0 back to it (no
    # host read of the mask, so a capture records the same ops for any slots); vLLM's
    # block 0 is the null block, which no request owns.
    valid = slot_mapping >= 0
    slots = torch.where(valid, slot_mapping, torch.zeros_like(slot_mapping))
    block = torch.div(slots, block_size, rounding_mode="floor")
    offset = slots - block * block_size
    for rows, cache in ((key[:n], key_cache), (value[:n], value_cache)):
        keep = cache[block, offset]
        cache.index_put_((block, offset), torch.where(valid[:, None, None], rows.to(cache.dtype), keep))


def reference_unified_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                                cu_seqlens_q: torch.Tensor, seqused_k: torch.Tensor, block_table: torch.Tensor,
                                softmax_scale: float, causal: bool, window_left: int, softcap: float) -> None:
    """Paged attention of ``q [T, Hq, D]`` over ``k``/``v [blocks, block_size, Hkv, D]``
    into ``out [T', Hq, Dv]`` (the first ``cu_seqlens_q[-1]`` rows); see the module
    docstring."""
    num_tokens, num_heads, head_dim = q.shape
    blocks, block_size, kv_heads, _ = k.shape
    if num_heads % kv_heads:
        raise ValueError(f"{num_heads} query heads are not a multiple of {kv_heads} KV heads")
    num_seqs = seqused_k.shape[0]
    rows = torch.arange(num_tokens, device=q.device)
    ends = cu_seqlens_q[1:].to(torch.int64)
    req = torch.searchsorted(ends, rows, right=True)  # the request of each row
    live = req < num_seqs
    req = req.clamp(max=num_seqs - 1)
    start = cu_seqlens_q[req].to(torch.int64)
    query_len = ends[req] - start
    seq_len = seqused_k[req].to(torch.int64)
    position = seq_len - query_len + (rows - start)
    table = block_table[req].to(torch.int64).clamp(0, blocks - 1)  # [T, max_blocks]
    span = table.shape[1] * block_size
    slots = (table[:, :, None] * block_size + torch.arange(block_size, device=q.device)).reshape(num_tokens, span)
    keys = k.reshape(blocks * block_size, kv_heads, head_dim)[slots].float()  # [T, L, Hkv, D]
    values = v.reshape(blocks * block_size, kv_heads, v.shape[-1])[slots].float()
    j = torch.arange(span, device=q.device)[None, :]
    mask = j < seq_len[:, None]
    if causal:
        mask = mask & (j <= position[:, None])
    if window_left >= 0:
        mask = mask & (j > position[:, None] - (window_left + 1))
    group = num_heads // kv_heads
    qf = q.float().view(num_tokens, kv_heads, group, head_dim)
    scores = torch.einsum("thgd,tlhd->thgl", qf, keys) * softmax_scale
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no key (not live) has none
    result = torch.einsum("thgl,tlhd->thgd", probs, values).reshape(num_tokens, num_heads, -1)
    n = min(num_tokens, out.shape[0])
    out[:n].copy_(torch.where(live[:n, None, None], result[:n].to(out.dtype), out[:n]))


def reshape_and_cache_flash(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                            value_cache: torch.Tensor, slot_mapping: torch.Tensor, kv_cache_dtype: str,
                            k_scale: Any = None, v_scale: Any = None, interleaved_v_pack_factor: int = 0) -> None:
    """vLLM's ``triton_reshape_and_cache_flash`` signature over the reference op."""
    if kv_cache_dtype not in ("auto", "bfloat16", "float16", "float32") or key_cache.dim() != 4 \
            or interleaved_v_pack_factor:
        raise CapturelintError(f"the generic attention family's reshape_and_cache reference takes an unquantised "
                               f"[blocks, block_size, heads, head_size] cache, not kv_cache_dtype={kv_cache_dtype} "
                               f"with a {key_cache.dim()}-D cache")
    own_op(RESHAPE_AND_CACHE, IMPLS)(key, value, key_cache, value_cache, slot_mapping)


_UNSUPPORTED = ("alibi_slopes", "output_scale", "qq_bias", "sinks", "mm_prefix_range", "rswa_prefix_lens",
                "rswa_window", "k_scale_cache", "v_scale_cache", "q_descale")


def unified_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, cu_seqlens_q: torch.Tensor,
                      max_seqlen_q: int, seqused_k: torch.Tensor, max_seqlen_k: int, softmax_scale: float,
                      causal: Any, window_size: Any, block_table: torch.Tensor, softcap: float, q_descale: Any,
                      k_descale: Any, v_descale: Any, **kwargs: Any) -> None:
    """vLLM's ``unified_attention`` signature over the reference op; the features the
    reference lacks (module docstring) are refused in one line."""
    given = [name for name in _UNSUPPORTED if (q_descale if name == "q_descale" else kwargs.get(name)) is not None]
    if kwargs.get("chunk_lookback", -1) > -1:
        given.append("chunk_lookback")
    if isinstance(causal, torch.Tensor):
        given.append("per-sequence causal")
    if given or k.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise CapturelintError(f"vLLM's unified_attention was called with {', '.join(given) or f'a {k.dtype} cache'}, "
                               "which capturelint's reference (kernels/paged_attention.py) does not implement")
    window_left = int(window_size[0]) if window_size is not None else -1
    own_op(UNIFIED_ATTENTION, IMPLS)(q, k, v, out, cu_seqlens_q, seqused_k, block_table, float(softmax_scale),
                                     bool(causal), window_left, float(softcap or 0.0))


IMPLS: Impls = {
    f"{OWN_NAMESPACE}::{RESHAPE_AND_CACHE}": (
        "(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor slot_mapping) -> ()",
        reference_reshape_and_cache, no_result_fake,
    ),
    f"{OWN_NAMESPACE}::{UNIFIED_ATTENTION}": (
        "(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor cu_seqlens_q, Tensor seqused_k, Tensor block_table, "
        "float softmax_scale, bool causal, int window_left, float softcap) -> ()",
        reference_unified_attention, no_result_fake,
    ),
}


__all__ = ["IMPLS", "RESHAPE_AND_CACHE", "UNIFIED_ATTENTION", "reference_reshape_and_cache",
           "reference_unified_attention", "reshape_and_cache_flash", "unified_attention"]
