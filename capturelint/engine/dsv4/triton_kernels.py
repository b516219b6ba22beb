"""Triton implementations of the KV insert and the sparse attention, as ``dsv4`` custom ops.

The idea: the references in :mod:`capturelint.engine.dsv4.ops` say what each kernel
computes; these say how a GPU would, so the engine's ``kernels="triton"`` option runs
real kernel launches inside the captured (or eager-broken) regions. The checker must see
the same thing either way, so each implementation is registered as its own custom op with
the reference's arguments and mutation set:

- ``dsv4::fused_qnorm_rope_kv_insert_triton`` (mutates ``kv_cache, q_out``)
- ``dsv4::sparse_attention_triton`` (mutates ``out``)

Each op's body launches one kernel, so a ``TorchDispatchMode`` sees one op per call, as
with the references (``custom_op`` rather than ``triton_op``: a ``triton_op`` may be
decomposed into its kernel-wrapper call under a dispatch mode).

**Interpreter or compiler is decided at the first launch, not at import.** Triton picks
its interpreter when a kernel is decorated, from ``TRITON_INTERPRET``. The kernels here
are plain functions decorated lazily, once per setting, so importing this module in any
order sets nothing and decides nothing; a process that sets ``TRITON_INTERPRET=1``
before its first launch runs them on CPU tensors, and one that clears it compiles them
for CUDA tensors. Launching on CPU tensors without the interpreter is an error that says
so, instead of a crash inside Triton.

**Negative slots are masked, not redirected.** Unlike the references, the kernels skip
writes for negative slots entirely, so the scratch row is left as it was; every other
row matches the reference.

Both kernels compute in float32 with elementwise products and reductions (no
``tl.dot``), so results match the references to float rounding on CPU and GPU alike
(``tl.dot`` would round through TF32 on a GPU and would need 16-wide tiles).
"""

from __future__ import annotations

import math
import os
from typing import Callable, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from capturelint.engine.dsv4.ops import ROPE_THETA, without_dynamo_import

_HEADS_PER_PROGRAM = 4
"""Query heads per attention program: ``Hp`` is a multiple of this, and the heads of a
program share every key load (one KV head)."""

_KEYS_PER_TILE = 8
"""Keys per online-softmax step. Small because the interpreter's cost grows with tiles."""


