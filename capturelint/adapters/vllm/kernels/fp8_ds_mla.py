"""The ``fp8_ds_mla`` KV layout of DeepSeek V4's sliding-window and compressed caches,
and the math the references share: GPT-J RoPE and UE8M0 (power-of-two) fp8 scales.

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

Quantization, as in the CUDA kernels: a quant block's scale is ``2^e`` with ``e =
ceil(log2(max(amax, 1e-4) / 448))``, its byte ``clamp(e + 127, 0, 255)``; values are
``clamp(x * 2^-e, -448, 448)`` rounded to nearest-even e4m3 (subnormals kept). A zero
block thus gets ``e = -22``, byte 105. fp8 is OCP e4m3 (``float8_e4m3fn``, max 448),
not the FNUZ variant of ROCm gfx942. ``dequantize_fp8_ds_mla`` reads the RoPE bytes as
bf16, the only dtype vLLM uses.
"""

from __future__ import annotations

import torch

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


# ---------------------------------------------------------------------------- math


def cos_sin(cos_sin_cache: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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


def ceil_log2(r: torch.Tensor) -> torch.Tensor:
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
    exponent = ceil_log2(amax / FP8_MAX)  # [n, 7] int32
    inv_scale = torch.ldexp(torch.ones_like(amax), -exponent)  # exact power of two
    scaled = (blocks * inv_scale[..., None]).clamp(-FP8_MAX, FP8_MAX)
    fp8_bytes = scaled.to(torch.float8_e4m3fn).view(torch.uint8).reshape(n, NOPE_DIM)
    scale_bytes = (exponent + UE8M0_BIAS).clamp(0, 255).to(torch.uint8)
    return fp8_bytes, scale_bytes


# ----------------------------------------------------------------------- cache layout


def check_fp8_ds_mla_cache(k_cache: torch.Tensor, block_size: int) -> None:
    if k_cache.dtype != torch.uint8 or k_cache.dim() != 2:
        raise ValueError(f"k_cache must be a 2-D uint8 tensor, got {k_cache.dtype} {tuple(k_cache.shape)}")
    if block_size <= 0:
        raise ValueError(f"cache_block_size must be positive, got {block_size}")
    if k_cache.shape[1] < block_size * TOKEN_BYTES:
        raise ValueError(
            f"k_cache rows hold {k_cache.shape[1]} bytes; block_size {block_size} needs "
            f"{block_size * TOKEN_BYTES} ({TOKEN_BYTES} per token)"
        )


def slot_offsets(slots: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per slot: cache row (block), first token-data byte, first scale byte."""
    block = torch.div(slots, block_size, rounding_mode="floor")
    token = slots - block * block_size
    data = token * TOKEN_DATA_BYTES
    scale = block_size * TOKEN_DATA_BYTES + token * SCALE_BYTES_PER_TOKEN
    return block, data, scale


def write_fp8_ds_mla(k_cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor, block_size: int) -> None:
    """Quantize ``rows [n, 512]`` (already roped, kv dtype) into ``k_cache`` at ``slots``."""
    if rows.shape[0] == 0:
        return
    fp8_bytes, scale_bytes = ue8m0_quantize(rows[:, :NOPE_DIM])
    rope_bytes = rows[:, NOPE_DIM:].contiguous().view(torch.uint8)  # [n, 128], little-endian
    token_bytes = torch.cat((fp8_bytes, rope_bytes), dim=1)  # [n, 576]
    pad = torch.zeros(rows.shape[0], 1, dtype=torch.uint8, device=rows.device)
    token_scales = torch.cat((scale_bytes, pad), dim=1)  # [n, 8]
    block, data, scale = slot_offsets(slots, block_size)
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
    check_fp8_ds_mla_cache(k_cache, block_size)
    slots = torch.as_tensor(slots, dtype=torch.int64, device=k_cache.device).reshape(-1)
    n = slots.shape[0]
    block, data, scale = slot_offsets(slots, block_size)
    data_cols = data[:, None] + torch.arange(TOKEN_DATA_BYTES, device=k_cache.device)
    scale_cols = scale[:, None] + torch.arange(NUM_QUANT_BLOCKS, device=k_cache.device)
    token_bytes = k_cache[block[:, None], data_cols]  # [n, 576]
    scale_bytes = k_cache[block[:, None], scale_cols]  # [n, 7]
    values = token_bytes[:, :NOPE_DIM].contiguous().view(torch.float8_e4m3fn).float()
    scales = torch.ldexp(torch.ones(n, NUM_QUANT_BLOCKS, device=k_cache.device), scale_bytes.int() - UE8M0_BIAS)
    nope = (values.reshape(n, NUM_QUANT_BLOCKS, QUANT_BLOCK) * scales[..., None]).reshape(n, NOPE_DIM)
    rope = token_bytes[:, NOPE_DIM:].contiguous().view(torch.bfloat16).float()
    return torch.cat((nope, rope), dim=1)


__all__ = ["AMAX_FLOOR", "FP8_MAX", "HEAD_DIM", "NOPE_DIM", "NUM_QUANT_BLOCKS", "QUANT_BLOCK", "ROPE_DIM",
           "SCALE_BYTES_PER_TOKEN", "TOKEN_BYTES", "TOKEN_DATA_BYTES", "UE8M0_BIAS", "apply_gptj_rope", "ceil_log2",
           "check_fp8_ds_mla_cache", "cos_sin", "dequantize_fp8_ds_mla", "slot_offsets", "ue8m0_quantize",
           "write_fp8_ds_mla"]
