"""The DSV4 kernels as ``dsv4`` torch custom ops, with their torch reference implementations.

The idea: the bundled DeepSeek V4 model must look, to a dispatch-level observer, like the
real one does under vLLM. vLLM's attention kernels are registered custom ops, so a
``TorchDispatchMode`` (the tracer, the emulated graph backend) sees *one* call per kernel
with its argument tensors, and can tell what the kernel reads and writes from its schema
(``Tensor(a!)`` marks a mutated argument). Written as plain torch code, the same kernel
would dissolve into dozens of ``aten`` ops whose in-place writes hit temporaries, and a
replayed graph would re-issue those instead of the kernel. Registering them keeps the
trace at the granularity the checker reasons about.

What is built, per ``docs/kernels.md`` (the contract; argument names and order are the
table's):

- ``dsv4::fused_qnorm_rope_kv_insert``: per-head q RMSNorm and RoPE into a padded
  ``q_out``, RoPE'd kv written to the sliding-window cache. Mutates ``kv_cache, q_out``.
- ``dsv4::save_partial_states``: a compressor's per-token kv/score states into its state
  cache. Mutates ``state_cache``.
- ``dsv4::compress_norm_rope_store``: on ratio boundaries, pools ``ratio`` saved states,
  normalises, RoPEs and stores one compressed row. Mutates ``out_cache``.
- ``dsv4::sparse_attn_indexer``: the lightning indexer's top-K compressed row ids into
  ``topk_out[:T]``. Mutates ``topk_out``.
- ``dsv4::sparse_attention``: sliding window plus compressed rows plus a sink, written
  into a caller-provided ``out``. Mutates ``out``.

Each op returns ``None`` and has a fake (meta) registration so it traces under
``FakeTensorMode`` and ``torch.compile``. The plain functions ``*_reference`` are the
bodies; they are exported so tests can run them under a dispatch mode and see every
``aten`` op they issue (the registered op hides its body from an outer mode).

The invariants every reference keeps, because these ops are captured into CUDA graphs:

**No host synchronisation.** No ``.item()``, ``.tolist()``, ``nonzero``, boolean-mask
indexing, or Python branching on tensor values: all data-dependent choices are
``torch.where``/``masked_fill`` on fixed shapes. Branches exist only on host ints and on
whether an optional tensor was passed, which a graph fixes at capture.

**Negative slots go to the scratch row.** A cache has one extra row at the end; a token
whose slot is negative (padding, a dummy run) writes there instead of being filtered out
on the host. Nothing ever reads the scratch row as data.

**Gathers are clamped.** Positions and block-table entries of padding tokens are
arbitrary, so every gather index is clamped into the tensor it indexes; what is gathered
for such tokens is then masked or sent to the scratch row.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

ROPE_THETA = 10000.0
"""RoPE base, as in the contract (GPT-NeoX rotate-halves style)."""


# --------------------------------------------------------------------------- helpers


def rope_inv_freq(rope_dim: int, device: torch.device | str | None = None) -> Tensor:
    """Per-pair rotation frequencies ``theta ** (-2i / rope_dim)`` in float32.

    Computed as ``exp(-2i/R * ln theta)`` because that is what the Triton kernels can
    compute too; the two agree to float rounding instead of to ``pow``'s error.
    """
    i = torch.arange(rope_dim // 2, device=device, dtype=torch.float32)
    return torch.exp(i * (-2.0 * math.log(ROPE_THETA) / rope_dim))


def rope(x: Tensor, positions: Tensor, rope_dim: int, inverse: bool = False) -> Tensor:
    """Rotate the last ``rope_dim`` dims of ``x`` by position (GPT-NeoX rotate-halves).

    ``x`` is ``[T, ..., D]`` and ``positions`` is ``[T]``; the leading dims between are
    broadcast (heads). The rope part ``[x1, x2]`` (halves) becomes
    ``[x1 cos - x2 sin, x2 cos + x1 sin]`` with angle ``p * inv_freq``; ``inverse=True``
    rotates by ``-p``, which undoes it. Computed in float32, returned in ``x.dtype``.
    """
    if rope_dim == 0:
        return x
    if rope_dim % 2 or rope_dim > x.shape[-1]:
        raise ValueError(f"rope_dim {rope_dim} must be even and at most {x.shape[-1]}")
    half = rope_dim // 2
    angles = positions.to(torch.float32)[:, None] * rope_inv_freq(rope_dim, x.device)
    bshape = (positions.shape[0],) + (1,) * (x.dim() - 2) + (half,)
    cos = angles.cos().view(bshape)
    sin = angles.sin().view(bshape)
    if inverse:
        sin = -sin
    xf = x.to(torch.float32)
    d = x.shape[-1]
    x1 = xf[..., d - rope_dim : d - half]
    x2 = xf[..., d - half :]
    rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return torch.cat([xf[..., : d - rope_dim], rotated], dim=-1).to(x.dtype)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dim: ``x / sqrt(mean(x^2) + eps) * weight``, in float32."""
    xf = x.to(torch.float32)
    y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (y * weight.to(torch.float32)).to(x.dtype)


