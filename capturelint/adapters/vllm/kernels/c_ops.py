"""CPU references for vLLM's ``_C`` ops the DeepSeek V4 attention calls.

vLLM 0.33.0's DeepSeek V4 attention (``DeepseekV4Attention._fused_qnorm_rope_kv_insert``)
hands its query and its new KV row to one fused CUDA op from ``vllm._C``, picked by the
dtype of the sliding-window KV cache:

* ``uint8`` cache (``fp8_ds_mla``): ``fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert``
  returns a new, head-padded q and quantizes the KV row into a paged byte cache;
* ``bfloat16`` cache: ``fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert``
  rewrites q in place and stores the KV row as it is (after RoPE).

On a machine without vLLM's compiled ``_C`` those ops do not exist, so vLLM's model code
cannot run; they are written again here as small torch functions (from the semantics of
the CUDA kernel, not copied from vLLM), registered as ``torch.ops._C.<name>`` so that
unchanged vLLM code finds them.

``fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert``
  returns a new, head-padded q and quantizes the KV row into a paged byte cache;
* ``bfloat16`` cache: ``fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert``
  rewrites q in place and stores the KV row as it is (after RoPE).

On a machine without vLLM's compiled ``_C`` those ops do not exist, so vLLM's model code
cannot run. This module writes the two ops again as small torch functions (written from
the semantics of the CUDA kernel, not copied from vLLM), and can register them as
``fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert``
  rewrites q in place and stores the KV row as it is (after RoPE).

On a machine without vLLM's compiled ``_C`` those ops do not exist, so vLLM's model code
cannot run. This module writes the two ops again as small torch functions (written from
the semantics of the CUDA kernel, not copied from vLLM), and can register them as
``weak_ref_tensor`` (``torch.ops._C.weak_ref_tensor``)
    On CPU an alias of its input (same storage, sizes, strides, offset). The CUDA op
    wraps the pointer in a tensor that does not own the memory; the alias here keeps
    the storage alive, so it cannot show a use-after-free the GPU would have. Its
    schema is ``(Tensor(a) t) -> Tensor(a)`` (vLLM's says ``(Tensor) -> Tensor``), so a
    tracer reading return aliasing does not count it as an allocation.

Insert numerics, as in the CUDA kernel: all math in fp32 with the fp32 ``cos_sin_cache``
(``[max_pos, 64]``: 32 cosines, then 32 sines; pair ``i`` is dims ``448+2i, 448+2i+1``,
``even' = even*cos - odd*sin``, ``odd' = even*sin + odd*cos``); one rounding of q at the
end. A quant block's scale is ``2^e`` with ``e = ceil(log2(max(amax, 1e-4) / 448))``,
its byte ``clamp(e + 127, 0, 255)``; values are ``clamp(x * 2^-e, -448, 448)`` rounded to
nearest-even e4m3 (subnormals kept). A zero block thus gets ``e = -22``, byte 105.

Limits: the per-tensor-fp8 full-cache op and the KV-only inserts are not covered. The
defaulted arguments vLLM 0.33.0's schema adds for DeepSeek V4.1 (``kv_mxfp8``,
``is_q_interleaved``) are accepted only at their defaults (False); ``apply_q_norm`` and
``apply_q_rope`` are honoured (False skips that Q step). The CUDA kernel only
instantiates ``q_head_padded`` in {8, 16, 32, 64, 128}; the reference takes any value
>= the live head count. Duplicate slots: the last token wins here; on the GPU the order
is unspecified. q/kv in fp16 are accepted like the kernel does (the RoPE bytes are then
fp16). vLLM's own AVX512 CPU port (``fused_qnorm_rope_kv_insert_cpu``) floors the
*scale*, not the absmax, at 1e-4 and flushes fp8 subnormals; this reference follows the
CUDA kernel (and the Triton ``quantize_and_insert_k_cache``) instead.
"""

from __future__ import annotations

import torch

from capturelint.adapters.vllm.kernels.fp8_ds_mla import (
    HEAD_DIM,
    NOPE_DIM,
    ROPE_DIM,
    apply_gptj_rope,
    check_fp8_ds_mla_cache,
    cos_sin,
    write_fp8_ds_mla,
)
from capturelint.adapters.vllm.kernels.library import Impls

