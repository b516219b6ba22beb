"""CPU references for the flash-linear-attention (FLA) Triton kernels vLLM's gated
delta-net layers call (``third_party/flash_linear_attention/ops/``, paths relative to
``vllm/``), inside the eager break ``qwen_gdn_attention_core``
(``model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py``) and, in FULL graphs, in
captured code.

The gated delta rule, per value head ``hv`` (key head ``h = hv // (HV // H)``), a state
``S [V, K]`` kept in float32 across a sequence's tokens; token ``t`` with query ``q``,
key ``k``, value ``v``, log-decay ``g`` and write strength ``beta``::

    S = S * exp(g)
    u = (v - S @ k) * beta
    S = S + u k^T
    o = S @ (q * scale)

(``scale`` defaults to ``K ** -0.5``; with ``use_qk_l2norm_in_kernel`` q and k are
first divided by ``sqrt(sum(x^2) + 1e-6)``). Entry points, each a drop-in with the
signature vLLM calls:

``fused_post_conv_prep`` (``fused_gdn_prefill_post_conv.py``)
    Split the conv output ``[L, 2*H*K + HV*V]`` into q, k ``[L, H, K]`` (L2-normalised
    in float32 when ``apply_l2norm``, stored in the input's dtype) and v ``[L, HV, V]``;
    gating ``g = -exp(A_log) * softplus(a + dt_bias)`` (softplus linear above 20) and
    ``beta = sigmoid(b)``, both float32 ``[L, HV]`` (``exp(g)`` when ``output_g_exp``).
``fused_sigmoid_gating_delta_rule_update`` (``fused_sigmoid_gating.py``)
    The rule over variable-length sequences (``cu_seqlens``) with the gating of the
    previous entry computed per token, continuous batching: sequence ``n`` reads its
    initial state from ``initial_state[idx]``, ``idx = indices.flatten()[n *
    stride(0)]`` (the kernel's ``i_t = 0`` without ``num_accepted_tokens``), and a
    sequence whose ``idx <= 0`` (vLLM's null block, padding) is skipped whole: its
    output rows are not written (the kernel returns), here they stay zero; after each
    of its tokens ``j`` the state is stored in place at ``indices.flatten()[n *
    stride(0) + j]`` when that is ``> 0``. Output ``[B, T, HV, V]`` in q's dtype.
``fused_recurrent_gated_delta_rule`` (``fused_recurrent.py``)
    The same with ``g``/``beta`` given.
``fused_recurrent_gated_delta_rule_packed_decode`` (``fused_recurrent.py``)
    One token per sequence, q, k and v packed in one row (``[q | k | v]``), the gating
    of the sigmoid-gated update, states in place; a skipped sequence's rows are zero
    (this kernel stores zeros there).
``chunk_gated_delta_rule`` (``chunk.py``)
    The same rule computed chunk-wise (a WY representation of 64-token chunks: the
    same recurrence, different rounding); ``initial_state [N, HV, V, K]`` per sequence,
    final states ``[N, HV, V, K]`` float32 when ``output_final_state``; output in q's
    dtype.
``l2norm_fwd`` (``l2norm.py``)
    ``x / sqrt(sum(x^2) + eps)`` over the last dimension, in float32, stored in
    ``output_dtype`` (default x's).

Why references and not Triton's interpreter (``kernels.interpreter``): in FULL graphs
the break is captured whole, and interpreted Triton copies its arguments through numpy,
which a capture records as capture-time copies. The recurrence here reads no host value
(``_recurrence``: one step per token of the batch, its sequence found by
``searchsorted``, states gathered and scattered by index), so it is capture-safe, and
each entry is one registered op (``torch.ops.capturelint_vllm.gdn_*``) that writes its
output arguments. ``tests/vllm/test_family_gdn.py`` runs vLLM's kernels in Triton's
interpreter (float32: the interpreter computes bf16 tiles wrongly) against these:
``fused_post_conv_prep``, ``l2norm_fwd`` and the sigmoid-gated update directly; the
given-gates recurrence and the chunked rule against the sigmoid-gated kernel fed the
same gates' inputs (``fused_recurrent.py`` reads ``exp`` from FLA's ``op`` module,
bound at import to vLLM's Triton placeholder, and the chunk kernels are autotuned and
heuristic-decorated, which the interpreter does not take as vLLM leaves them; both
compute the rule above, which the sigmoid-gated kernel computes).

Limits: no speculative decoding (``num_accepted_tokens``), no KDA (per-key gating),
``inplace_final_state=False`` of the sigmoid-gating update is refused in one line, as
are ``chunk_indices``/``chunk_offsets`` that disagree with ``cu_seqlens`` (they are
derived from it; the reference does not read them).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from capturelint.adapters.vllm.kernels.library import OWN_NAMESPACE, Impls, no_result_fake, own_op
from capturelint.errors import CapturelintError

L2NORM_EPS = 1e-6
SOFTPLUS_THRESHOLD = 20.0

POST_CONV_PREP = "gdn_post_conv_prep"
RECURRENT = "gdn_recurrent"
CHUNK = "gdn_chunk"


def l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dimension, float32."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def gating(A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, b: torch.Tensor,
           softplus_beta: float = 1.0, threshold: float = SOFTPLUS_THRESHOLD) -> tuple[torch.Tensor, torch.Tensor]:
    """``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)``, float32."""
    x = a.float() + dt_bias.float()
    g = -torch.exp(A_log.float()) * F.softplus(x, beta=softplus_beta, threshold=threshold)
    return g, torch.sigmoid(b.float())


def reference_post_conv_prep(conv_output: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                             dt_bias: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             g: torch.Tensor, beta: torch.Tensor, apply_l2norm: bool, output_g_exp: bool) -> None:
    """Write q, k ``[L, H, K]``, v ``[L, HV, V]``, g, beta ``[L, HV]`` (module docstring)."""
    length, heads, key_dim = q.shape
    hk = heads * key_dim
    qf = conv_output[:, :hk].reshape(length, heads, key_dim)
    kf = conv_output[:, hk:2 * hk].reshape(length, heads, key_dim)
    if apply_l2norm:
        qf, kf = l2norm(qf), l2norm(kf)
    q.copy_(qf)
    k.copy_(kf)
    v.copy_(conv_output[:, 2 * hk:].reshape(v.shape))
    gate, strength = gating(A_log, a, dt_bias, b)
    g.copy_(gate.exp() if output_g_exp else gate)
    beta.copy_(strength)


def _row(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    """``x[i]`` for a 0-dim index tensor, without reading it on the host."""
    return x.index_select(0, i.reshape(1))[0]


def _recurrence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                states: torch.Tensor, live: torch.Tensor, cu_seqlens: torch.Tensor, scale: float,
                l2norm_qk: bool, store: Any = None) -> torch.Tensor:
    """The rule over the tokens ``[T]`` of ``q [T, H, K]``, ``v [T, HV, V]``, ``g``,
    ``beta [T, HV]``, sequence ``n`` spanning ``cu_seqlens[n]:cu_seqlens[n+1]`` and
    starting from ``states[n] [HV, V, K]`` (float32, updated in place). Rows of tokens
    past ``cu_seqlens[-1]`` or of a sequence with ``live[n]`` false are zero.
    ``store(t, n, j, state)`` is called after token ``t`` (``j``-th of sequence ``n``)."""
    tokens, heads, key_dim = q.shape
    value_heads = v.shape[1]
    group = value_heads // heads
    qf, kf = (l2norm(q), l2norm(k)) if l2norm_qk else (q.float(), k.float())
    qf = qf.repeat_interleave(group, dim=1) * scale  # [T, HV, K]
    kf = kf.repeat_interleave(group, dim=1)
    vf, gf, bf = v.float(), g.float(), beta.float()
    num_seqs = states.shape[0]
    bounds = cu_seqlens.to(torch.int64)
    rows = torch.arange(tokens, device=q.device)
    seq = torch.searchsorted(bounds[1:], rows, right=True)  # the sequence of each token
    valid = seq < num_seqs
    seq = seq.clamp(max=max(num_seqs - 1, 0))
    valid = valid & live[seq]
    step = rows - bounds[seq]
    out = torch.zeros(tokens, value_heads, v.shape[-1], dtype=torch.float32, device=q.device)
    for t in range(tokens):  # one token at a time: T is the batch's static size, no host read
        n = seq[t]
        before = _row(states, n)
        state = before * torch.exp(gf[t])[:, None, None]
        u = (vf[t] - torch.einsum("hvk,hk->hv", state, kf[t])) * bf[t][:, None]
        state = state + u[:, :, None] * kf[t][:, None, :]
        keep = valid[t]
        states.index_put_((n[None],), torch.where(keep, state, before)[None])
        out[t] = torch.where(keep, torch.einsum("hvk,hk->hv", state, qf[t]), out[t])
        if store is not None:
            store(t, n, step[t], keep, state)
    return out


def reference_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                        o: torch.Tensor, state: torch.Tensor, cu_seqlens: torch.Tensor, indices: torch.Tensor,
                        scale: float, use_qk_l2norm_in_kernel: bool) -> None:
    """The in-place, state-indexed rule (``fused_sigmoid_gating_delta_rule_update``,
    ``fused_recurrent_gated_delta_rule`` with ``ssm_state_indices``): see the module docstring."""
    flat = indices.reshape(-1).to(torch.int64)
    stride = indices.stride(0) if indices.dim() else 1
    num_seqs = cu_seqlens.shape[0] - 1
    first = flat[torch.arange(num_seqs, device=flat.device) * stride]
    live = first > 0
    safe = torch.where(live, first, torch.zeros_like(first))
    states = torch.where(live[:, None, None, None], state[safe].float(), torch.zeros((), device=state.device))

    def store(t: int, n: torch.Tensor, j: torch.Tensor, keep: torch.Tensor, value: torch.Tensor) -> None:
        at = (n * stride + j).clamp(0, flat.shape[0] - 1)
        slot = _row(flat, at)
        ok = keep & (slot > 0)
        slot = torch.where(ok, slot, torch.zeros_like(slot))  # a skipped write writes the null block's own value back
        state.index_put_((slot[None],), torch.where(ok, value.to(state.dtype), _row(state, slot))[None])

    out = _recurrence(q[0], k[0], v[0], g[0], beta[0], states, live, cu_seqlens, scale, use_qk_l2norm_in_kernel,
                      store)
    o[0].copy_(out.to(o.dtype))


def reference_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                    initial_state: torch.Tensor, cu_seqlens: torch.Tensor, o: torch.Tensor, final_state: torch.Tensor,
                    scale: float, use_qk_l2norm_in_kernel: bool) -> None:
    """``chunk_gated_delta_rule`` over ``cu_seqlens``: ``o`` and ``final_state`` written."""
    states = initial_state.float().clone()
    live = torch.ones(states.shape[0], dtype=torch.bool, device=q.device)
    ql, kl = (l2norm(q[0]).to(q.dtype), l2norm(k[0]).to(k.dtype)) if use_qk_l2norm_in_kernel else (q[0], k[0])
    out = _recurrence(ql, kl, v[0], g[0], beta[0], states, live, cu_seqlens, scale, False)
    o[0].copy_(out.to(o.dtype))
    final_state.copy_(states)


# --- drop-ins with vLLM's signatures --------------------------------------------------


def l2norm_fwd(x: torch.Tensor, eps: float = L2NORM_EPS, output_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``l2norm.l2norm_fwd``."""
    return l2norm(x, eps).to(output_dtype or x.dtype)


