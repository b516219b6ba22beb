"""CPU references, in plain torch, for the vLLM custom ops DeepSeek V4 attention calls.

Idea
----
vLLM 0.33.0's DeepSeek V4 attention (``DeepseekV4Attention._fused_qnorm_rope_kv_insert``)
hands its query and its new KV row to one fused CUDA op from ``vllm._C``, picked by the
dtype of the sliding-window KV cache:

* ``uint8`` cache (``fp8_ds_mla``): ``fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert``
  returns a new, head-padded q and quantizes the KV row into a paged byte cache;
* ``bfloat16`` cache: ``fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert``
  rewrites q in place and stores the KV row as it is (after RoPE).

On a machine without vLLM's compiled ``_C`` those ops do not exist, so vLLM's model code
cannot run. This module writes the two ops again as small torch functions (written from
the semantics of the CUDA kernel, not copied from vLLM), and can register them as
``torch.ops._C.<name>`` so that unchanged vLLM code finds them. The attention that
follows is the same story: FlashMLA's sparse decode/prefill (``torch.ops._flashmla_C``,
from a ``.so`` that needs CUDA to load), two Triton kernels (the q/kv RMSNorm and the
o-projection's inverse RoPE) and ``_C.weak_ref_tensor``.

What is built
-------------
``fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert``
    Q side, per token and live head: weight-free RMSNorm over the 512 dims
    (``x * rsqrt(mean(x^2) + eps)``), then GPT-J RoPE on dims 448..511; the result is cast
    once to q's dtype and written to a new ``[N, q_head_padded, 512]`` tensor whose
    padding heads are zero. KV side, for the first ``len(slot_mapping)`` tokens with a
    slot >= 0: GPT-J RoPE on dims 448..511, the whole row rounded to kv's dtype (the
    kernel's bf16 round trip), dims 0..447 quantized to fp8 e4m3 in 7 blocks of 64 with
    one UE8M0 (power-of-two) scale each, dims 448..511 stored as bf16.
``fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert``
    The same Q math, written back into q (no padding); the roped KV row, in bf16, is
    stored at ``k_cache[slot // block_size, slot % block_size]``.
``dequantize_fp8_ds_mla``
    Reads rows back out of the ``fp8_ds_mla`` layout as fp32 (tests, reference attention).
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
``weak_ref_tensor`` (``torch.ops._C.weak_ref_tensor``)
    On CPU an alias of its input (same storage, sizes, strides, offset). The CUDA op
    wraps the pointer in a tensor that does not own the memory; the alias here keeps
    the storage alive, so it cannot show a use-after-free the GPU would have. Its
    schema is ``(Tensor(a) t) -> Tensor(a)`` (vLLM's says ``(Tensor) -> Tensor``), so a
    tracer reading return aliasing does not count it as an allocation.
``register_reference_kernels``
    Defines every op above in its namespace (``_C``, ``_flashmla_C``,
    ``capturelint_vllm``) with vLLM's schemas (written arguments annotated
    ``Tensor(a!)``) where the namespace lacks it; idempotent.

Insert numerics, as in the CUDA kernel: all math in fp32 with the fp32 ``cos_sin_cache``
(``[max_pos, 64]``: 32 cosines, then 32 sines; pair ``i`` is dims ``448+2i, 448+2i+1``,
``even' = even*cos - odd*sin``, ``odd' = even*sin + odd*cos``); one rounding of q at the
end. A quant block's scale is ``2^e`` with ``e = ceil(log2(max(amax, 1e-4) / 448))``,
its byte ``clamp(e + 127, 0, 255)``; values are ``clamp(x * 2^-e, -448, 448)`` rounded to
nearest-even e4m3 (subnormals kept). A zero block thus gets ``e = -22``, byte 105.

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

RMSNorm numerics: fp32 ``x * rsqrt(sum(x^2)/size + eps) * w`` with the weight read as
fp32 and multiplied before the one cast to the input dtype. Inverse RoPE numerics:
fp32 rotation by the negative angle, one cast to o's dtype (``quantize=False``, the
bf16-weight path); with ``quantize=True`` fp8 e4m3 values and per-block
``2^ceil(log2(max(amax, 1e-10) * fl32(1/448)))`` scales, as the Triton kernel.

Layout of one ``fp8_ds_mla`` cache block (one row of the 2-D ``uint8`` cache view,
``bs`` = block_size tokens; the row may be longer than ``bs*584``, the tail is unused)::

    byte 0                                  bs*576                 bs*584
    |<-------- token data, 576 B/token -------->|<-- scales, 8 B/token -->|
    | token 0 | token 1 | ...     | token bs-1  | s0 | s1 | ... | s(bs-1) |  (padding)
      |
      +-> [0, 448)   448 x fp8 e4m3    NoPE dims 0..447, quant block j = bytes 64j..64j+63
          [448, 576) 64 x bf16 (LE)    RoPE dims 448..511, after RoPE, not quantized
    s(t) = 8 bytes: [e0+127, e1+127, ..., e6+127, 0]   (UE8M0 scale of quant block j; pad)

    slot s -> block s // bs, token t = s % bs: data at t*576, scales at bs*576 + t*8.

Limits
------
* Only the ops above; the per-tensor-fp8 full-cache op, the KV-only inserts, FlashMLA's
  dense decode and any other ``_C`` op are not covered (``missing_kernel_error`` words
  the failure).
* ``sparse_decode_fwd`` reads only the V4 584-byte layout (V4.1's 528/288-byte and
  V3.2's 656-byte caches raise ``NotImplementedError``), one KV head, a 512-dim q and
  ``head_dim_v`` 512. Out-of-range indices are skipped like ``-1`` (the CUDA kernel
  would read out of bounds). ``out`` may be strided here; the kernel wants it
  contiguous. The tile-scheduler tensors are passed through, or allocated once as
  zeros ``(1, 8)`` / ``(b+1,)`` int32; their values mean nothing on CPU.
  ``enable_batch_invariant`` has no effect: the reference never splits KV.
* Attention materializes the gathered rows (``b*s_q*topk*512`` fp32): meant for the
  small shapes of a CPU check, not for long contexts.
* The inverse RoPE may differ from the GPU by the last fp32 ulp before the bf16
  rounding (the GPU may contract ``x*cos + y*sin`` into an FMA).
* The ``_flashmla_C`` schemas follow the argument order of the vendored interface (the
  ``.so``'s own cannot be read without CUDA). ``install_flashmla_stub`` only installs
  the module; ``register_reference_kernels`` defines the ops.
* The Triton references are checked against their formulas, not against vLLM's Triton
  kernels: on a CPU ``vllm.triton_utils`` hands out placeholders, not ``triton.jit``.
* The defaulted arguments vLLM 0.33.0's schema adds for DeepSeek V4.1
  (``kv_mxfp8``, ``is_q_interleaved``) are accepted only at their defaults (False);
  ``apply_q_norm`` and ``apply_q_rope`` are honoured (False skips that Q step).
* The CUDA kernel only instantiates ``q_head_padded`` in {8, 16, 32, 64, 128}; the
  reference takes any value >= the live head count.
* Duplicate slots: the last token wins here; on the GPU the order is unspecified.
* fp8 is OCP e4m3 (``float8_e4m3fn``, max 448), not the FNUZ variant of ROCm gfx942.
* q/kv in fp16 are accepted like the kernel does (the RoPE bytes are then fp16);
  ``dequantize_fp8_ds_mla`` reads them as bf16, the only dtype vLLM uses.
* vLLM's own AVX512 CPU port (``fused_qnorm_rope_kv_insert_cpu``) floors the *scale*,
  not the absmax, at 1e-4 and flushes fp8 subnormals; this reference follows the CUDA
  kernel (and the Triton ``quantize_and_insert_k_cache``) instead.
"""