QUANT_INSERT = "fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert"
FULL_CACHE_BF16_INSERT = "fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert"
WEAK_REF = "weak_ref_tensor"


def _q_side(
    q: torch.Tensor,
    position_ids: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    eps: float,
    apply_q_norm: bool,
    apply_q_rope: bool,
) -> torch.Tensor:
    """Normed and roped q ``[N, H, 512]`` in fp32 (not yet rounded)."""
    x = q.float()
    if apply_q_norm:
        x = x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps)
    if apply_q_rope:
        cos, sin = cos_sin(cos_sin_cache, position_ids)
        rope = apply_gptj_rope(x[..., NOPE_DIM:], cos[:, None, :], sin[:, None, :])
        x = torch.cat((x[..., :NOPE_DIM], rope), dim=-1)
    return x


def _kv_side(kv: torch.Tensor, position_ids: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """KV rows ``[n, 512]`` with RoPE on the last 64 dims, rounded to kv's dtype."""
    cos, sin = cos_sin(cos_sin_cache, position_ids)
    x = kv.float()
    rope = apply_gptj_rope(x[:, NOPE_DIM:], cos, sin)
    return torch.cat((x[:, :NOPE_DIM], rope), dim=-1).to(kv.dtype)


def _check_common(q: torch.Tensor, kv: torch.Tensor, slot_mapping, position_ids, cos_sin_cache) -> None:
    if q.dim() != 3 or q.shape[2] != HEAD_DIM:
        raise ValueError(f"q must be [N, H, {HEAD_DIM}], got {tuple(q.shape)}")
    if kv.dim() != 2 or kv.shape[1] != HEAD_DIM:
        raise ValueError(f"kv must be [N, {HEAD_DIM}], got {tuple(kv.shape)}")
    if q.dtype != kv.dtype or q.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"q and kv must share a 16-bit float dtype, got {q.dtype} and {kv.dtype}")
    if slot_mapping.dtype != torch.int64 or position_ids.dtype != torch.int64:
        raise ValueError("slot_mapping and position_ids must be int64")
    n = q.shape[0]
    if kv.shape[0] != n or position_ids.shape[0] != n:
        raise ValueError("q, kv and position_ids must have the same number of rows")
    if slot_mapping.shape[0] > n:
        raise ValueError("slot_mapping must not have more rows than q")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != ROPE_DIM or cos_sin_cache.dtype != torch.float32:
        raise ValueError(f"cos_sin_cache must be float32 [max_pos, {ROPE_DIM}]")


