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
``torch.ops._C.<name>`` so that unchanged vLLM code finds them.

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
``register_reference_kernels``
    Defines the two ops in the ``_C`` namespace with vLLM's schemas (written arguments
    annotated ``Tensor(a!)``) when ``torch.ops._C`` lacks them; idempotent.

Numerics, as in the CUDA kernel: all math in fp32 with the fp32 ``cos_sin_cache``
(``[max_pos, 64]``: 32 cosines, then 32 sines; pair ``i`` is dims ``448+2i, 448+2i+1``,
``even' = even*cos - odd*sin``, ``odd' = even*sin + odd*cos``); one rounding of q at the
end. A quant block's scale is ``2^e`` with ``e = ceil(log2(max(amax, 1e-4) / 448))``,
its byte ``clamp(e + 127, 0, 255)``; values are ``clamp(x * 2^-e, -448, 448)`` rounded to
nearest-even e4m3 (subnormals kept). A zero block thus gets ``e = -22``, byte 105.

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
* Only the two ops above; the per-tensor-fp8 full-cache op, the KV-only inserts and any
  other ``_C`` op are not covered (``missing_kernel_error`` words the failure).
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
    "register_reference_kernels",
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

#: The ``torch.ops._C`` ops this module has a reference for.
REFERENCE_KERNELS: tuple[str, ...] = (QUANT_INSERT, FULL_CACHE_BF16_INSERT)

# vLLM 0.33.0's schemas (from its _C library), with the written arguments annotated
# Tensor(a!) / Tensor(b!) so functionalization sees the mutations.
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


_IMPLS = {
    QUANT_INSERT: (fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert, _quant_insert_fake),
    FULL_CACHE_BF16_INSERT: (fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert, _full_cache_bf16_insert_fake),
}

_library: torch.library.Library | None = None
_registered: list[str] = []


def register_reference_kernels() -> tuple[str, ...]:
    """Register the references as ``torch.ops._C.<name>`` where ``_C`` lacks the op.

    Ops vLLM's own ``_C`` already provides are left alone. Idempotent: a second call
    registers nothing new. Returns the names whose ``torch.ops._C`` op is this module's
    reference (the same tuple on every call).
    """
    global _library
    for name in REFERENCE_KERNELS:
        if name in _registered or hasattr(torch.ops._C, name):
            continue
        if _library is None:
            _library = torch.library.Library("_C", "FRAGMENT")
        impl, fake = _IMPLS[name]
        _library.define(name + _SCHEMAS[name])
        # Plain torch: the same code runs on whatever device the tensors are on.
        _library.impl(name, impl, "CompositeExplicitAutograd")
        torch.library.register_fake(f"_C::{name}", fake, lib=_library)
        _registered.append(name)
    return tuple(_registered)


def missing_kernel_error(name: str) -> str:
    """One line for a ``torch.ops._C`` op vLLM calls and this module does not cover."""
    return (
        f"vLLM calls _C.{name}, which capturelint has no CPU reference for; "
        f"references exist for {', '.join(REFERENCE_KERNELS)} "
        "(capturelint/adapters/vllm_kernels.py)"
    )
