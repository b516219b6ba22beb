"""CPU references for vLLM's Triton kernels of the DeepSeek V4 attention (vLLM disables
Triton without a GPU driver): each is registered as ``torch.ops.capturelint_vllm.<name>``
(its written arguments annotated ``Tensor(a!)``), and reached through a function or a
launcher with vLLM's signature, so an adapter can rebind vLLM's module-level name to it
and a tracer sees one op.

``reference_fused_q_kv_rmsnorm`` / ``fused_q_kv_rmsnorm``
    vLLM's Triton ``fused_q_kv_rmsnorm`` (``vllm/models/common/ops/fused_qk_rmsnorm.py``):
    weighted RMSNorm of the q-lora and kv rows, returned as two new tensors. The first
    is the torch reference, registered as ``torch.ops.capturelint_vllm.fused_q_kv_rmsnorm``;
    the second has vLLM's signature and calls that op, so an adapter can rebind vLLM's
    module-level name to it and a tracer sees one op.
``dequantize_and_gather_k_cache`` / ``DequantizeAndGatherKCache``
    vLLM's Triton ``DequantizeAndGatherKCacheKernel`` (DeepSeek V4
    ``common/ops/cache_utils.py``), which the prefill path calls through
    ``dequantize_and_gather_k_cache``: for request ``b``, the last ``gather_lens[b]``
    (all ``seq_lens[b]`` without it) tokens of its sequence are read from the paged
    ``fp8_ds_mla`` cache through ``block_table[b]`` and written, dequantized to the
    output's dtype, to ``out[b, offset + i]``; registered as
    ``torch.ops.capturelint_vllm.dequantize_and_gather_k_cache``; the class is a
    drop-in for the kernel's launcher, so vLLM's Python wrapper runs unchanged.
``combine_topk_swa_indices`` / ``CombineTopkSwaIndices``
    vLLM's Triton ``CombineTopkSwaIndicesKernel`` (same file), behind
    ``combine_topk_swa_indices``: per prefill token at position ``pos`` of request
    ``b`` (queries rebased to ``query_start_loc[0]``), ``topk_len = min((pos + 1) //
    compress_ratio, topk)`` top-k entries ``topk_indices[t, j] + M*b``, then the window
    ``[max(pos - (window - 1), 0), pos]`` as indices ``M*b + N + p - (seq_len -
    gather_len)`` into the gathered buffer; ``combined_lens[t]`` their count. The
    caller fills the rest with -1. Registered as
    ``torch.ops.capturelint_vllm.combine_topk_swa_indices``.
``reference_fused_inv_rope_fp8_quant`` / ``fused_inv_rope_fp8_quant``
    vLLM's Triton ``fused_inv_rope_fp8_quant`` (DeepSeek V4 common ops, called by
    ``deep_gemm_fp8_o_proj`` with ``quantize = wo_a is fp8``): inverse GPT-J RoPE of
    each head's RoPE dims, heads regrouped as ``[T, n_groups, heads_per_group*512]``
    over a group-major buffer, optionally block-quantized to fp8; registered as
    ``torch.ops.capturelint_vllm.fused_inv_rope_fp8_quant``, wrapped as above.

RMSNorm numerics: fp32 ``x * rsqrt(sum(x^2)/size + eps) * w`` with the weight read as
fp32 and multiplied before the one cast to the input dtype. Inverse RoPE numerics:
fp32 rotation by the negative angle, one cast to o's dtype (``quantize=False``, the
bf16-weight path); with ``quantize=True`` fp8 e4m3 values and per-block
``2^ceil(log2(max(amax, 1e-10) * fl32(1/448)))`` scales, as the Triton kernel.

Limits: the Triton references are checked against their formulas, not against vLLM's
Triton kernels: on a CPU ``vllm.triton_utils`` hands out placeholders, not
``triton.jit``. The inverse RoPE may differ from the GPU by the last fp32 ulp before the
bf16 rounding (the GPU may contract ``x*cos + y*sin`` into an FMA).
"""

from __future__ import annotations

import torch

from capturelint.adapters.vllm.kernels.fp8_ds_mla import (
    FP8_MAX,
    NOPE_DIM,
    ROPE_DIM,
    UE8M0_BIAS,
    apply_gptj_rope,
    ceil_log2,
    dequantize_fp8_ds_mla,
)
from capturelint.adapters.vllm.kernels.library import OWN_NAMESPACE, Impls, no_result_fake, own_op