from __future__ import annotations

import importlib
import sys
import types

import torch

__all__ = [
    "HEAD_DIM",
    "NOPE_DIM",
    "ROPE_DIM",
    "QUANT_BLOCK",
    "NUM_QUANT_BLOCKS",
    "TOKEN_DATA_BYTES",
    "SCALE_BYTES_PER_TOKEN",
    "TOKEN_BYTES",
    "FP8_MAX",
    "REFERENCE_KERNELS",
    "apply_gptj_rope",
    "ue8m0_quantize",
    "fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert",
    "fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert",
    "dequantize_fp8_ds_mla",
    "sparse_decode_fwd",
    "sparse_prefill_fwd",
    "install_flashmla_stub",
    "reference_fused_q_kv_rmsnorm",
    "fused_q_kv_rmsnorm",
    "reference_fused_inv_rope_fp8_quant",
    "fused_inv_rope_fp8_quant",
    "weak_ref_tensor",
    "dequantize_and_gather_k_cache",
    "DequantizeAndGatherKCache",
    "combine_topk_swa_indices",
    "CombineTopkSwaIndices",
    "register_reference_kernels",
    "register_ops",
    "missing_kernel_error",
]

HEAD_DIM = 512
ROPE_DIM = 64
NOPE_DIM = HEAD_DIM - ROPE_DIM  # 448
QUANT_BLOCK = 64
NUM_QUANT_BLOCKS = NOPE_DIM // QUANT_BLOCK  # 7
TOKEN_DATA_BYTES = NOPE_DIM + ROPE_DIM * 2  # 448 fp8 + 64 bf16 = 576
SCALE_BYTES_PER_TOKEN = NUM_QUANT_BLOCKS + 1  # 7 scales + 1 pad = 8
TOKEN_BYTES = TOKEN_DATA_BYTES + SCALE_BYTES_PER_TOKEN  # 584
FP8_MAX = 448.0
AMAX_FLOOR = 1e-4
UE8M0_BIAS = 127

