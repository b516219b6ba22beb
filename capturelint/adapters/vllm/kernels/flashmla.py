"""CPU references for FlashMLA's sparse attention (``torch.ops._flashmla_C``, from a
``.so`` that needs CUDA to load), which the DeepSeek V4 attention reaches through the
vendored ``vllm/third_party/flashmla/flash_mla_interface.py``.

``sparse_decode_fwd`` (``torch.ops._flashmla_C.sparse_decode_fwd``)
    FlashMLA sparse fp8 decode, DeepSeek V4 layout, as ``flash_mla_with_kvcache`` of the
    vendored ``vllm/third_party/flashmla/flash_mla_interface.py`` calls it: per query,
    one softmax over the ``fp8_ds_mla`` rows of ``k_cache`` at ``indices`` (flat slots
    ``block * block_size + offset``) and, jointly, those of ``extra_k_cache`` at
    ``extra_indices``; K is the whole dequantized 512-dim row, V its first ``head_dim_v``
    dims. Returns ``(out, lse [b, h_q, s_q], tile_scheduler_metadata, num_splits)``.
``sparse_prefill_fwd`` (``torch.ops._flashmla_C.sparse_prefill_fwd``)
    The prefill kernel behind ``flash_mla_sparse_fwd``: the same attention over bf16
    ``kv [s_kv, 1, d_qk]`` rows; returns ``(out, max_logits, lse)``, each ``[s_q, h_q]``.
``install_flashmla_stub``
    Puts an empty ``vllm._flashmla_C`` in ``sys.modules`` when the real one cannot load,
    so the vendored interface imports and reaches the registered references.

Attention numerics (both FlashMLA ops): K rows are dequantized to fp32 (exactly the
bf16 values the kernel feeds its tensor cores), scores ``q . k * softmax_scale`` and the
softmax in fp32 with the probabilities left in fp32 (the kernel rounds them to bf16
before P@V), one rounding of the output. ``lse`` is the natural log-sum-exp of the
scaled scores of the valid rows, without the sink. With ``attn_sink [h_q]`` the output
is ``sum_t exp(s_t) v_t / (sum_t exp(s_t) + exp(sink_h))``, i.e. scaled by
``exp(lse) / (exp(lse) + exp(sink))`` (``+inf`` gives 0, ``-inf`` no effect). A query
with no valid row (all indices negative, out of range or past ``topk_length``) gets
output 0 and lse ``+inf`` (prefill: ``max_logits`` ``-inf``), sink or not. An index
repeated in a query's list counts once per occurrence, as in the kernel.

Limits: ``sparse_decode_fwd`` reads only the V4 584-byte layout (V4.1's 528/288-byte and
V3.2's 656-byte caches raise ``NotImplementedError``), one KV head, a 512-dim q and
``head_dim_v`` 512. Out-of-range indices are skipped like ``-1`` (the CUDA kernel would
read out of bounds). ``out`` may be strided here; the kernel wants it contiguous. The
tile-scheduler tensors are passed through, or allocated once as zeros ``(1, 8)`` /
``(b+1,)`` int32; their values mean nothing on CPU. ``enable_batch_invariant`` has no
effect: the reference never splits KV. Attention materializes the gathered rows
(``b*s_q*topk*512`` fp32): meant for the small shapes of a CPU check, not for long
contexts. FlashMLA's dense decode is not covered. The ``_flashmla_C`` schemas follow the
argument order of the vendored interface (the ``.so``'s own cannot be read without
CUDA). ``install_flashmla_stub`` only installs the module; registering the ops defines
them.
"""

from __future__ import annotations

import importlib
import sys
import types

import torch

from capturelint.adapters.vllm.kernels.fp8_ds_mla import HEAD_DIM, TOKEN_BYTES, dequantize_fp8_ds_mla
from capturelint.adapters.vllm.kernels.library import Impls

FLASHMLA_NAMESPACE = "_flashmla_C"
SPARSE_DECODE = "sparse_decode_fwd"
SPARSE_PREFILL = "sparse_prefill_fwd"
TILE_SCHEDULER_METADATA_SIZE = 8  # int32 words per scheduler part in FlashMLA