def fused_post_conv_prep(conv_output: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                         dt_bias: torch.Tensor, num_k_heads: int, head_k_dim: int, head_v_dim: int,
                         apply_l2norm: bool = True, output_g_exp: bool = False) -> tuple[torch.Tensor, ...]:
    """``fused_gdn_prefill_post_conv.fused_post_conv_prep`` over the reference op."""
    length, width = conv_output.shape
    value_heads = A_log.shape[0]
    if width != 2 * num_k_heads * head_k_dim + value_heads * head_v_dim:
        raise CapturelintError(f"fused_post_conv_prep: conv output width {width} is not 2*H*K + HV*V for H="
                               f"{num_k_heads}, K={head_k_dim}, HV={value_heads}, V={head_v_dim}")
    dtype, device = conv_output.dtype, conv_output.device
    q = torch.empty(length, num_k_heads, head_k_dim, dtype=dtype, device=device)
    k = torch.empty_like(q)
    v = torch.empty(length, value_heads, head_v_dim, dtype=dtype, device=device)
    g = torch.empty(length, value_heads, dtype=torch.float32, device=device)
    beta = torch.empty_like(g)
    own_op(POST_CONV_PREP, IMPLS)(conv_output, a, b, A_log, dt_bias, q, k, v, g, beta, apply_l2norm, output_g_exp)
    return q, k, v, g, beta