QUANT_INSERT = "fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert"
FULL_CACHE_BF16_INSERT = "fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert"

WEAK_REF = "weak_ref_tensor"
FLASHMLA_NAMESPACE = "_flashmla_C"
SPARSE_DECODE = "sparse_decode_fwd"
SPARSE_PREFILL = "sparse_prefill_fwd"
OWN_NAMESPACE = "capturelint_vllm"
QKV_RMSNORM = "fused_q_kv_rmsnorm"
INV_ROPE = "fused_inv_rope_fp8_quant"
GATHER_K = "dequantize_and_gather_k_cache"
COMBINE_INDICES = "combine_topk_swa_indices"
TILE_SCHEDULER_METADATA_SIZE = 8  # int32 words per scheduler part in FlashMLA

#: The ops this module has a reference for, as ``namespace::name``.
REFERENCE_KERNELS: tuple[str, ...] = (
    f"_C::{QUANT_INSERT}",
    f"_C::{FULL_CACHE_BF16_INSERT}",
    f"_C::{WEAK_REF}",
    f"{FLASHMLA_NAMESPACE}::{SPARSE_DECODE}",
    f"{FLASHMLA_NAMESPACE}::{SPARSE_PREFILL}",
    f"{OWN_NAMESPACE}::{QKV_RMSNORM}",
    f"{OWN_NAMESPACE}::{INV_ROPE}",
    f"{OWN_NAMESPACE}::{GATHER_K}",
    f"{OWN_NAMESPACE}::{COMBINE_INDICES}",
)

