"""CPU references for the Kimi delta attention (KDA) kernels vLLM's Kimi-Linear layer
calls (``model_executor/layers/mamba/gdn/kimi_gdn_linear_attn.py``,
``KimiGatedDeltaNetAttention._forward``, its eager break), from FLA's KDA as vLLM ships
it (``vllm/models/kimi_k3/nvidia/ops/third_party/kda``):

``reference_kda_gate``
    The gate both kernels fuse: per key channel of head ``h``, ``x = raw_g + dt_bias``
    and, with ``a = exp(A_log[h])``, the log-decay ``lower_bound * sigmoid(a * x)`` when
    a lower bound is set, else ``-a * softplus(x)`` (softplus linear above 20). fp32.
``reference_chunk_kda`` / ``chunk_kda_with_fused_gate``
    The prefill kernel (``chunk.py``): for each sequence of ``cu_seqlens`` from its
    initial state ``S [H, V, K]`` (fp32), token by token: q, k L2-normalised
    (``x / sqrt(sum(x^2) + 1e-6)``, rounded to the input dtype as ``l2norm_fwd``
    writes them), ``q *= scale``; ``S *= exp(g)`` per key channel; ``u = beta * (v -
    S k)`` with ``beta = sigmoid(raw_beta)``; ``S += u k^T``; ``o = S q``. Returns ``o``
    (v's dtype) and the final states ``[N, H, V, K]`` fp32. The chunked algorithm
    computes this recurrence exactly (up to rounding): the reference runs it token by
    token. Registered as ``torch.ops.capturelint_vllm.chunk_kda``.
``reference_packed_decode`` / ``fused_recurrent_kda_packed_decode``
    The decode kernel (``fused_recurrent.py``): one token per sequence, q/k/v packed
    in ``mixed_qkv [B, 2HK + HV]``, the same step (normalisation in fp32, not rounded)
    on the state ``state[state_indices[b]]``, updated in place; a token whose state
    index is ``<= 0`` (padding: vLLM's null block) writes zeros and leaves every state
    alone. Registered as ``torch.ops.capturelint_vllm.kda_packed_decode``.
``reference_gather_initial_states`` / ``gather_initial_states``
    vLLM's ``model_executor/layers/mamba/ops/gather_initial_states.py``: row ``i`` is
    ``state[indices[i]]`` where ``has_initial_state[i]``, else zeros. Registered as
    ``torch.ops.capturelint_vllm.gather_initial_states``.

Why references and not Triton's interpreter (``kernels.interpreter``): the kernels run
in the eager break, which FULL graphs capture whole, and the interpreter reads its
arguments into numpy (a capture would record capture-time copies). The references
use tensor ops with no host read (each token's sequence by ``searchsorted``, padding
masked), so they are capture-safe. ``tests/vllm/test_family_kimi.py`` checks them
against vLLM's own kernels run in Triton's interpreter (fp32): the decode kernel, the
recurrent kernel ``fused_recurrent_kda`` (the same recurrence over varlen sequences,
which the prefill reference must equal) and the gate's chunk cumsum; the chunked
prefill kernel itself does not run in the interpreter (its inner ``range`` loop
index is a Python int there: ``chunk_delta_h.py`` calls ``i_t.to``).

Limits: no speculative decoding (``fused_recurrent_kda`` with accepted-token counts,
refused in one line), ``use_full_rank_gate`` (Kimi K3's private KDA) not covered; the
reference's fp32 recurrence may differ from the chunked kernel's bf16 intra-chunk
tiles by bf16 rounding.
"""

from __future__ import annotations

from typing import Any

import torch

from capturelint.adapters.vllm.kernels.library import OWN_NAMESPACE, Impls, no_result_fake, own_op
from capturelint.errors import CapturelintError

CHUNK_KDA = "chunk_kda"
PACKED_DECODE = "kda_packed_decode"
GATHER_INITIAL = "gather_initial_states"
SOFTPLUS_THRESHOLD = 20.0
NORM_EPS = 1e-6


def reference_kda_gate(raw_g: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor | None,
                       lower_bound: float | None) -> torch.Tensor:
    """The log-decay ``[..., H, K]`` (fp32) of ``raw_g [..., H, K]``; see the module docstring."""
    heads, dim = raw_g.shape[-2:]
    x = raw_g.float()
    if dt_bias is not None:
        x = x + dt_bias.float().reshape(heads, dim)
    a = A_log.float().reshape(heads, 1).exp()
    if lower_bound is not None:
        return lower_bound * torch.sigmoid(a * x)
    softplus = torch.where(x > SOFTPLUS_THRESHOLD, x, torch.log(1.0 + torch.exp(x.clamp(max=SOFTPLUS_THRESHOLD))))
    return -a * softplus


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + NORM_EPS)