def _varlen(q: torch.Tensor, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
    """``cu_seqlens``, or the equal-length sequences of ``q [B, T, ...]`` flattened."""
    if cu_seqlens is not None:
        if q.shape[0] != 1:
            raise CapturelintError(f"the gated delta rule takes a batch of 1 with cu_seqlens, not {q.shape[0]}")
        return cu_seqlens
    batch, length = q.shape[:2]
    return torch.arange(batch + 1, device=q.device, dtype=torch.int64) * length


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(1, x.shape[0] * x.shape[1], *x.shape[2:])


def _recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, scale: Any,
               initial_state: torch.Tensor, inplace_final_state: bool, cu_seqlens: torch.Tensor | None,
               ssm_state_indices: torch.Tensor | None, num_accepted_tokens: Any, use_qk_l2norm_in_kernel: bool,
               name: str) -> tuple[torch.Tensor, torch.Tensor]:
    if num_accepted_tokens is not None or not inplace_final_state or ssm_state_indices is None:
        raise CapturelintError(f"vLLM's {name} was called with "
                               + ("num_accepted_tokens (speculative decoding)" if num_accepted_tokens is not None
                                  else "inplace_final_state=False" if not inplace_final_state
                                  else "no ssm_state_indices")
                               + ", which capturelint's reference (kernels/gdn_fla.py) does not implement")
    bounds = _varlen(q, cu_seqlens)
    shape = v.shape
    if cu_seqlens is None:
        q, k, v, g, beta = map(_flat, (q, k, v, g, beta))
    scale = k.shape[-1] ** -0.5 if scale is None else float(scale)
    o = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    own_op(RECURRENT, IMPLS)(q, k, v, g, beta, o, initial_state, bounds, ssm_state_indices, scale,
                             bool(use_qk_l2norm_in_kernel))
    return o.reshape(shape), initial_state