# vLLM 0.33.0's schemas (from its _C library; the FlashMLA ones follow the arguments of
# the vendored interface), with the written arguments annotated Tensor(a!) / Tensor(b!)
# so functionalization sees the mutations. weak_ref_tensor's return is annotated as the
# alias it is on CPU, so a tracer reading the schema does not count it as an allocation.
_SCHEMAS = {
    QUANT_INSERT: (
        "(Tensor q_in, Tensor kv, Tensor(a!) k_cache, Tensor slot_mapping, "
        "Tensor position_ids, Tensor cos_sin_cache, int q_head_padded, float eps, "
        "int cache_block_size, bool apply_q_norm=True, bool kv_mxfp8=False, "
        "bool apply_q_rope=True, bool is_q_interleaved=False) -> Tensor"
    ),
    FULL_CACHE_BF16_INSERT: (
        "(Tensor(a!) q, Tensor kv, Tensor(b!) k_cache, Tensor slot_mapping, "
        "Tensor position_ids, Tensor cos_sin_cache, float eps, int cache_block_size, "
        "bool apply_q_norm=True) -> ()"
    ),
    WEAK_REF: "(Tensor(a) t) -> Tensor(a)",
    SPARSE_DECODE: (
        "(Tensor q, Tensor k_cache, Tensor indices_in_kvcache, Tensor? topk_length, "
        "Tensor? attn_sink, Tensor? tile_scheduler_metadata, Tensor? num_splits, "
        "Tensor? extra_k_cache, Tensor? extra_indices_in_kvcache, Tensor? extra_topk_length, "
        "int head_dim_v, float softmax_scale, Tensor(a!)? out, bool enable_batch_invariant) "
        "-> (Tensor, Tensor, Tensor, Tensor)"
    ),
    SPARSE_PREFILL: (
        "(Tensor q, Tensor kv, Tensor indices, float sm_scale, int d_v, Tensor? attn_sink, "
        "Tensor? topk_length, Tensor(a!)? out) -> (Tensor, Tensor, Tensor)"
    ),
    QKV_RMSNORM: "(Tensor qr, Tensor kv, Tensor q_weight, Tensor kv_weight, float eps) -> (Tensor, Tensor)",
    INV_ROPE: (
        "(Tensor o, Tensor positions, Tensor cos_sin_cache, int n_groups, int heads_per_group, "
        "int nope_dim=448, int rope_dim=64, int quant_group_size=128, bool tma_aligned_scales=False, "
        "bool quantize=True) -> (Tensor, Tensor)"
    ),
    GATHER_K: (
        "(Tensor(a!) out, Tensor k_cache, Tensor seq_lens, Tensor? gather_lens, Tensor block_table, "
        "int block_size, int offset) -> ()"
    ),
    COMBINE_INDICES: (
        "(Tensor(a!) combined_indices, Tensor(b!) combined_lens, Tensor topk_indices, Tensor query_start_loc, "
        "Tensor seq_lens, Tensor gather_lens, int M, int N, int topk, int compress_ratio, int window_size) -> ()"
    ),
}


# ---------------------------------------------------------------------------- math