def _interpreting() -> bool:
    """Whether Triton would interpret a kernel decorated now (``TRITON_INTERPRET``)."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


_jitted: dict[tuple[str, bool], Callable] = {}


def _kernel(fn: Callable, device: torch.device) -> Callable:
    """``triton.jit(fn)`` for the current interpreter setting, decorated once per setting."""
    interpret = _interpreting()
    if device.type == "cpu" and not interpret:
        raise RuntimeError(
            f"Triton kernel {fn.__name__} got CPU tensors but TRITON_INTERPRET is not set; "
            "Triton can only run on a CPU through its interpreter. Set TRITON_INTERPRET=1 "
            "before the first Triton launch, or use the torch reference ops."
        )
    key = (fn.__name__, interpret)
    if key not in _jitted:
        _jitted[key] = triton.jit(fn)
    return _jitted[key]


def _last_dim_contiguous(t: Tensor, name: str) -> None:
    """Mutated outputs are written in place, so they cannot be copied to fix their layout."""
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim, got strides {t.stride()}")


# ------------------------------------------------------------------ fused q-norm / RoPE / KV insert


def _qnorm_rope_kv_insert_kernel(
    q_ptr, kv_ptr, pos_ptr, slot_ptr, w_ptr, cache_ptr, qout_ptr,
    q_st_t, q_st_h, kv_st_t, cache_st, qout_st_t, qout_st_h,
    num_heads, padded_heads, head_dim, rope_dim, eps, freq_exponent,
    BLOCK_D: tl.constexpr,
):
    """One program per (token, head slot): heads ``< H`` norm and RoPE q, heads
    ``H .. Hp-1`` write zeros, slot ``Hp`` RoPEs kv into the cache (masked for ``slot < 0``).

    RoPE reads each element's partner (``d +- R/2``) from memory rather than shuffling
    registers: ``out[d] = x[d] cos + sign * x[partner] sin`` with sign ``-1`` on the first
    half of the rope dims.
    """
    t = tl.program_id(0)
    h = tl.program_id(1)
    offs = tl.arange(0, BLOCK_D)
    in_dim = offs < head_dim
    pos = tl.load(pos_ptr + t).to(tl.float32)

    rope_start = head_dim - rope_dim
    half = rope_dim // 2
    rel = offs - rope_start
    in_rope = in_dim & (rel >= 0)
    first_half = rel < half
    partner = tl.where(first_half, offs + half, offs - half)
    partner = tl.where(in_rope, partner, offs)
    pair = tl.where(first_half, rel, rel - half)
    pair = tl.where(in_rope, pair, 0)
    angle = pos * tl.exp(pair.to(tl.float32) * freq_exponent)
    cos = tl.cos(angle)
    sin = tl.where(first_half, -tl.sin(angle), tl.sin(angle))

    if h < num_heads:
        row = q_ptr + t.to(tl.int64) * q_st_t + h * q_st_h
        x = tl.load(row + offs, mask=in_dim, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / head_dim + eps)
        w = tl.load(w_ptr + offs, mask=in_dim, other=0.0).to(tl.float32)
        xp = tl.load(row + partner, mask=in_rope, other=0.0).to(tl.float32)
        wp = tl.load(w_ptr + partner, mask=in_rope, other=0.0).to(tl.float32)
        y = x * rstd * w
        yp = xp * rstd * wp
        y = tl.where(in_rope, y * cos + yp * sin, y)
        dst = qout_ptr + t.to(tl.int64) * qout_st_t + h * qout_st_h
        tl.store(dst + offs, y.to(qout_ptr.dtype.element_ty), mask=in_dim)
    elif h < padded_heads:
        dst = qout_ptr + t.to(tl.int64) * qout_st_t + h * qout_st_h
        tl.store(dst + offs, tl.zeros([BLOCK_D], tl.float32).to(qout_ptr.dtype.element_ty), mask=in_dim)
    else:
        slot = tl.load(slot_ptr + t).to(tl.int64)
        row = kv_ptr + t.to(tl.int64) * kv_st_t
        x = tl.load(row + offs, mask=in_dim, other=0.0).to(tl.float32)
        xp = tl.load(row + partner, mask=in_rope, other=0.0).to(tl.float32)
        y = tl.where(in_rope, x * cos + xp * sin, x)
        # The slot as a vector: a block mask, not a scalar one, covers both backends.
        slots = tl.zeros([BLOCK_D], tl.int64) + slot
        write = in_dim & (slots >= 0)
        tl.store(
            cache_ptr + tl.where(write, slots, 0) * cache_st + offs,
            y.to(cache_ptr.dtype.element_ty),
            mask=write,
        )


def fused_qnorm_rope_kv_insert_triton_impl(
    q: Tensor,
    kv: Tensor,
    positions: Tensor,
    slot_mapping: Tensor,
    q_norm_weight: Tensor,
    kv_cache: Tensor,
    q_out: Tensor,
    rope_dim: int,
    eps: float,
) -> None:
    """Launch the fused kernel: grid ``(T, Hp + 1)``; see the reference for semantics."""
    num_tokens, num_heads, head_dim = q.shape
    if num_tokens == 0:
        return
    if rope_dim % 2 or rope_dim > head_dim:
        raise ValueError(f"rope_dim {rope_dim} must be even and at most {head_dim}")
    _last_dim_contiguous(kv_cache, "kv_cache")
    _last_dim_contiguous(q_out, "q_out")
    q = q if q.stride(-1) == 1 else q.contiguous()
    kv = kv if kv.stride(-1) == 1 else kv.contiguous()
    padded_heads = q_out.shape[1]
    kernel = _kernel(_qnorm_rope_kv_insert_kernel, q.device)
    kernel[(num_tokens, padded_heads + 1)](
        q, kv, positions.contiguous(), slot_mapping.contiguous(), q_norm_weight.contiguous(),
        kv_cache, q_out,
        q.stride(0), q.stride(1), kv.stride(0), kv_cache.stride(0), q_out.stride(0), q_out.stride(1),
        num_heads, padded_heads, head_dim, rope_dim, eps,
        -2.0 * math.log(ROPE_THETA) / max(rope_dim, 1),
        BLOCK_D=triton.next_power_of_2(head_dim),
    )


# ------------------------------------------------------------------------- sparse attention


def _sparse_attention_kernel(
    q_ptr, swa_ptr, comp_ptr, rows_ptr, pos_ptr, req_ptr, bt_ptr, sink_ptr, out_ptr,
    q_st_t, q_st_h, swa_st, comp_st, rows_st, bt_st, out_st_t, out_st_h,
    num_heads, head_dim, num_rows, blocks_per_req, swa_slots, comp_slots,
    window, ratio, block_size, scale,
    HAS_COMP: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program per (token, group of ``BLOCK_H`` heads), online softmax over key tiles.

    The running max starts at the sink logit and the running denominator at
    ``exp(sink - sink) = 1``: the sink joins the denominator with no value, and since it
    is finite no all-masked tile can produce ``-inf - -inf``.
    """
    t = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < num_heads
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    keys = tl.arange(0, BLOCK_N)

    pos = tl.load(pos_ptr + t).to(tl.int64)
    bt_row = bt_ptr + tl.load(req_ptr + t).to(tl.int64) * bt_st

    q = tl.load(
        q_ptr + t.to(tl.int64) * q_st_t + heads[:, None] * q_st_h + d[None, :],
        mask=head_ok[:, None] & d_ok[None, :], other=0.0,
    ).to(tl.float32)
    peak = tl.load(sink_ptr + heads, mask=head_ok, other=0.0).to(tl.float32)
    denom = tl.full([BLOCK_H], 1.0, tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)

    for start in range(0, window, BLOCK_N):
        n = start + keys
        kpos = pos - window + 1 + n
        ok = (n < window) & (kpos >= 0)
        kpos = tl.where(ok, kpos, 0)
        blk = tl.minimum(kpos // block_size, blocks_per_req - 1)
        block = tl.load(bt_row + blk, mask=ok, other=0).to(tl.int64)
        slot = tl.minimum(tl.maximum(block * block_size + kpos % block_size, 0), swa_slots - 1)
        k = tl.load(
            swa_ptr + slot[:, None] * swa_st + d[None, :], mask=ok[:, None] & d_ok[None, :], other=0.0
        ).to(tl.float32)
        logits = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale
        logits = tl.where(ok[None, :], logits, float("-inf"))
        new_peak = tl.maximum(peak, tl.max(logits, axis=1))
        alpha = tl.exp(peak - new_peak)
        p = tl.exp(logits - new_peak[:, None])
        denom = denom * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * k[None, :, :], axis=1)
        peak = new_peak

    if HAS_COMP:
        rows_per_block = block_size // ratio
        for start in range(0, num_rows, BLOCK_N):
            n = start + keys
            row = tl.load(rows_ptr + t.to(tl.int64) * rows_st + n, mask=n < num_rows, other=-1).to(tl.int64)
            ok = row >= 0
            first = tl.where(ok, row, 0) * ratio
            blk = tl.minimum(first // block_size, blocks_per_req - 1)
            block = tl.load(bt_row + blk, mask=ok, other=0).to(tl.int64)
            slot = block * rows_per_block + (first % block_size) // ratio
            slot = tl.minimum(tl.maximum(slot, 0), comp_slots - 1)
            k = tl.load(
                comp_ptr + slot[:, None] * comp_st + d[None, :], mask=ok[:, None] & d_ok[None, :], other=0.0
            ).to(tl.float32)
            logits = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale
            logits = tl.where(ok[None, :], logits, float("-inf"))
            new_peak = tl.maximum(peak, tl.max(logits, axis=1))
            alpha = tl.exp(peak - new_peak)
            p = tl.exp(logits - new_peak[:, None])
            denom = denom * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * k[None, :, :], axis=1)
            peak = new_peak

    result = acc / denom[:, None]
    tl.store(
        out_ptr + t.to(tl.int64) * out_st_t + heads[:, None] * out_st_h + d[None, :],
        result.to(out_ptr.dtype.element_ty),
        mask=head_ok[:, None] & d_ok[None, :],
    )