def fused_sigmoid_gating_delta_rule_update(A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                                           dt_bias: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                           beta: float = 1.0, threshold: float = SOFTPLUS_THRESHOLD,
                                           scale: float | None = None, initial_state: torch.Tensor | None = None,
                                           inplace_final_state: bool = True, cu_seqlens: torch.Tensor | None = None,
                                           ssm_state_indices: torch.Tensor | None = None,
                                           num_accepted_tokens: torch.Tensor | None = None,
                                           use_qk_l2norm_in_kernel: bool = False,
                                           is_kda: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``fused_sigmoid_gating.fused_sigmoid_gating_delta_rule_update``: the gating, then
    the recurrent op."""
    if is_kda or initial_state is None:
        raise CapturelintError("vLLM's fused_sigmoid_gating_delta_rule_update was called with "
                               + ("is_kda" if is_kda else "no initial_state")
                               + ", which capturelint's reference (kernels/gdn_fla.py) does not implement")
    gate, strength = gating(A_log, a.reshape(*v.shape[:-1]), dt_bias, b.reshape(*v.shape[:-1]), beta, threshold)
    return _recurrent(q, k, v, gate, strength, scale, initial_state, inplace_final_state, cu_seqlens,
                      ssm_state_indices, num_accepted_tokens, use_qk_l2norm_in_kernel,
                      "fused_sigmoid_gating_delta_rule_update")


def fused_recurrent_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                                     beta: torch.Tensor | None = None, scale: float | None = None,
                                     initial_state: torch.Tensor | None = None, inplace_final_state: bool = True,
                                     cu_seqlens: torch.Tensor | None = None,
                                     ssm_state_indices: torch.Tensor | None = None,
                                     num_accepted_tokens: torch.Tensor | None = None,
                                     use_qk_l2norm_in_kernel: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``fused_recurrent.fused_recurrent_gated_delta_rule`` (state-indexed, in place)."""
    if initial_state is None:
        raise CapturelintError("vLLM's fused_recurrent_gated_delta_rule was called with no initial_state, which "
                               "capturelint's reference (kernels/gdn_fla.py) does not implement")
    if beta is None:
        beta = torch.ones_like(g)
    return _recurrent(q, k, v, g, beta, scale, initial_state, inplace_final_state, cu_seqlens, ssm_state_indices,
                      num_accepted_tokens, use_qk_l2norm_in_kernel, "fused_recurrent_gated_delta_rule")


def fused_recurrent_gated_delta_rule_packed_decode(mixed_qkv: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                                                   A_log: torch.Tensor, dt_bias: torch.Tensor, scale: float,
                                                   initial_state: torch.Tensor, out: torch.Tensor,
                                                   ssm_state_indices: torch.Tensor,
                                                   use_qk_l2norm_in_kernel: bool = False) -> tuple[torch.Tensor, ...]:
    """``fused_recurrent.fused_recurrent_gated_delta_rule_packed_decode``: one token per
    sequence, q, k, v packed in ``mixed_qkv [B, 2*H*K + HV*V]``, the sigmoid gating,
    states in place at ``ssm_state_indices [B]``; ``out [B, 1, HV, V]`` (a row whose
    index is ``<= 0`` is zero, as the kernel stores it)."""
    batch = mixed_qkv.shape[0]
    value_heads, value_dim, key_dim = initial_state.shape[-3:]
    heads = (mixed_qkv.shape[1] - value_heads * value_dim) // (2 * key_dim)
    if ssm_state_indices.dim() != 1 or tuple(out.shape) != (batch, 1, value_heads, value_dim) \
            or 2 * heads * key_dim + value_heads * value_dim != mixed_qkv.shape[1]:
        raise CapturelintError(f"fused_recurrent_gated_delta_rule_packed_decode: mixed_qkv {tuple(mixed_qkv.shape)}, "
                               f"out {tuple(out.shape)} and indices {tuple(ssm_state_indices.shape)} do not fit states "
                               f"{tuple(initial_state.shape)}")
    hk = heads * key_dim
    q = mixed_qkv[:, :hk].reshape(1, batch, heads, key_dim)
    k = mixed_qkv[:, hk:2 * hk].reshape(1, batch, heads, key_dim)
    v = mixed_qkv[:, 2 * hk:].reshape(1, batch, value_heads, value_dim)
    gate, strength = gating(A_log, a, dt_bias, b)
    bounds = torch.arange(batch + 1, device=mixed_qkv.device, dtype=torch.int64)
    own_op(RECURRENT, IMPLS)(q, k, v, gate[None], strength[None], out.view(1, batch, value_heads, value_dim),
                             initial_state, bounds, ssm_state_indices, float(scale), bool(use_qk_l2norm_in_kernel))
    return out, initial_state


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                           scale: float | None = None, initial_state: torch.Tensor | None = None,
                           output_final_state: bool = False, cu_seqlens: torch.Tensor | None = None,
                           chunk_indices: torch.Tensor | None = None, chunk_offsets: torch.Tensor | None = None,
                           use_qk_l2norm_in_kernel: bool = False,
                           core_attn_out: torch.Tensor | None = None) -> tuple[torch.Tensor, Any]:
    """``chunk.chunk_gated_delta_rule`` over the reference op (``chunk_indices`` and
    ``chunk_offsets`` are derived from ``cu_seqlens``; the recurrence needs neither)."""
    bounds = _varlen(q, cu_seqlens)
    shape = v.shape
    if cu_seqlens is None:
        q, k, v, g, beta = map(_flat, (q, k, v, g, beta))
    num_seqs = bounds.shape[0] - 1
    if initial_state is None:
        initial_state = torch.zeros(num_seqs, v.shape[2], v.shape[3], k.shape[3], dtype=torch.float32,
                                    device=q.device)
    elif initial_state.shape[0] != num_seqs:
        raise CapturelintError(f"chunk_gated_delta_rule: {initial_state.shape[0]} initial states for {num_seqs} "
                               "sequences")
    scale = k.shape[-1] ** -0.5 if scale is None else float(scale)
    o = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    final = torch.empty(initial_state.shape, dtype=torch.float32, device=q.device)
    own_op(CHUNK, IMPLS)(q, k, v, g, beta, initial_state, bounds, o, final, scale, bool(use_qk_l2norm_in_kernel))
    o = o.reshape(shape)
    if core_attn_out is not None:
        core_attn_out.reshape(-1)[: o.numel()].copy_(o.reshape(-1))
    return o, final if output_final_state else None