def _insert_rows(slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token indices (among the first len(slot_mapping)) whose slot is >= 0, and the slots."""
    tokens = torch.nonzero(slot_mapping >= 0).flatten()
    return tokens, slot_mapping[tokens]


def fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert(
    q_in: torch.Tensor,
    kv: torch.Tensor,
    k_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    position_ids: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    q_head_padded: int,
    eps: float,
    cache_block_size: int,
    apply_q_norm: bool = True,
    kv_mxfp8: bool = False,
    apply_q_rope: bool = True,
    is_q_interleaved: bool = False,
) -> torch.Tensor:
    """Q: RMSNorm + RoPE into a new zero-padded ``[N, q_head_padded, 512]``; KV: RoPE,
    UE8M0 fp8 quant and insert into the 2-D ``fp8_ds_mla`` ``k_cache`` (written in place).

    Tokens past ``len(slot_mapping)`` (DP padding) get q but no insert; slot < 0 skips."""
    if kv_mxfp8 or is_q_interleaved:
        raise NotImplementedError(
            f"{QUANT_INSERT}: the reference covers kv_mxfp8=False, is_q_interleaved=False only"
        )
    _check_common(q_in, kv, slot_mapping, position_ids, cos_sin_cache)
    check_fp8_ds_mla_cache(k_cache, cache_block_size)
    n, heads, _ = q_in.shape
    if q_head_padded < heads:
        raise ValueError(f"q_head_padded ({q_head_padded}) must be >= the live head count ({heads})")

    q_out = q_in.new_zeros((n, q_head_padded, HEAD_DIM))
    q_out[:, :heads] = _q_side(q_in, position_ids, cos_sin_cache, eps, apply_q_norm, apply_q_rope).to(q_in.dtype)

    tokens, slots = _insert_rows(slot_mapping)
    rows = _kv_side(kv[tokens], position_ids[tokens], cos_sin_cache)
    write_fp8_ds_mla(k_cache, rows, slots, cache_block_size)
    return q_out


def fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert(
    q: torch.Tensor,
    kv: torch.Tensor,
    k_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    position_ids: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    eps: float,
    cache_block_size: int,
    apply_q_norm: bool = True,
) -> None:
    """Q: RMSNorm + RoPE written back into ``q``; KV: RoPE, the bf16 row stored at
    ``k_cache[slot // block_size, slot % block_size]`` (``k_cache [blocks, bs, 512]``)."""
    _check_common(q, kv, slot_mapping, position_ids, cos_sin_cache)
    if q.dtype != torch.bfloat16:
        raise ValueError("q and kv must be bfloat16")
    if (
        k_cache.dtype != torch.bfloat16
        or k_cache.dim() != 3
        or k_cache.shape[1] != cache_block_size
        or k_cache.shape[2] != HEAD_DIM
    ):
        raise ValueError(
            f"k_cache must be bfloat16 [num_blocks, {cache_block_size}, {HEAD_DIM}], "
            f"got {k_cache.dtype} {tuple(k_cache.shape)}"
        )

    tokens, slots = _insert_rows(slot_mapping)
    rows = _kv_side(kv[tokens], position_ids[tokens], cos_sin_cache)
    q.copy_(_q_side(q, position_ids, cos_sin_cache, eps, apply_q_norm, True).to(q.dtype))
    block = torch.div(slots, cache_block_size, rounding_mode="floor")
    k_cache[block, slots - block * cache_block_size] = rows


def weak_ref_tensor(t: torch.Tensor) -> torch.Tensor:
    """``_C.weak_ref_tensor`` on CPU: an alias of ``t`` (same storage, sizes, strides and
    offset). Unlike the CUDA op, which wraps the pointer in a tensor that does not own it,
    the alias keeps ``t``'s storage alive."""
    return t.as_strided(t.size(), t.stride(), t.storage_offset())


def _quant_insert_fake(
    q_in, kv, k_cache, slot_mapping, position_ids, cos_sin_cache, q_head_padded, eps,
    cache_block_size, apply_q_norm=True, kv_mxfp8=False, apply_q_rope=True, is_q_interleaved=False,
):
    return q_in.new_empty((q_in.shape[0], q_head_padded, q_in.shape[2]))


def _full_cache_bf16_insert_fake(
    q, kv, k_cache, slot_mapping, position_ids, cos_sin_cache, eps, cache_block_size, apply_q_norm=True,
):
    return None


# vLLM 0.33.0's schemas (from its _C library), with the written arguments annotated
# Tensor(a!) / Tensor(b!) so functionalization sees the mutations. weak_ref_tensor's
# return is annotated as the alias it is on CPU, so a tracer reading the schema does not
# count it as an allocation.
IMPLS: Impls = {
    f"_C::{QUANT_INSERT}": (
        (
            "(Tensor q_in, Tensor kv, Tensor(a!) k_cache, Tensor slot_mapping, "
            "Tensor position_ids, Tensor cos_sin_cache, int q_head_padded, float eps, "
            "int cache_block_size, bool apply_q_norm=True, bool kv_mxfp8=False, "
            "bool apply_q_rope=True, bool is_q_interleaved=False) -> Tensor"
        ),
        fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert, _quant_insert_fake,
    ),
    f"_C::{FULL_CACHE_BF16_INSERT}": (
        (
            "(Tensor(a!) q, Tensor kv, Tensor(b!) k_cache, Tensor slot_mapping, "
            "Tensor position_ids, Tensor cos_sin_cache, float eps, int cache_block_size, "
            "bool apply_q_norm=True) -> ()"
        ),
        fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert, _full_cache_bf16_insert_fake,
    ),
    f"_C::{WEAK_REF}": ("(Tensor(a) t) -> Tensor(a)", weak_ref_tensor, weak_ref_tensor),
}


__all__ = ["FULL_CACHE_BF16_INSERT", "IMPLS", "QUANT_INSERT", "WEAK_REF",
           "fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert",
           "fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert", "weak_ref_tensor"]