def _sparse_softmax_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    valid: torch.Tensor,
    softmax_scale: float,
    head_dim_v: int,
    attn_sink: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Softmax attention of ``q [N, H, D]`` over per-query key rows ``keys [N, T, D]``.

    ``valid [N, T]`` masks the rows; V is ``keys[..., :head_dim_v]``. Returns fp32
    ``(out [N, H, head_dim_v], lse [N, H], max_logits [N, H])``: ``lse`` is the natural
    log-sum-exp of the scaled scores (the sink left out), ``+inf`` for a query with no
    valid row, whose output is 0; ``max_logits`` is ``-inf`` there. The sink adds
    ``exp(attn_sink[h])`` to the denominator of the output only.
    """
    # Invalid rows were gathered from slot 0 or hold garbage bytes (fp8 NaN): zero them so
    # that a 0 probability times a NaN value cannot poison the output.
    keys = keys.masked_fill(~valid[..., None], 0.0)
    scores = torch.einsum("nhd,ntd->nht", q.float(), keys) * softmax_scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # -inf where nothing is valid (and for T == 0)
    if scores.shape[-1] > 0:
        max_logits = scores.amax(dim=-1)
    else:
        max_logits = torch.full_like(lse, float("-inf"))
    denominator = lse if attn_sink is None else torch.logaddexp(lse, attn_sink.float()[None, :])
    # A query whose denominator is 0 (no valid row, sink absent or -inf) gets 0, not NaN.
    denominator = denominator.masked_fill(denominator == float("-inf"), float("inf"))
    probs = torch.exp(scores - denominator[..., None])
    out = torch.einsum("nht,ntd->nhd", probs, keys[..., :head_dim_v])
    lonely = lse == float("-inf")
    out = out.masked_fill(lonely[..., None], 0.0)
    lse = lse.masked_fill(lonely, float("inf"))
    return out, lse, max_logits


def _fp8_ds_mla_block_view(k_cache: torch.Tensor, name: str) -> torch.Tensor:
    """The 2-D ``[num_blocks, block_size*584]`` byte view of a FlashMLA-shaped
    ``[num_blocks, block_size, 1, 584]`` cache (block rows may be padded)."""
    if k_cache.dtype != torch.uint8 or k_cache.dim() != 4:
        raise ValueError(f"{name} must be a 4-D uint8 tensor, got {k_cache.dtype} {tuple(k_cache.shape)}")
    num_blocks, block_size, h_k, token_bytes = k_cache.shape
    if token_bytes != TOKEN_BYTES:
        raise NotImplementedError(
            f"{name}: {token_bytes} bytes per token; the reference reads only DeepSeek V4's "
            f"{TOKEN_BYTES}-byte fp8_ds_mla layout (not V4.1's 528/288 nor V3.2's 656)"
        )
    if h_k != 1:
        raise ValueError(f"{name} must have one KV head, got {h_k}")
    if k_cache.stride(3) != 1 or k_cache.stride(1) != TOKEN_BYTES or k_cache.stride(0) < block_size * TOKEN_BYTES:
        raise ValueError(f"{name} must hold each block's {block_size * TOKEN_BYTES} bytes contiguously")
    return k_cache.as_strided(
        (num_blocks, block_size * TOKEN_BYTES), (k_cache.stride(0), 1), k_cache.storage_offset()
    )


def _gather_sparse_rows(
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None,
    name: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantized rows ``[b, s_q, topk, 512]`` fp32 at the flat slot ``indices`` and
    their validity ``[b, s_q, topk]``: ``0 <= index < num_slots`` and, with
    ``topk_length``, position ``< topk_length[b]``."""
    blocks = _fp8_ds_mla_block_view(k_cache, name)
    block_size = k_cache.shape[1]
    if indices.dim() != 3 or indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} indices must be an integer [b, s_q, topk] tensor, got {tuple(indices.shape)}")
    b, s_q, topk = indices.shape
    idx = indices.to(device=k_cache.device, dtype=torch.int64)
    valid = (idx >= 0) & (idx < k_cache.shape[0] * block_size)
    if topk_length is not None:
        if topk_length.shape != (b,):
            raise ValueError(f"{name} topk_length must be [{b}], got {tuple(topk_length.shape)}")
        position = torch.arange(topk, device=idx.device)
        valid &= position[None, None, :] < topk_length.to(idx.device, torch.int64)[:, None, None]
    safe = torch.where(valid, idx, torch.zeros_like(idx))
    rows = dequantize_fp8_ds_mla(blocks, safe.reshape(-1), block_size)
    return rows.reshape(b, s_q, topk, HEAD_DIM), valid