def sparse_attention_triton_impl(
    q: Tensor,
    swa_cache: Tensor,
    comp_cache: Optional[Tensor],
    comp_rows: Optional[Tensor],
    positions: Tensor,
    req_idx: Tensor,
    block_table: Tensor,
    sink: Tensor,
    out: Tensor,
    window: int,
    ratio: int,
    block_size: int,
    scale: float,
) -> None:
    """Launch the attention kernel: grid ``(T, ceil(H / 4))``; see the reference."""
    if (comp_cache is None) != (comp_rows is None):
        raise ValueError("comp_cache and comp_rows must be given together")
    num_tokens, num_heads, head_dim = out.shape
    if num_tokens == 0:
        return
    _last_dim_contiguous(out, "out")
    q = q if q.stride(-1) == 1 else q.contiguous()
    swa_cache = swa_cache.contiguous()
    has_comp = comp_cache is not None
    if has_comp:
        comp_cache = comp_cache.contiguous()
        comp_rows = comp_rows.contiguous()
    else:
        # Never read (HAS_COMP is a compile-time false); any tensor fills the pointer slots.
        comp_cache, comp_rows = swa_cache, positions
    block_table = block_table.contiguous()
    kernel = _kernel(_sparse_attention_kernel, q.device)
    kernel[(num_tokens, triton.cdiv(num_heads, _HEADS_PER_PROGRAM))](
        q, swa_cache, comp_cache, comp_rows, positions.contiguous(), req_idx.contiguous(),
        block_table, sink.contiguous(), out,
        q.stride(0), q.stride(1), swa_cache.stride(0), comp_cache.stride(0),
        comp_rows.stride(0) if has_comp else 0, block_table.stride(0), out.stride(0), out.stride(1),
        num_heads, head_dim, comp_rows.shape[1] if has_comp else 0, block_table.shape[1],
        swa_cache.shape[0], comp_cache.shape[0],
        window, ratio, block_size, scale,
        HAS_COMP=has_comp, BLOCK_H=_HEADS_PER_PROGRAM, BLOCK_N=_KEYS_PER_TILE,
        BLOCK_D=triton.next_power_of_2(head_dim),
    )


# ------------------------------------------------------------------------------ registration


def _register(name: str, impl: Callable, mutates: tuple[str, ...]):
    """Register ``impl`` as ``dsv4::name`` with a no-op fake (the ops return None)."""
    op = torch.library.custom_op(f"dsv4::{name}", mutates_args=mutates)(impl)

    @op.register_fake
    def _fake(*args, **kwargs) -> None:
        return None

    without_dynamo_import(op)
    return op


fused_qnorm_rope_kv_insert_triton = _register(
    "fused_qnorm_rope_kv_insert_triton", fused_qnorm_rope_kv_insert_triton_impl, ("kv_cache", "q_out")
)
sparse_attention_triton = _register(
    "sparse_attention_triton", sparse_attention_triton_impl, ("out",)
)

__all__ = ["fused_qnorm_rope_kv_insert_triton", "sparse_attention_triton"]