def _cos_sin(cos_sin_cache: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``(cos, sin)``, each ``[len(positions), 32]``, for the given positions."""
    rows = cos_sin_cache.float()[positions]
    half = ROPE_DIM // 2
    return rows[:, :half], rows[:, half:]


def apply_gptj_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """GPT-J (interleaved) RoPE of ``x [..., 64]`` in fp32.

    Pair ``i`` is ``(x[2i], x[2i+1])``, rotated by the angle whose cosine and sine are
    ``cos[..., i]`` and ``sin[..., i]``; ``cos``/``sin`` broadcast against ``x[..., ::2]``.
    Passing ``-sin`` undoes the rotation.
    """
    x = x.float()
    even, odd = x[..., 0::2], x[..., 1::2]
    out_even = even * cos - odd * sin
    out_odd = even * sin + odd * cos
    return torch.stack((out_even, out_odd), dim=-1).flatten(-2)


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
        cos, sin = _cos_sin(cos_sin_cache, position_ids)
        rope = apply_gptj_rope(x[..., NOPE_DIM:], cos[:, None, :], sin[:, None, :])
        x = torch.cat((x[..., :NOPE_DIM], rope), dim=-1)
    return x


def _kv_side(kv: torch.Tensor, position_ids: torch.Tensor, cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """KV rows ``[n, 512]`` with RoPE on the last 64 dims, rounded to kv's dtype."""
    cos, sin = _cos_sin(cos_sin_cache, position_ids)
    x = kv.float()
    rope = apply_gptj_rope(x[:, NOPE_DIM:], cos, sin)
    return torch.cat((x[:, :NOPE_DIM], rope), dim=-1).to(kv.dtype)


def _ceil_log2(r: torch.Tensor) -> torch.Tensor:
    """``ceil(log2(r))`` for positive finite fp32 ``r``, exactly (int32)."""
    mantissa, exponent = torch.frexp(r)  # r = mantissa * 2**exponent, mantissa in [0.5, 1)
    return torch.where(mantissa == 0.5, exponent - 1, exponent)


def ue8m0_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """UE8M0 block fp8 quantization of ``x [n, 448]``.

    Returns ``(fp8_bytes uint8 [n, 448], scale_bytes uint8 [n, 7])``: for each block of
    64 values, ``e = ceil(log2(max(amax, 1e-4) / 448))``, bytes of
    ``clamp(x * 2^-e, -448, 448)`` as e4m3 and the scale byte ``clamp(e + 127, 0, 255)``.
    """
    n = x.shape[0]
    blocks = x.float().reshape(n, NUM_QUANT_BLOCKS, QUANT_BLOCK)
    amax = blocks.abs().amax(dim=-1).clamp_min(AMAX_FLOOR)
    exponent = _ceil_log2(amax / FP8_MAX)  # [n, 7] int32
    inv_scale = torch.ldexp(torch.ones_like(amax), -exponent)  # exact power of two
    scaled = (blocks * inv_scale[..., None]).clamp(-FP8_MAX, FP8_MAX)
    fp8_bytes = scaled.to(torch.float8_e4m3fn).view(torch.uint8).reshape(n, NOPE_DIM)
    scale_bytes = (exponent + UE8M0_BIAS).clamp(0, 255).to(torch.uint8)
    return fp8_bytes, scale_bytes


# ----------------------------------------------------------------------- cache layout


def _check_fp8_ds_mla_cache(k_cache: torch.Tensor, block_size: int) -> None:
    if k_cache.dtype != torch.uint8 or k_cache.dim() != 2:
        raise ValueError(f"k_cache must be a 2-D uint8 tensor, got {k_cache.dtype} {tuple(k_cache.shape)}")
    if block_size <= 0:
        raise ValueError(f"cache_block_size must be positive, got {block_size}")
    if k_cache.shape[1] < block_size * TOKEN_BYTES:
        raise ValueError(
            f"k_cache rows hold {k_cache.shape[1]} bytes; block_size {block_size} needs "
            f"{block_size * TOKEN_BYTES} ({TOKEN_BYTES} per token)"
        )


def _slot_offsets(slots: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per slot: cache row (block), first token-data byte, first scale byte."""
    block = torch.div(slots, block_size, rounding_mode="floor")
    token = slots - block * block_size
    data = token * TOKEN_DATA_BYTES
    scale = block_size * TOKEN_DATA_BYTES + token * SCALE_BYTES_PER_TOKEN
    return block, data, scale


def _write_fp8_ds_mla(k_cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, block_size: int) -> None:
    """Quantize ``rows [n, 512]`` (already roped, kv dtype) into ``k_cache`` at ``slots``."""
    if rows.shape[0] == 0:
        return
    fp8_bytes, scale_bytes = ue8m0_quantize(rows[:, :NOPE_DIM])
    rope_bytes = rows[:, NOPE_DIM:].contiguous().view(torch.uint8)  # [n, 128], little-endian
    token_bytes = torch.cat((fp8_bytes, rope_bytes), dim=1)  # [n, 576]
    pad = torch.zeros(rows.shape[0], 1, dtype=torch.uint8, device=rows.device)
    token_scales = torch.cat((scale_bytes, pad), dim=1)  # [n, 8]
    block, data, scale = _slot_offsets(slots, block_size)
    device = k_cache.device
    data_cols = data[:, None] + torch.arange(TOKEN_DATA_BYTES, device=device)
    scale_cols = scale[:, None] + torch.arange(SCALE_BYTES_PER_TOKEN, device=device)
    k_cache[block[:, None], data_cols] = token_bytes.to(device)
    k_cache[block[:, None], scale_cols] = token_scales.to(device)


def dequantize_fp8_ds_mla(k_cache: torch.Tensor, slots: torch.Tensor, block_size: int) -> torch.Tensor:
    """Read the tokens at ``slots`` back from a 2-D ``fp8_ds_mla`` cache: fp32 ``[n, 512]``.

    Dims 0..447 are ``fp8 * 2^(scale_byte - 127)`` per block of 64; dims 448..511 are the
    stored bf16 values.
    """
    _check_fp8_ds_mla_cache(k_cache, block_size)
    slots = torch.as_tensor(slots, dtype=torch.int64, device=k_cache.device).reshape(-1)
    n = slots.shape[0]
    block, data, scale = _slot_offsets(slots, block_size)
    data_cols = data[:, None] + torch.arange(TOKEN_DATA_BYTES, device=k_cache.device)
    scale_cols = scale[:, None] + torch.arange(NUM_QUANT_BLOCKS, device=k_cache.device)
    token_bytes = k_cache[block[:, None], data_cols]  # [n, 576]
    scale_bytes = k_cache[block[:, None], scale_cols]  # [n, 7]
    values = token_bytes[:, :NOPE_DIM].contiguous().view(torch.float8_e4m3fn).float()
    scales = torch.ldexp(torch.ones(n, NUM_QUANT_BLOCKS, device=k_cache.device), scale_bytes.int() - UE8M0_BIAS)
    nope = (values.reshape(n, NUM_QUANT_BLOCKS, QUANT_BLOCK) * scales[..., None]).reshape(n, NOPE_DIM)
    rope = token_bytes[:, NOPE_DIM:].contiguous().view(torch.bfloat16).float()
    return torch.cat((nope, rope), dim=1)


# ------------------------------------------------------------------------- the ops


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
    _check_fp8_ds_mla_cache(k_cache, cache_block_size)
    n, heads, _ = q_in.shape
    if q_head_padded < heads:
        raise ValueError(f"q_head_padded ({q_head_padded}) must be >= the live head count ({heads})")

    q_out = q_in.new_zeros((n, q_head_padded, HEAD_DIM))
    q_out[:, :heads] = _q_side(q_in, position_ids, cos_sin_cache, eps, apply_q_norm, apply_q_rope).to(q_in.dtype)

    tokens, slots = _insert_rows(slot_mapping)
    rows = _kv_side(kv[tokens], position_ids[tokens], cos_sin_cache)
    _write_fp8_ds_mla(k_cache, rows, slots, cache_block_size)
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


# ----------------------------------------------------------------- sparse attention


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


# ------------------------------------------------------------ vLLM's Triton kernels


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
    exponent = _ceil_log2(amax * inv_fp8_max)  # the kernel multiplies by fp32(1/448)
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
    return _own_op(QKV_RMSNORM)(qr, kv, q_weight, kv_weight, eps)


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
    return _own_op(INV_ROPE)(
        o, positions, cos_sin_cache, n_groups, heads_per_group, nope_dim, rope_dim,
        quant_group_size, tma_aligned_scales, quantize,
    )


def weak_ref_tensor(t: torch.Tensor) -> torch.Tensor:
    """``_C.weak_ref_tensor`` on CPU: an alias of ``t`` (same storage, sizes, strides and
    offset). Unlike the CUDA op, which wraps the pointer in a tensor that does not own it,
    the alias keeps ``t``'s storage alive."""
    return t.as_strided(t.size(), t.stride(), t.storage_offset())


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
        _own_op(GATHER_K)(out, k_cache, seq_lens, gather_lens, block_table, block_size, offset)


class CombineTopkSwaIndices:
    """Drop-in for the launcher (``__call__``) of vLLM's ``CombineTopkSwaIndicesKernel``
    (called by ``combine_topk_swa_indices`` after it filled the output with -1): runs
    ``torch.ops.capturelint_vllm.combine_topk_swa_indices``. Image-span visibility
    (``left_visible``/``right_visible``, ``max_image_tokens``) has no reference."""

    def __call__(self, combined_indices, combined_lens, topk_indices, query_start_loc, seq_lens, gather_lens, M, N, *,
                 TOP_K, COMPRESS_RATIO, WINDOW_SIZE, left_visible=None, right_visible=None, max_image_tokens=0):
        if left_visible is not None or right_visible is not None or max_image_tokens:
            raise NotImplementedError("in-image visibility of combine_topk_swa_indices has no CPU reference")
        _own_op(COMBINE_INDICES)(combined_indices, combined_lens, topk_indices, query_start_loc, seq_lens, gather_lens,
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


# ---------------------------------------------------------------------- registration


def _quant_insert_fake(
    q_in, kv, k_cache, slot_mapping, position_ids, cos_sin_cache, q_head_padded, eps,
    cache_block_size, apply_q_norm=True, kv_mxfp8=False, apply_q_rope=True, is_q_interleaved=False,
):
    return q_in.new_empty((q_in.shape[0], q_head_padded, q_in.shape[2]))


def _full_cache_bf16_insert_fake(
    q, kv, k_cache, slot_mapping, position_ids, cos_sin_cache, eps, cache_block_size, apply_q_norm=True,
):
    return None


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


def _no_result_fake(*args, **kwargs):
    return None


# qualified name -> (schema, reference, fake)
_IMPLS = {
    f"_C::{QUANT_INSERT}": (
        _SCHEMAS[QUANT_INSERT], fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert, _quant_insert_fake
    ),
    f"_C::{FULL_CACHE_BF16_INSERT}": (
        _SCHEMAS[FULL_CACHE_BF16_INSERT],
        fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert,
        _full_cache_bf16_insert_fake,
    ),
    f"_C::{WEAK_REF}": (_SCHEMAS[WEAK_REF], weak_ref_tensor, weak_ref_tensor),
    f"{FLASHMLA_NAMESPACE}::{SPARSE_DECODE}": (_SCHEMAS[SPARSE_DECODE], sparse_decode_fwd, _sparse_decode_fake),
    f"{FLASHMLA_NAMESPACE}::{SPARSE_PREFILL}": (_SCHEMAS[SPARSE_PREFILL], sparse_prefill_fwd, _sparse_prefill_fake),
    f"{OWN_NAMESPACE}::{QKV_RMSNORM}": (_SCHEMAS[QKV_RMSNORM], reference_fused_q_kv_rmsnorm, _fused_q_kv_rmsnorm_fake),
    f"{OWN_NAMESPACE}::{INV_ROPE}": (
        _SCHEMAS[INV_ROPE], reference_fused_inv_rope_fp8_quant, _fused_inv_rope_fp8_quant_fake
    ),
    f"{OWN_NAMESPACE}::{GATHER_K}": (_SCHEMAS[GATHER_K], reference_dequantize_and_gather_k_cache, _no_result_fake),
    f"{OWN_NAMESPACE}::{COMBINE_INDICES}": (_SCHEMAS[COMBINE_INDICES], reference_combine_topk_swa_indices,
                                            _no_result_fake),
}
assert tuple(_IMPLS) == REFERENCE_KERNELS

_libraries: dict[str, torch.library.Library] = {}
_registered: list[str] = []


def _register(qualified: str, impls: dict | None = None) -> None:
    """Define ``qualified`` (``namespace::name``) with its reference from ``impls``
    (qualified name -> ``(schema, reference, fake)``; this module's table by default)
    unless the namespace already has an op of that name (vLLM's own, or one registered
    here by an earlier call)."""
    if qualified in _registered:
        return
    namespace, name = qualified.split("::")
    if hasattr(getattr(torch.ops, namespace), name):
        return
    library = _libraries.get(namespace)
    if library is None:
        library = _libraries[namespace] = torch.library.Library(namespace, "FRAGMENT")
    schema, impl, fake = (_IMPLS if impls is None else impls)[qualified]
    library.define(name + schema)
    # Plain torch: the same code runs on whatever device the tensors are on.
    library.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(qualified, fake, lib=library)
    _registered.append(qualified)


def register_reference_kernels() -> tuple[str, ...]:
    """Register every reference in ``REFERENCE_KERNELS`` where its namespace lacks the op.

    Ops vLLM's own libraries already provide are left alone. Idempotent: a second call
    registers nothing new. Returns the qualified names (``namespace::name``) whose op is
    this module's reference (the same tuple on every call).
    """
    for qualified in REFERENCE_KERNELS:
        _register(qualified)
    return tuple(q for q in _registered if q in _IMPLS)


def register_ops(impls: dict) -> tuple[str, ...]:
    """Register the references of another table (qualified name -> ``(schema,
    reference, fake)``, e.g. ``vllm_kernels_compressed``'s) the way this module
    registers its own: where the namespace lacks the op, idempotently, sharing the
    ``torch.library`` fragments. Returns the names whose op is a reference here."""
    for qualified in impls:
        _register(qualified, impls)
    return tuple(q for q in impls if q in _registered)


def _own_op(name: str):
    """``torch.ops.capturelint_vllm.<name>``, registered on first use."""
    _register(f"{OWN_NAMESPACE}::{name}")
    return getattr(getattr(torch.ops, OWN_NAMESPACE), name)


def missing_kernel_error(name: str) -> str:
    """One line for an op vLLM calls and this module does not cover; ``name`` is
    ``namespace::op`` or a bare ``_C`` op name."""
    namespace, _, op = name.rpartition("::")
    return (
        f"vLLM calls {namespace or '_C'}.{op}, which capturelint has no CPU reference for; "
        f"references exist for {', '.join(REFERENCE_KERNELS)} "
        "(capturelint/adapters/vllm/kernels/reference.py)"
    )