def _write_rows(slot_mapping: Tensor, num_rows: int) -> Tensor:
    """Destination rows: the slot, or the scratch row (the last one) for negative slots."""
    slots = slot_mapping.to(torch.int64)
    return torch.where(slots >= 0, slots, torch.full_like(slots, num_rows - 1))


def _per_token(req_idx: Tensor, like: Tensor) -> Tensor:
    """``req_idx`` shaped to broadcast against a ``[T, n]`` index tensor."""
    return req_idx.to(torch.int64).view((req_idx.shape[0],) + (1,) * (like.dim() - 1))


def token_slots(positions: Tensor, req_idx: Tensor, block_table: Tensor, block_size: int) -> Tensor:
    """Cache slots of token positions: ``block_table[r, p // bs] * bs + p % bs``.

    ``positions`` is ``[T]`` or ``[T, n]``; the block index is clamped into the table so
    padding tokens with arbitrary positions gather from somewhere valid.
    """
    pos = positions.to(torch.int64)
    blk = (pos // block_size).clamp(0, block_table.shape[1] - 1)
    block = block_table.to(torch.int64)[_per_token(req_idx, pos), blk]
    return block * block_size + pos % block_size


def compressed_slots(
    rows: Tensor, req_idx: Tensor, block_table: Tensor, block_size: int, ratio: int
) -> Tensor:
    """Compressed-cache slots of per-request row ids ``j`` (``[T]`` or ``[T, n]``).

    Row ``j`` covers positions ``j*ratio .. j*ratio + ratio - 1`` and lives in the block
    holding its first position, at ``block * (bs // ratio) + ((j*ratio) % bs) // ratio``.
    """
    first = rows.to(torch.int64) * ratio
    blk = (first // block_size).clamp(0, block_table.shape[1] - 1)
    block = block_table.to(torch.int64)[_per_token(req_idx, first), blk]
    return block * (block_size // ratio) + (first % block_size) // ratio


def _clamp_rows(index: Tensor, cache: Tensor) -> Tensor:
    return index.clamp(0, cache.shape[0] - 1)


# --------------------------------------------------------------------- references


def fused_qnorm_rope_kv_insert_reference(
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
    """``q_out[:, :H] = rope(rmsnorm(q) * w)``, ``q_out[:, H:] = 0``, ``kv_cache[slot] = rope(kv)``.

    ``q_out`` has ``Hp >= H`` heads because the attention kernel wants a multiple of 4;
    the padding heads are zeroed so they are never uninitialised memory.
    """
    num_heads = q.shape[1]
    q_out[:, :num_heads].copy_(rope(rms_norm(q, q_norm_weight, eps), positions, rope_dim))
    q_out[:, num_heads:].zero_()
    rows = _write_rows(slot_mapping, kv_cache.shape[0])
    kv_cache.index_put_((rows,), rope(kv, positions, rope_dim).to(kv_cache.dtype))


def save_partial_states_reference(
    kv: Tensor, score: Tensor, slot_mapping: Tensor, state_cache: Tensor
) -> None:
    """``state_cache[slot, 0] = kv``, ``state_cache[slot, 1] = score``."""
    rows = _write_rows(slot_mapping, state_cache.shape[0])
    state_cache.index_put_((rows,), torch.stack([kv, score], dim=1).to(state_cache.dtype))


def compress_norm_rope_store_reference(
    positions: Tensor,
    slot_mapping: Tensor,
    req_idx: Tensor,
    block_table: Tensor,
    state_cache: Tensor,
    norm_weight: Tensor,
    out_cache: Tensor,
    ratio: int,
    block_size: int,
    rope_dim: int,
    eps: float,
) -> None:
    """Pool, normalise, RoPE and store one compressed row per completed ratio group.

    Every token computes a candidate row from the states of positions
    ``p-ratio+1 .. p`` (softmax of the scores over those ``ratio`` positions, per
    channel, weighting the kv states); only tokens with ``slot >= 0`` and
    ``(p+1) % ratio == 0`` store it, at row ``j = p // ratio``, with RoPE at the group's
    first position ``p-ratio+1``. The others store into the scratch row, which keeps the
    op free of a host-side filter.
    """
    pos = positions.to(torch.int64)
    offsets = torch.arange(1 - ratio, 1, device=pos.device, dtype=torch.int64)
    group = (pos[:, None] + offsets).clamp(min=0)  # [T, ratio]
    src = _clamp_rows(token_slots(group, req_idx, block_table, block_size), state_cache)
    states = state_cache[src].to(torch.float32)  # [T, ratio, 2, C]
    weights = torch.softmax(states[:, :, 1], dim=1)
    pooled = (weights * states[:, :, 0]).sum(dim=1)  # [T, C]
    row = rope(rms_norm(pooled, norm_weight, eps), pos - (ratio - 1), rope_dim)

    store = (slot_mapping >= 0) & ((pos + 1) % ratio == 0)
    dest = compressed_slots(pos // ratio, req_idx, block_table, block_size, ratio)
    dest = torch.where(store, dest, torch.full_like(dest, out_cache.shape[0] - 1))
    out_cache.index_put_((dest,), row.to(out_cache.dtype))


def sparse_attn_indexer_reference(
    index_q: Tensor,
    weights: Tensor,
    index_k_cache: Tensor,
    positions: Tensor,
    req_idx: Tensor,
    block_table: Tensor,
    topk_out: Tensor,
    ratio: int,
    block_size: int,
) -> None:
    """``topk_out[:T]`` = the top-K compressed row ids by ``sum_h w[t,h] relu(q[t,h].k_j)``.

    All ``N = B*bs // ratio`` rows a block table can address are scored; rows not yet
    complete at position ``p`` (``(j+1)*ratio > p+1``) score ``-inf`` and come out as
    ``-1``. When ``N < K`` the scores are padded with ``-inf`` so ``topk`` keeps a fixed
    ``K``. Ids are sorted by descending score.
    """
    num_tokens = positions.shape[0]
    k = topk_out.shape[1]
    n = block_table.shape[1] * block_size // ratio
    pos = positions.to(torch.int64)
    rows = torch.arange(n, device=pos.device, dtype=torch.int64).expand(num_tokens, n)
    slots = _clamp_rows(
        compressed_slots(rows, req_idx, block_table, block_size, ratio), index_k_cache
    )
    keys = index_k_cache[slots].to(torch.float32)  # [T, N, Di]
    dots = torch.einsum("thd,tnd->thn", index_q.to(torch.float32), keys).relu()
    scores = torch.einsum("th,thn->tn", weights.to(torch.float32), dots)
    complete = (rows + 1) * ratio <= pos[:, None] + 1
    scores = scores.masked_fill(~complete, float("-inf"))
    if n < k:
        scores = torch.nn.functional.pad(scores, (0, k - n), value=float("-inf"))
    values, ids = torch.topk(scores, k, dim=1)
    ids = torch.where(values == float("-inf"), torch.full_like(ids, -1), ids)
    topk_out[:num_tokens].copy_(ids.to(topk_out.dtype))


def sparse_attention_reference(
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
    """``out[t, h]`` = attention of head ``h < H`` over window keys, compressed rows and a sink.

    Keys are the ``window`` positions ``p-window+1 .. p`` that are ``>= 0`` (from
    ``swa_cache``) and, when ``comp_cache`` is given, the rows ``comp_rows[t] >= 0``
    (from ``comp_cache``); values are the keys (one shared KV head). Logits are
    ``scale * q.k``; the sink logit ``sink[h]`` (unscaled) joins the softmax
    denominator but has no value, so a token with no valid key gets zeros. The softmax
    subtracts the running max (over keys and sink) for stability.
    """
    if (comp_cache is None) != (comp_rows is None):
        raise ValueError("comp_cache and comp_rows must be given together")
    num_tokens, num_heads = out.shape[0], out.shape[1]
    qh = q[:, :num_heads].to(torch.float32)  # [T, H, D]
    pos = positions.to(torch.int64)

    wpos = pos[:, None] + torch.arange(1 - window, 1, device=pos.device, dtype=torch.int64)
    wslots = _clamp_rows(token_slots(wpos.clamp(min=0), req_idx, block_table, block_size), swa_cache)
    keys = [swa_cache[wslots].to(torch.float32)]  # [T, W, D]
    valid = [wpos >= 0]
    if comp_cache is not None:
        rows = comp_rows.to(torch.int64)
        cslots = _clamp_rows(
            compressed_slots(rows.clamp(min=0), req_idx, block_table, block_size, ratio),
            comp_cache,
        )
        keys.append(comp_cache[cslots].to(torch.float32))  # [T, K, D]
        valid.append(rows >= 0)
    kv = torch.cat(keys, dim=1)
    mask = torch.cat(valid, dim=1)[:, None, :]  # [T, 1, W+K]

    logits = torch.einsum("thd,tkd->thk", qh, kv) * scale
    logits = logits.masked_fill(~mask, float("-inf"))
    # The sink is one more logit with no value: it sets the max with the keys (so the
    # max is finite even when every key is masked, or there are none) and joins the
    # denominator, and its probability is then dropped.
    sink_logit = sink[:num_heads].to(torch.float32).view(1, num_heads, 1).expand(num_tokens, -1, -1)
    logits = torch.cat([logits, sink_logit], dim=-1)
    weights = torch.exp(logits - logits.amax(dim=-1, keepdim=True))
    probs = weights / weights.sum(dim=-1, keepdim=True)
    result = torch.einsum("thk,tkd->thd", probs[..., :-1], kv)
    out.copy_(result.to(out.dtype))


# ------------------------------------------------------------------ registration


def _register(name: str, reference, mutates: tuple[str, ...]):
    """Register ``reference`` as ``dsv4::name`` with a no-op fake (all ops return None)."""
    op = torch.library.custom_op(f"dsv4::{name}", mutates_args=mutates)(reference)

    @op.register_fake
    def _fake(*args, **kwargs) -> None:
        return None

    without_dynamo_import(op)
    return op


def without_dynamo_import(op) -> None:
    """Spare every process that runs the engine the import of ``torch._dynamo``.

    ``custom_op`` wraps an op's body in ``torch._disable_dynamo``, which imports
    ``torch._dynamo`` at the op's first call (2-3 s of a 5 s untraced run on this
    project's machines: BENCHMARKS.md) to keep a ``torch.compile`` from tracing into the
    body. Nothing compiles this engine, so where ``torch._dynamo`` is not loaded yet the
    wrapper is told, in its own cache attribute, that the body is its own disabled form;
    once a program has loaded ``torch._dynamo`` (it compiles something) torch's wrapper
    is left as it is. Torch versions without that attribute keep their wrapper too."""
    import sys

    if "torch._dynamo" in sys.modules:
        return
    for wrapper in getattr(op, "_backend_fns", {}).values():
        body = getattr(wrapper, "__wrapped__", None)
        if body is not None and getattr(body, "__dynamo_disable", None) is None:
            setattr(body, "__dynamo_disable", body)


fused_qnorm_rope_kv_insert = _register(
    "fused_qnorm_rope_kv_insert", fused_qnorm_rope_kv_insert_reference, ("kv_cache", "q_out")
)
save_partial_states = _register(
    "save_partial_states", save_partial_states_reference, ("state_cache",)
)
compress_norm_rope_store = _register(
    "compress_norm_rope_store", compress_norm_rope_store_reference, ("out_cache",)
)
sparse_attn_indexer = _register(
    "sparse_attn_indexer", sparse_attn_indexer_reference, ("topk_out",)
)
sparse_attention = _register("sparse_attention", sparse_attention_reference, ("out",))

__all__ = [
    "ROPE_THETA",
    "compress_norm_rope_store",
    "compressed_slots",
    "fused_qnorm_rope_kv_insert",
    "rms_norm",
    "rope",
    "rope_inv_freq",
    "save_partial_states",
    "sparse_attention",
    "sparse_attn_indexer",
    "token_slots",
]