QKV_RMSNORM = "fused_q_kv_rmsnorm"
INV_ROPE = "fused_inv_rope_fp8_quant"
GATHER_K = "dequantize_and_gather_k_cache"
COMBINE_INDICES = "combine_topk_swa_indices"


def reference_fused_q_kv_rmsnorm(
    qr: torch.Tensor,
    kv: torch.Tensor,
    q_weight: torch.Tensor,
    kv_weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted RMSNorm of each row of ``qr [N, q_size]`` and ``kv [N, kv_size]``.

    Per row, in fp32: ``x * rsqrt(sum(x^2) / size + eps) * w`` (weight multiplied in
    fp32, after the normalisation), cast once to the input's dtype. Returns two new
    contiguous tensors of the inputs' shapes and dtypes; the inputs may be strided views
    (vLLM passes the two halves of one ``qr_kv`` projection).
    """
    if qr.dim() != 2 or kv.dim() != 2 or qr.shape[0] != kv.shape[0]:
        raise ValueError(f"qr and kv must be 2-D with the same rows, got {tuple(qr.shape)} and {tuple(kv.shape)}")
    if q_weight.shape != (qr.shape[1],) or kv_weight.shape != (kv.shape[1],):
        raise ValueError("q_weight and kv_weight must be 1-D of the row sizes of qr and kv")

    def norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        rrms = torch.rsqrt(xf.square().sum(dim=-1, keepdim=True) / x.shape[1] + eps)
        return (xf * rrms * weight.float()).to(x.dtype).contiguous()

    return norm(qr, q_weight), norm(kv, kv_weight)


def _align(x: int, multiple: int) -> int:
    return (x + multiple - 1) // multiple * multiple


def reference_fused_inv_rope_fp8_quant(
    o: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    n_groups: int,
    heads_per_group: int,
    nope_dim: int = NOPE_DIM,
    rope_dim: int = ROPE_DIM,
    quant_group_size: int = 128,
    tma_aligned_scales: bool = False,
    quantize: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse GPT-J RoPE of each head's last ``rope_dim`` dims, grouped for ``wo_a``.

    ``o [T, n_groups*heads_per_group, head_dim]``; head ``g*heads_per_group + j`` of
    token ``t`` lands at ``out[t, g, j*head_dim:(j+1)*head_dim]``. The rotation, in fp32,
    is by ``-angle(positions[t])`` (``even' = even*cos + odd*sin``,
    ``odd' = odd*cos - even*sin``). ``out`` is ``[T, n_groups, heads_per_group*head_dim]``
    over a group-major ``[n_groups, T, ...]`` buffer (strides ``(d, T*d, 1)``), the layout
    the grouped ``torch.bmm(out.transpose(0, 1), ...)`` of vLLM's o-projection reads.

    ``quantize=False``: ``out`` in o's dtype (one rounding) and an empty scale tensor
    (int32 with ``tma_aligned_scales``, else fp32). ``quantize=True``: ``out`` in fp8 e4m3,
    one power-of-two scale per ``quant_group_size`` values,
    ``2^ceil(log2(max(amax, 1e-10) * fl32(1/448)))``; scales ``[T, n_groups, k]`` over an
    MN-major buffer padded to ``align(T, 4)`` tokens (zeros there): fp32 with
    ``k = d/quant_group_size``, or with ``tma_aligned_scales`` the UE8M0 exponent bytes
    packed four per int32 (little-endian, ``k = ceil(d/quant_group_size/4)``).
    """
    if o.dim() != 3:
        raise ValueError(f"o must be [T, heads, head_dim], got {tuple(o.shape)}")
    num_tokens, num_heads, head_dim = o.shape
    if num_heads != n_groups * heads_per_group:
        raise ValueError(f"o has {num_heads} heads, not n_groups*heads_per_group = {n_groups * heads_per_group}")
    if head_dim != nope_dim + rope_dim or rope_dim % 2 or head_dim % quant_group_size:
        raise ValueError(
            f"head_dim {head_dim} must be nope_dim + rope_dim ({nope_dim}+{rope_dim}, rope_dim even) "
            f"and a multiple of quant_group_size {quant_group_size}"
        )
    if cos_sin_cache.dtype != torch.float32 or cos_sin_cache.shape[-1] != rope_dim:
        raise ValueError(f"cos_sin_cache must be float32 [max_pos, {rope_dim}]")
    chunks_per_head = head_dim // quant_group_size
    if quantize and tma_aligned_scales and chunks_per_head % 4:
        raise ValueError("packed UE8M0 scales need head_dim / quant_group_size to be a multiple of 4")

    half = rope_dim // 2
    rows = cos_sin_cache[positions.to(cos_sin_cache.device, torch.int64)]
    cos, sin = rows[:, None, :half], rows[:, None, half:]
    x = o.float()
    x = torch.cat((x[..., :nope_dim], apply_gptj_rope(x[..., nope_dim:], cos, -sin)), dim=-1)
    d = heads_per_group * head_dim
    grouped = x.reshape(num_tokens, n_groups, d)
    scale_dtype = torch.int32 if tma_aligned_scales else torch.float32

    if not quantize:
        out_buf = torch.empty((n_groups, num_tokens, d), dtype=o.dtype, device=o.device)
        out_buf.copy_(grouped.transpose(0, 1))
        return out_buf.transpose(0, 1), torch.empty(0, dtype=scale_dtype, device=o.device)

    num_scale_blocks = d // quant_group_size
    blocks = grouped.reshape(num_tokens, n_groups, num_scale_blocks, quant_group_size)
    amax = blocks.abs().amax(dim=-1).clamp_min(1e-10)
    inv_fp8_max = torch.tensor(1.0 / FP8_MAX, dtype=torch.float32, device=o.device)
    exponent = ceil_log2(amax * inv_fp8_max)  # the kernel multiplies by fp32(1/448)
    scales = torch.ldexp(torch.ones_like(amax), exponent)
    values = (blocks / scales[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    out_buf = torch.empty((n_groups, num_tokens, d), dtype=torch.float8_e4m3fn, device=o.device)
    out_buf.copy_(values.reshape(num_tokens, n_groups, d).transpose(0, 1))

    padded_tokens = _align(num_tokens, 4)  # get_tma_aligned_size(T, 4): 16 bytes of 4-byte scales
    if tma_aligned_scales:
        scale_inner = (num_scale_blocks + 3) // 4
        ue8m0 = (exponent + UE8M0_BIAS).clamp(0, 255).to(torch.uint8)
        ue8m0 = torch.nn.functional.pad(ue8m0, (0, scale_inner * 4 - num_scale_blocks))
        scale_values = ue8m0.reshape(num_tokens, n_groups, scale_inner, 4).contiguous().view(torch.int32)[..., 0]
    else:
        scale_inner = num_scale_blocks
        scale_values = scales
    scale_buf = torch.zeros(
        n_groups * scale_inner * padded_tokens, dtype=scale_dtype, device=o.device
    ).as_strided((n_groups, num_tokens, scale_inner), (scale_inner * padded_tokens, 1, padded_tokens))
    scale_buf.copy_(scale_values.transpose(0, 1))
    return out_buf.transpose(0, 1), scale_buf.transpose(0, 1)


def fused_q_kv_rmsnorm(
    qr: torch.Tensor,
    kv: torch.Tensor,
    q_weight: torch.Tensor,
    kv_weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for ``vllm.models.common.ops.fused_q_kv_rmsnorm``: calls
    ``torch.ops.capturelint_vllm.fused_q_kv_rmsnorm`` (registering it on first use)."""
    return own_op(QKV_RMSNORM, IMPLS)(qr, kv, q_weight, kv_weight, eps)


def fused_inv_rope_fp8_quant(
    o: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    n_groups: int,
    heads_per_group: int,
    nope_dim: int = NOPE_DIM,
    rope_dim: int = ROPE_DIM,
    quant_group_size: int = 128,
    tma_aligned_scales: bool = False,
    quantize: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for vLLM's ``fused_inv_rope_fp8_quant`` (DeepSeek V4 common ops): calls
    ``torch.ops.capturelint_vllm.fused_inv_rope_fp8_quant`` (registering it on first use)."""
    return own_op(INV_ROPE, IMPLS)(
        o, positions, cos_sin_cache, n_groups, heads_per_group, nope_dim, rope_dim,
        quant_group_size, tma_aligned_scales, quantize,
    )


def reference_dequantize_and_gather_k_cache(
    out: torch.Tensor,
    k_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    gather_lens: torch.Tensor | None,
    block_table: torch.Tensor,
    block_size: int,
    offset: int,
) -> None:
    """``out[b, offset + i] = row(seq_lens[b] - gather_len + i)`` for ``i <
    gather_len`` (``gather_lens[b]``, or ``seq_lens[b]`` without them): the token's slot
    is ``block_table[b, pos // block_size] * block_size + pos % block_size`` in the
    ``fp8_ds_mla`` cache ``k_cache`` (``[blocks, block_size, 584]`` bytes, or a 2-D
    view of it), dequantized, rounded to ``out``'s dtype. Other rows are left as they
    were."""
    cache = k_cache.reshape(k_cache.shape[0], -1)
    for b in range(seq_lens.shape[0]):
        seq_len = int(seq_lens[b])
        gather_len = seq_len if gather_lens is None else int(gather_lens[b])
        if gather_len <= 0:
            continue
        pos = torch.arange(seq_len - gather_len, seq_len, device=block_table.device)
        blocks = block_table[b].long()[torch.div(pos, block_size, rounding_mode="floor")]
        rows = dequantize_fp8_ds_mla(cache, blocks * block_size + pos % block_size, block_size)
        out[b, offset : offset + gather_len] = rows.to(out.dtype)


def reference_combine_topk_swa_indices(
    combined_indices: torch.Tensor,
    combined_lens: torch.Tensor,
    topk_indices: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    gather_lens: torch.Tensor,
    M: int,
    N: int,
    topk: int,
    compress_ratio: int,
    window_size: int,
) -> None:
    """Per request ``b`` and query token ``t`` (``query_start_loc`` rebased to its first
    entry) at position ``pos = seq_len - query_len + (t - query_start)``: the first
    ``topk_len = min((pos + 1) // compress_ratio, topk)`` entries of row ``t`` are
    ``topk_indices[t, :topk_len] + M*b``, the next ``swa_len = pos - swa_start + 1``
    (``swa_start = max(pos - (window_size - 1), 0)``) are ``M*b + N + p - (seq_len -
    gather_len)`` for ``p`` in ``[swa_start, pos]``; ``combined_lens[t] = topk_len +
    swa_len``. Entries past them are left as they were (the caller fills -1)."""
    base = int(query_start_loc[0])
    for b in range(seq_lens.shape[0]):
        query_start, query_end = int(query_start_loc[b]) - base, int(query_start_loc[b + 1]) - base
        seq_len, gather_len = int(seq_lens[b]), int(gather_lens[b])
        start_pos, gather_start = seq_len - (query_end - query_start), seq_len - gather_len
        for t in range(query_start, query_end):
            pos = start_pos + t - query_start
            topk_len = min((pos + 1) // compress_ratio, topk)
            if topk_len > 0:
                combined_indices[t, :topk_len] = topk_indices[t, :topk_len] + M * b
            swa_start = max(pos - (window_size - 1), 0)
            swa_len = pos - swa_start + 1
            window = torch.arange(swa_start, pos + 1, dtype=combined_indices.dtype, device=combined_indices.device)
            combined_indices[t, topk_len : topk_len + swa_len] = M * b + N + window - gather_start
            combined_lens[t] = topk_len + swa_len


class DequantizeAndGatherKCache:
    """Drop-in for the launcher (``__call__``) of vLLM's ``DequantizeAndGatherKCacheKernel``
    (called by ``dequantize_and_gather_k_cache`` with the kernel's arguments): runs
    ``torch.ops.capturelint_vllm.dequantize_and_gather_k_cache``. ``use_fnuz`` must be
    False (OCP fp8, as on CUDA)."""

    def __call__(self, out, k_cache, seq_lens, gather_lens, block_table, block_size, offset, *, use_fnuz=False):
        if use_fnuz:
            raise NotImplementedError("FNUZ fp8 caches (ROCm gfx942) have no CPU reference")
        own_op(GATHER_K, IMPLS)(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset)


class CombineTopkSwaIndices:
    """Drop-in for the launcher (``__call__``) of vLLM's ``CombineTopkSwaIndicesKernel``
    (called by ``combine_topk_swa_indices`` after it filled the output with -1): runs
    ``torch.ops.capturelint_vllm.combine_topk_swa_indices``. Image-span visibility
    (``left_visible``/``right_visible``, ``max_image_tokens``) has no reference."""

    def __call__(self, combined_indices, combined_lens, topk_indices, query_start_loc, seq_lens, gather_lens, M, N, *,
                 TOP_K, COMPRESS_RATIO, WINDOW_SIZE, left_visible=None, right_visible=None, max_image_tokens=0):
        if left_visible is not None or right_visible is not None or max_image_tokens:
            raise NotImplementedError("in-image visibility of combine_topk_swa_indices has no CPU reference")
        own_op(COMBINE_INDICES, IMPLS)(combined_indices, combined_lens, topk_indices, query_start_loc, seq_lens, gather_lens,
                                 int(M), int(N), TOP_K, COMPRESS_RATIO, WINDOW_SIZE)


def dequantize_and_gather_k_cache(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset, use_fnuz=False):
    """vLLM's ``dequantize_and_gather_k_cache`` signature over the reference op."""
    DequantizeAndGatherKCache()(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset, use_fnuz=use_fnuz)


def combine_topk_swa_indices(topk_indices, query_start_loc, seq_lens, gather_lens, window_size, compress_ratio, topk,
                             M, N, out):
    """The reference op over vLLM's ``combine_topk_swa_indices`` arguments, writing
    ``out = (combined_indices, combined_lens)`` after filling the indices with -1
    (what vLLM's wrapper does before its kernel)."""
    combined_indices, combined_lens = out
    combined_indices.fill_(-1)
    CombineTopkSwaIndices()(combined_indices, combined_lens, topk_indices, query_start_loc, seq_lens, gather_lens, M,
                            N, TOP_K=topk, COMPRESS_RATIO=compress_ratio, WINDOW_SIZE=window_size)
    return combined_indices, combined_lens


def _fused_q_kv_rmsnorm_fake(qr, kv, q_weight, kv_weight, eps):
    return qr.new_empty(qr.shape), kv.new_empty(kv.shape)


def _fused_inv_rope_fp8_quant_fake(
    o, positions, cos_sin_cache, n_groups, heads_per_group, nope_dim=NOPE_DIM, rope_dim=ROPE_DIM,
    quant_group_size=128, tma_aligned_scales=False, quantize=True,
):
    num_tokens, _, head_dim = o.shape
    d = heads_per_group * head_dim
    scale_dtype = torch.int32 if tma_aligned_scales else torch.float32
    out = o.new_empty((n_groups, num_tokens, d), dtype=torch.float8_e4m3fn if quantize else o.dtype)
    if not quantize:
        return out.transpose(0, 1), o.new_empty((0,), dtype=scale_dtype)
    blocks = d // quant_group_size
    inner = (blocks + 3) // 4 if tma_aligned_scales else blocks
    padded = _align(num_tokens, 4)
    scale = o.new_empty((n_groups * inner * padded,), dtype=scale_dtype).as_strided(
        (n_groups, num_tokens, inner), (inner * padded, 1, padded)
    )
    return out.transpose(0, 1), scale.transpose(0, 1)


IMPLS: Impls = {
    f"{OWN_NAMESPACE}::{QKV_RMSNORM}": (
        "(Tensor qr, Tensor kv, Tensor q_weight, Tensor kv_weight, float eps) -> (Tensor, Tensor)",
        reference_fused_q_kv_rmsnorm, _fused_q_kv_rmsnorm_fake,
    ),
    f"{OWN_NAMESPACE}::{INV_ROPE}": (
        (
            "(Tensor o, Tensor positions, Tensor cos_sin_cache, int n_groups, int heads_per_group, "
            "int nope_dim=448, int rope_dim=64, int quant_group_size=128, bool tma_aligned_scales=False, "
            "bool quantize=True) -> (Tensor, Tensor)"
        ),
        reference_fused_inv_rope_fp8_quant, _fused_inv_rope_fp8_quant_fake,
    ),
    f"{OWN_NAMESPACE}::{GATHER_K}": (
        (
            "(Tensor(a!) out, Tensor k_cache, Tensor seq_lens, Tensor? gather_lens, Tensor block_table, "
            "int block_size, int offset) -> ()"
        ),
        reference_dequantize_and_gather_k_cache, no_result_fake,
    ),
    f"{OWN_NAMESPACE}::{COMBINE_INDICES}": (
        (
            "(Tensor(a!) combined_indices, Tensor(b!) combined_lens, Tensor topk_indices, Tensor query_start_loc, "
            "Tensor seq_lens, Tensor gather_lens, int M, int N, int topk, int compress_ratio, int window_size) -> ()"
        ),
        reference_combine_topk_swa_indices, no_result_fake,
    ),
}


__all__ = ["COMBINE_INDICES", "CombineTopkSwaIndices", "DequantizeAndGatherKCache", "GATHER_K", "IMPLS", "INV_ROPE",
           "QKV_RMSNORM", "combine_topk_swa_indices", "dequantize_and_gather_k_cache", "fused_inv_rope_fp8_quant",
           "fused_q_kv_rmsnorm", "reference_combine_topk_swa_indices", "reference_dequantize_and_gather_k_cache",
           "reference_fused_inv_rope_fp8_quant", "reference_fused_q_kv_rmsnorm"]