def sparse_decode_fwd(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    indices_in_kvcache: torch.Tensor,
    topk_length: torch.Tensor | None,
    attn_sink: torch.Tensor | None,
    tile_scheduler_metadata: torch.Tensor | None,
    num_splits: torch.Tensor | None,
    extra_k_cache: torch.Tensor | None,
    extra_indices_in_kvcache: torch.Tensor | None,
    extra_topk_length: torch.Tensor | None,
    head_dim_v: int,
    softmax_scale: float,
    out: torch.Tensor | None,
    enable_batch_invariant: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashMLA sparse fp8 decode (DeepSeek V4 layout), as ``flash_mla_with_kvcache`` calls it.

    ``q [b, s_q, h_q, 512]`` bf16 attends, in one softmax, to the ``fp8_ds_mla`` rows of
    ``k_cache [num_blocks, block_size, 1, 584]`` at the flat slots
    ``indices_in_kvcache [b, s_q, topk]`` (``block * block_size + offset``; negative or
    out-of-range slots and positions ``>= topk_length[b]`` are skipped) and, when given,
    to those of ``extra_k_cache`` at ``extra_indices_in_kvcache`` (its own block size and
    ``extra_topk_length``). Scores are ``q . k * softmax_scale`` over all 512 dims; V is the
    first ``head_dim_v`` dims of the same row. ``attn_sink [h_q]`` scales the output by
    ``exp(lse) / (exp(lse) + exp(sink))`` and leaves lse alone.

    Returns ``(out [b, s_q, h_q, head_dim_v] in q's dtype, lse [b, h_q, s_q] fp32,
    tile_scheduler_metadata, num_splits)``; ``out`` is the given tensor, written in place,
    when one is passed. A query with no valid row gets output 0 and lse ``+inf``. The
    scheduler tensors are returned as passed, or on the first call (None) allocated as
    zeros ``(1, 8)`` and ``(b + 1,)`` int32: the reference has no tile scheduler.
    ``enable_batch_invariant`` changes nothing (the reference never splits KV).
    """
    if q.dim() != 4 or q.shape[-1] != HEAD_DIM:
        raise ValueError(f"q must be [b, s_q, h_q, {HEAD_DIM}], got {tuple(q.shape)}")
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"q must be bfloat16 or float16, got {q.dtype}")
    if head_dim_v != HEAD_DIM:
        raise ValueError(f"head_dim_v must be {HEAD_DIM}, got {head_dim_v}")
    if (extra_k_cache is None) != (extra_indices_in_kvcache is None):
        raise ValueError("extra_k_cache and extra_indices_in_kvcache come together")
    b, s_q, h_q, _ = q.shape
    if indices_in_kvcache.shape[:2] != (b, s_q):
        raise ValueError(f"indices must be [{b}, {s_q}, topk], got {tuple(indices_in_kvcache.shape)}")
    if attn_sink is not None and attn_sink.shape != (h_q,):
        raise ValueError(f"attn_sink must be [{h_q}], got {tuple(attn_sink.shape)}")
    if out is not None and (tuple(out.shape) != (b, s_q, h_q, head_dim_v) or out.dtype != q.dtype):
        raise ValueError(f"out must be {q.dtype} [{b}, {s_q}, {h_q}, {head_dim_v}], got {out.dtype} {tuple(out.shape)}")

    rows, valid = _gather_sparse_rows(k_cache, indices_in_kvcache, topk_length, "k_cache")
    if extra_k_cache is not None:
        if extra_indices_in_kvcache.shape[:2] != (b, s_q):
            raise ValueError(
                f"extra_indices_in_kvcache must be [{b}, {s_q}, extra_topk], "
                f"got {tuple(extra_indices_in_kvcache.shape)}"
            )
        extra_rows, extra_valid = _gather_sparse_rows(
            extra_k_cache, extra_indices_in_kvcache, extra_topk_length, "extra_k_cache"
        )
        rows = torch.cat((rows, extra_rows), dim=2)
        valid = torch.cat((valid, extra_valid), dim=2)

    n = b * s_q
    result, lse, _ = _sparse_softmax_attention(
        q.reshape(n, h_q, HEAD_DIM),
        rows.reshape(n, -1, HEAD_DIM),
        valid.reshape(n, -1),
        softmax_scale,
        head_dim_v,
        attn_sink,
    )
    result = result.reshape(b, s_q, h_q, head_dim_v)
    if out is None:
        out = result.to(q.dtype)
    else:
        out.copy_(result)
    lse = lse.reshape(b, s_q, h_q).transpose(1, 2).contiguous()
    if tile_scheduler_metadata is None:
        tile_scheduler_metadata = torch.zeros(
            (1, TILE_SCHEDULER_METADATA_SIZE), dtype=torch.int32, device=q.device
        )
    if num_splits is None:
        num_splits = torch.zeros(b + 1, dtype=torch.int32, device=q.device)
    return out, lse, tile_scheduler_metadata, num_splits


def sparse_prefill_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int,
    attn_sink: torch.Tensor | None,
    topk_length: torch.Tensor | None,
    out: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashMLA sparse prefill, as ``flash_mla_sparse_fwd`` calls it.

    ``q [s_q, h_q, d_qk]`` attends to the bf16 rows ``kv [s_kv, 1, d_qk]`` at
    ``indices [s_q, 1, topk]`` (``-1`` or ``>= s_kv`` invalid; with ``topk_length [s_q]``
    only the leading ``topk_length[i]`` count); V is ``kv[..., :d_v]``; the sink as in
    ``sparse_decode_fwd``. Returns ``(out [s_q, h_q, d_v] in kv's dtype, max_logits
    [s_q, h_q] fp32, lse [s_q, h_q] fp32)``: the scaled max score (``-inf`` with no valid
    row) and natural log-sum-exp (``+inf`` with no valid row, output 0 there).
    """
    if q.dim() != 3 or kv.dim() != 3 or kv.shape[1] != 1 or kv.shape[2] != q.shape[2]:
        raise ValueError(f"q must be [s_q, h_q, d_qk] and kv [s_kv, 1, d_qk], got {tuple(q.shape)}, {tuple(kv.shape)}")
    s_q, h_q, d_qk = q.shape
    if indices.dim() != 3 or indices.shape[:2] != (s_q, 1):
        raise ValueError(f"indices must be [{s_q}, 1, topk], got {tuple(indices.shape)}")
    if not 0 < d_v <= d_qk:
        raise ValueError(f"d_v must be in 1..{d_qk}, got {d_v}")
    if attn_sink is not None and attn_sink.shape != (h_q,):
        raise ValueError(f"attn_sink must be [{h_q}], got {tuple(attn_sink.shape)}")
    if out is not None and tuple(out.shape) != (s_q, h_q, d_v):
        raise ValueError(f"out must be [{s_q}, {h_q}, {d_v}], got {tuple(out.shape)}")
    idx = indices[:, 0].to(device=kv.device, dtype=torch.int64)
    valid = (idx >= 0) & (idx < kv.shape[0])
    if topk_length is not None:
        if topk_length.shape != (s_q,):
            raise ValueError(f"topk_length must be [{s_q}], got {tuple(topk_length.shape)}")
        position = torch.arange(idx.shape[1], device=idx.device)
        valid &= position[None, :] < topk_length.to(idx.device, torch.int64)[:, None]
    keys = kv[:, 0].float()[torch.where(valid, idx, torch.zeros_like(idx))]  # [s_q, topk, d_qk]
    result, lse, max_logits = _sparse_softmax_attention(q, keys, valid, sm_scale, d_v, attn_sink)
    if out is None:
        out = result.to(kv.dtype)
    else:
        out.copy_(result)
    return out, max_logits, lse


def install_flashmla_stub() -> bool:
    """Let ``import vllm._flashmla_C`` succeed where the compiled module cannot load.

    vLLM's vendored ``vllm/third_party/flashmla/flash_mla_interface.py`` imports
    ``vllm._flashmla_C`` for the side effect of registering ``torch.ops._flashmla_C``; on
    a machine without CUDA the ``.so`` fails to load (``libcuda.so.1``). When that import
    fails this puts an empty module at ``sys.modules["vllm._flashmla_C"]`` (and the
    ``vllm`` package attribute), so the interface imports and its
    ``flash_mla_with_kvcache`` / ``flash_mla_sparse_fwd`` reach the ops that
    ``register_reference_kernels`` defines. Returns True when it installed the stub,
    False when the real module (or an earlier stub) is already importable. vLLM itself
    must be importable: its ``ModuleNotFoundError`` propagates.
    """
    name = "vllm._flashmla_C"
    if name in sys.modules:
        return False
    try:
        importlib.import_module(name)
        return False
    except ImportError:
        if "vllm" not in sys.modules:
            raise
    stub = types.ModuleType(name, "capturelint stub: the compiled FlashMLA ops are CPU references")
    stub.__capturelint_stub__ = True  # type: ignore[attr-defined]
    sys.modules[name] = stub
    sys.modules["vllm"]._flashmla_C = stub  # type: ignore[attr-defined]
    return True


def _sparse_decode_fake(
    q, k_cache, indices_in_kvcache, topk_length, attn_sink, tile_scheduler_metadata, num_splits,
    extra_k_cache, extra_indices_in_kvcache, extra_topk_length, head_dim_v, softmax_scale, out,
    enable_batch_invariant,
):
    b, s_q, h_q, _ = q.shape
    if out is None:
        out = q.new_empty((b, s_q, h_q, head_dim_v))
    lse = q.new_empty((b, h_q, s_q), dtype=torch.float32)
    if tile_scheduler_metadata is None:
        tile_scheduler_metadata = q.new_empty((1, TILE_SCHEDULER_METADATA_SIZE), dtype=torch.int32)
    if num_splits is None:
        num_splits = q.new_empty((b + 1,), dtype=torch.int32)
    return out, lse, tile_scheduler_metadata, num_splits


def _sparse_prefill_fake(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, out):
    s_q, h_q, _ = q.shape
    if out is None:
        out = kv.new_empty((s_q, h_q, d_v))
    return out, q.new_empty((s_q, h_q), dtype=torch.float32), q.new_empty((s_q, h_q), dtype=torch.float32)


# The schemas follow the arguments of the vendored interface, the written ones annotated
# Tensor(a!) so functionalization sees the mutations.
IMPLS: Impls = {
    f"{FLASHMLA_NAMESPACE}::{SPARSE_DECODE}": (
        (
            "(Tensor q, Tensor k_cache, Tensor indices_in_kvcache, Tensor? topk_length, "
            "Tensor? attn_sink, Tensor? tile_scheduler_metadata, Tensor? num_splits, "
            "Tensor? extra_k_cache, Tensor? extra_indices_in_kvcache, Tensor? extra_topk_length, "
            "int head_dim_v, float softmax_scale, Tensor(a!)? out, bool enable_batch_invariant) "
            "-> (Tensor, Tensor, Tensor, Tensor)"
        ),
        sparse_decode_fwd, _sparse_decode_fake,
    ),
    f"{FLASHMLA_NAMESPACE}::{SPARSE_PREFILL}": (
        (
            "(Tensor q, Tensor kv, Tensor indices, float sm_scale, int d_v, Tensor? attn_sink, "
            "Tensor? topk_length, Tensor(a!)? out) -> (Tensor, Tensor, Tensor)"
        ),
        sparse_prefill_fwd, _sparse_prefill_fake,
    ),
}


__all__ = ["FLASHMLA_NAMESPACE", "IMPLS", "SPARSE_DECODE", "SPARSE_PREFILL", "install_flashmla_stub",
           "sparse_decode_fwd", "sparse_prefill_fwd"]