def _step(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
          beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One delta-rule step for a batch of states ``[B, H, V, K]``: q, k ``[B, H, K]``,
    v ``[B, H, V]``, g ``[B, H, K]``, beta ``[B, H]``, all fp32 (q already scaled)."""
    state = state * g.exp()[:, :, None, :]
    u = (v - (state * k[:, :, None, :]).sum(-1)) * beta[:, :, None]
    state = state + u[:, :, :, None] * k[:, :, None, :]
    return state, (state * q[:, :, None, :]).sum(-1)


def reference_chunk_kda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, raw_g: torch.Tensor,
                        raw_beta: torch.Tensor, A_log: torch.Tensor, g_bias: torch.Tensor | None,
                        lower_bound: float | None, initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor,
                        scale: float, l2norm: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """KDA over the varlen sequences of ``q, k [1, T, H, K]``, ``v [1, T, H, V]``; returns
    ``o [1, T, H, V]`` (v's dtype; rows past ``cu_seqlens[-1]`` zero) and the final states
    ``[N, H, V, K]`` fp32; see the module docstring."""
    _, tokens, heads, dim = q.shape
    dim_v = v.shape[-1]
    seqs = cu_seqlens.numel() - 1
    if l2norm:  # l2norm_fwd writes the normalised rows in the input's dtype
        q, k = _l2norm(q).to(q.dtype), _l2norm(k).to(k.dtype)
    qf, kf, vf = q[0].float() * scale, k[0].float(), v[0].float()
    g = reference_kda_gate(raw_g[0], A_log, g_bias, lower_bound)
    beta = torch.sigmoid(raw_beta[0].float())
    if initial_state is None:
        state = torch.zeros(seqs, heads, dim_v, dim, dtype=torch.float32, device=q.device)
    else:
        state = initial_state.float().clone()
    ends = cu_seqlens[1:].to(torch.int64)
    rows = torch.arange(tokens, device=q.device)
    seq_of = torch.searchsorted(ends, rows, right=True)  # each token's sequence (seqs: past the last)
    live = seq_of < seqs
    seq_of = seq_of.clamp(max=max(seqs - 1, 0))
    out = torch.zeros(tokens, heads, dim_v, dtype=torch.float32, device=q.device)
    for t in range(tokens):
        n = seq_of[t:t + 1]
        stepped, o = _step(state.index_select(0, n), qf[t:t + 1], kf[t:t + 1], vf[t:t + 1], g[t:t + 1],
                           beta[t:t + 1])
        keep = live[t:t + 1]
        state = state.index_copy(0, n, torch.where(keep[:, None, None, None], stepped, state.index_select(0, n)))
        out[t] = torch.where(keep[:, None, None], o, torch.zeros_like(o))[0]
    return out.to(v.dtype)[None], state


def _chunk_kda_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, raw_g: torch.Tensor, raw_beta: torch.Tensor,
                    A_log: torch.Tensor, g_bias: torch.Tensor | None, lower_bound: float | None,
                    initial_state: torch.Tensor | None, cu_seqlens: torch.Tensor, scale: float,
                    l2norm: bool) -> tuple[torch.Tensor, torch.Tensor]:
    seqs = cu_seqlens.shape[0] - 1
    return (torch.empty_like(v),
            q.new_empty((seqs, q.shape[2], v.shape[-1], q.shape[-1]), dtype=torch.float32))


def reference_packed_decode(mixed_qkv: torch.Tensor, raw_g: torch.Tensor, raw_beta: torch.Tensor,
                            A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float | None,
                            state: torch.Tensor, state_indices: torch.Tensor, scale: float,
                            out: torch.Tensor) -> None:
    """One KDA decode step per row of ``mixed_qkv``, ``state [cache, H, V, K]`` updated in
    place, ``out [1, B, H, V]`` written; see the module docstring."""
    _, heads, dim_v, dim = state.shape
    batch = mixed_qkv.shape[0]
    q, k, v = mixed_qkv.float().split([heads * dim, heads * dim, heads * dim_v], dim=-1)
    q = _l2norm(q.reshape(batch, heads, dim)) * scale
    k = _l2norm(k.reshape(batch, heads, dim))
    v = v.reshape(batch, heads, dim_v)
    g = reference_kda_gate(raw_g[0], A_log, dt_bias, lower_bound)
    beta = torch.sigmoid(raw_beta[0].float())
    live = state_indices[:batch] > 0
    slots = torch.where(live, state_indices[:batch], torch.zeros_like(state_indices[:batch])).to(torch.int64)
    before = state.index_select(0, slots)
    stepped, o = _step(before.float(), q, k, v, g, beta)
    # padding rows (slot 0) write state 0's own value back: no host read of the mask
    state.index_copy_(0, slots, torch.where(live[:, None, None, None], stepped.to(state.dtype), before))
    out[0, :batch].copy_(torch.where(live[:, None, None], o, torch.zeros_like(o)).to(out.dtype))


def reference_gather_initial_states(state: torch.Tensor, indices: torch.Tensor,
                                    has_initial_state: torch.Tensor) -> torch.Tensor:
    """``state[indices[i]]`` where ``has_initial_state[i]``, else zeros."""
    slots = torch.where(has_initial_state, indices.to(torch.int64), torch.zeros_like(indices, dtype=torch.int64))
    rows = state.index_select(0, slots)
    shape = (-1,) + (1,) * (state.dim() - 1)
    return torch.where(has_initial_state.reshape(shape), rows, torch.zeros_like(rows))


def _gather_fake(state: torch.Tensor, indices: torch.Tensor, has_initial_state: torch.Tensor) -> torch.Tensor:
    return state.new_empty((indices.shape[0], *state.shape[1:]))


def chunk_kda_with_fused_gate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, raw_g: torch.Tensor,
                              raw_beta: torch.Tensor, A_log: torch.Tensor, g_bias: torch.Tensor | None,
                              scale: float | None = None, initial_state: torch.Tensor | None = None,
                              output_final_state: bool = False, lower_bound: float | None = None,
                              use_qk_l2norm_in_kernel: bool = False, cu_seqlens: torch.Tensor | None = None,
                              out: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """vLLM's ``chunk_kda_with_fused_gate`` signature over the reference op."""
    if q.shape[0] != 1 and cu_seqlens is not None:
        raise CapturelintError(f"chunk_kda_with_fused_gate was called with a batch of {q.shape[0]} and cu_seqlens; "
                               "the kernel and capturelint's reference (kernels/kda.py) take a batch of 1")
    if cu_seqlens is None:
        cu_seqlens = torch.tensor([0, q.shape[1]], dtype=torch.int32, device=q.device)
    o, final = own_op(CHUNK_KDA, IMPLS)(q, k, v, raw_g, raw_beta, A_log, g_bias, lower_bound, initial_state,
                                         cu_seqlens, float(scale if scale is not None else k.shape[-1] ** -0.5),
                                         bool(use_qk_l2norm_in_kernel))
    if out is not None:
        out.copy_(o)
        o = out
    return o, (final if output_final_state else None)


def fused_recurrent_kda_packed_decode(mixed_qkv: torch.Tensor, raw_g: torch.Tensor, raw_beta: torch.Tensor,
                                      A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float | None,
                                      initial_state: torch.Tensor, state_indices: torch.Tensor,
                                      scale: float | None = None,
                                      out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's ``fused_recurrent_kda_packed_decode`` signature over the reference op."""
    _, heads, dim_v, dim = initial_state.shape
    if out is None:
        out = mixed_qkv.new_empty((1, mixed_qkv.shape[0], heads, dim_v))
    own_op(PACKED_DECODE, IMPLS)(mixed_qkv, raw_g, raw_beta, A_log, dt_bias, lower_bound, initial_state,
                                 state_indices, float(scale if scale is not None else dim ** -0.5), out)
    return out, initial_state


def fused_recurrent_kda(*args: Any, **kwargs: Any) -> Any:
    """vLLM's multi-token recurrent KDA, which its layer calls for speculative decoding
    only: not covered (one line)."""
    raise CapturelintError("vLLM's Kimi-Linear layer called fused_recurrent_kda (speculative decoding), which "
                           "capturelint's KDA references (kernels/kda.py) do not cover; check without a draft")


def gather_initial_states(state: torch.Tensor, indices: torch.Tensor, has_initial_state: torch.Tensor) -> torch.Tensor:
    """vLLM's ``gather_initial_states`` signature over the reference op."""
    return own_op(GATHER_INITIAL, IMPLS)(state, indices, has_initial_state)


IMPLS: Impls = {
    f"{OWN_NAMESPACE}::{CHUNK_KDA}": (
        "(Tensor q, Tensor k, Tensor v, Tensor raw_g, Tensor raw_beta, Tensor A_log, Tensor? g_bias, "
        "float? lower_bound, Tensor? initial_state, Tensor cu_seqlens, float scale, bool l2norm) -> (Tensor, Tensor)",
        reference_chunk_kda, _chunk_kda_fake,
    ),
    f"{OWN_NAMESPACE}::{PACKED_DECODE}": (
        "(Tensor mixed_qkv, Tensor raw_g, Tensor raw_beta, Tensor A_log, Tensor dt_bias, float? lower_bound, "
        "Tensor(a!) state, Tensor state_indices, float scale, Tensor(b!) out) -> ()",
        reference_packed_decode, no_result_fake,
    ),
    f"{OWN_NAMESPACE}::{GATHER_INITIAL}": (
        "(Tensor state, Tensor indices, Tensor has_initial_state) -> Tensor",
        reference_gather_initial_states, _gather_fake,
    ),
}


__all__ = ["CHUNK_KDA", "GATHER_INITIAL", "IMPLS", "PACKED_DECODE", "chunk_kda_with_fused_gate",
           "fused_recurrent_kda", "fused_recurrent_kda_packed_decode", "gather_initial_states",
           "reference_chunk_kda", "reference_gather_initial_states", "reference_kda_gate",
           "reference_packed_decode"]