IMPLS: Impls = {
    f"{OWN_NAMESPACE}::{POST_CONV_PREP}": (
        "(Tensor conv_output, Tensor a, Tensor b, Tensor A_log, Tensor dt_bias, Tensor(a!) q, Tensor(b!) k, "
        "Tensor(c!) v, Tensor(d!) g, Tensor(e!) beta, bool apply_l2norm, bool output_g_exp) -> ()",
        reference_post_conv_prep, no_result_fake,
    ),
    f"{OWN_NAMESPACE}::{RECURRENT}": (
        "(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor(a!) o, Tensor(b!) state, Tensor cu_seqlens, "
        "Tensor indices, float scale, bool use_qk_l2norm_in_kernel) -> ()",
        reference_recurrent, no_result_fake,
    ),
    f"{OWN_NAMESPACE}::{CHUNK}": (
        "(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, Tensor initial_state, Tensor cu_seqlens, "
        "Tensor(a!) o, Tensor(b!) final_state, float scale, bool use_qk_l2norm_in_kernel) -> ()",
        reference_chunk, no_result_fake,
    ),
}


__all__ = ["CHUNK", "IMPLS", "POST_CONV_PREP", "RECURRENT", "chunk_gated_delta_rule", "fused_post_conv_prep",
           "fused_recurrent_gated_delta_rule", "fused_recurrent_gated_delta_rule_packed_decode",
           "fused_sigmoid_gating_delta_rule_update", "gating", "l2norm", "l2norm_fwd", "reference_chunk",
           "reference_post_conv_prep", "reference_recurrent"]
