"""CPU references for the two Mamba2 state-space kernels vLLM's ``MambaMixer2``
(``model_executor/layers/mamba/mamba_mixer2.py``) calls inside its eager break
``mamba_mixer2`` (:1229):

``reference_selective_state_update`` / ``selective_state_update``
    vLLM's ``selective_state_update`` (``ops/ssu_dispatch.py`` -> the Triton kernel of
    ``ops/mamba_ssm.py``), the decode step, **captured whole in FULL decode graphs**:
    for row ``b`` with state line ``s = state_batch_indices[b]``, per head ``h`` and
    head dimension ``m``: ``dt' = softplus(dt + dt_bias)`` (softplus when asked;
    ``log1p(exp(v))`` up to 20, ``v`` above), ``state[s] = state[s] * exp(A * dt') +
    dt' * B[g] * x`` (``g`` the head's group, ``h // (H / G)``), ``out = sum(state[s] *
    C[g]) + D * x`` (times ``silu(z)`` when ``z`` is given), in float32; the state is
    stored in its own dtype to ``dst_state_batch_indices[b]``. A row whose line is the
    null block starts from a zero state (the kernel's masked load) and writes no state.
``reference_chunk_scan`` / ``mamba_chunk_scan_combined_varlen``
    vLLM's ``mamba_chunk_scan_combined_varlen`` (``ops/ssd_combined.py``: the SSD
    chunked scan, ``ssd_chunk_state``/``ssd_state_passing``/``ssd_bmm``/
    ``ssd_chunk_scan``), the prefill, in the eager break only: its chunks are a way of
    computing, in parallel, the same recurrence token by token (the SSD duality), so the
    reference runs that recurrence over each sequence of ``cu_seqlens`` from
    ``initial_states`` (zeros when None), with ``dt`` clamped to ``dt_limit``, writes
    ``out`` and the final states (into ``final_states_out[final_state_indices]``, or
    returned). ``return_intermediate_states`` (prefix-caching checkpoints) is refused.

Why references: the decode update is captured in FULL graphs (Triton's interpreter
reads its arguments into numpy, which a capture would record as copies), and the scan,
though it runs in the eager break, is four autotuned Triton kernels; both are tensor ops
here with no host read (the scan loops over the token count, a shape). On a CPU
platform vLLM binds these names to its CPU versions (``ops/cpu/mamba_ssm.py``), which
call ``vllm._C``, which the CUDA wheel does not ship. ``tests/vllm/test_family_mamba2.py``
runs vLLM's ``selective_state_update`` Triton kernel in Triton's interpreter against the
update reference, and checks the scan reference against the update reference stepped
token by token (the recurrence the SSD kernels compute by chunks).

Limits: no speculative decoding (``num_accepted_tokens``), no stochastic rounding, no
ReplaySSM ring (the mixer's other decode kernels); each is a one-line error.
"""

from __future__ import annotations

from typing import Any

import torch

from capturelint.adapters.vllm.kernels.library import OWN_NAMESPACE, Impls, no_result_fake, own_op
from capturelint.errors import CapturelintError

STATE_UPDATE = "selective_state_update"
CHUNK_SCAN = "mamba_chunk_scan"


def _softplus(v: torch.Tensor) -> torch.Tensor:
    return torch.where(v <= 20.0, torch.log1p(torch.exp(v)), v)


def _first_column(indices: torch.Tensor) -> torch.Tensor:
    """A row's state line: the kernel reads ``indices[b]`` by its first stride, so of a
    ``[B, blocks]`` table the first column."""
    return (indices[:, 0] if indices.dim() > 1 else indices).to(torch.int64)


def _heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """``[..., G, N]`` -> ``[..., H, N]``: each head its group's row."""
    return t.repeat_interleave(heads // t.shape[-2], dim=-2)


def reference_selective_state_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                                     B: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None,
                                     dt_bias: torch.Tensor | None, z: torch.Tensor | None, dt_softplus: bool,
                                     state_batch_indices: torch.Tensor | None,
                                     dst_state_batch_indices: torch.Tensor | None, null_block_id: int,
                                     out: torch.Tensor) -> None:
    """One decode step of ``x [B, H, M]`` over the state lines ``state [N, H, M, S]``
    into ``out``; see the module docstring."""
    rows, heads, _ = x.shape
    device = x.device
    src = _first_column(state_batch_indices) if state_batch_indices is not None else torch.arange(rows, device=device)
    dst = _first_column(dst_state_batch_indices) if dst_state_batch_indices is not None else src
    live = src != null_block_id if state_batch_indices is not None else torch.ones(rows, dtype=torch.bool,
                                                                                  device=device)
    lines = src.clamp(0, state.shape[0] - 1)
    old = state[lines].float()
    s = torch.where(live[:, None, None, None], old, torch.zeros((), device=device))
    step = dt.float() + (dt_bias.float() if dt_bias is not None else 0.0)
    if dt_softplus:
        step = _softplus(step)
    xf = x.float()
    b, c = _heads(B.float(), heads), _heads(C.float(), heads)  # [B, H, S]
    s = s * torch.exp(A.float() * step[..., None]) + (step * xf)[..., None] * b[:, :, None, :]
    y = (s * c[:, :, None, :]).sum(-1)
    if D is not None:
        y = y + xf * D.float()
    if z is not None:
        y = y * (z.float() * torch.sigmoid(z.float()))
    out.copy_(y.to(out.dtype))
    targets = dst.clamp(0, state.shape[0] - 1)
    keep = state[targets]
    state.index_put_((targets,), torch.where(live[:, None, None, None], s.to(state.dtype), keep))


def reference_chunk_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                         cu_seqlens: torch.Tensor, out: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None,
                         dt_bias: torch.Tensor | None, initial_states: torch.Tensor | None, dt_softplus: bool,
                         dt_min: float, dt_max: float) -> torch.Tensor:
    """The prefill scan of ``x [T, H, M]`` (sequences ``cu_seqlens``) into ``out``;
    returns each sequence's final state ``[batch, H, M, S]`` (float32)."""
    tokens, heads, dim = x.shape
    batch = cu_seqlens.shape[0] - 1
    dstate = B.shape[-1]
    device = x.device
    step = dt.float() + (dt_bias.float()[None, :] if dt_bias is not None else 0.0)  # [T, H]
    if dt_softplus:
        step = _softplus(step)
    step = step.clamp(min=dt_min, max=dt_max)
    b, c = _heads(B.float(), heads), _heads(C.float(), heads)  # [T, H, S]
    rows = torch.arange(tokens, device=device)
    ends = cu_seqlens[1:].to(torch.int64)
    seq = torch.searchsorted(ends, rows, right=True).clamp(max=max(batch - 1, 0))
    first = rows == cu_seqlens[:-1].to(torch.int64)[seq]
    init = (initial_states.float() if initial_states is not None
            else torch.zeros(batch, heads, dim, dstate, device=device))
    finals = init.clone()
    s = torch.zeros(heads, dim, dstate, device=device)
    xf = x.float()
    decay = torch.exp(A.float()[None, :] * step)  # [T, H]
    ys = []
    for t in range(tokens):
        s = torch.where(first[t], init[seq[t]], s)
        s = s * decay[t][:, None, None] + (step[t][:, None] * xf[t])[..., None] * b[t][:, None, :]
        ys.append((s * c[t][:, None, :]).sum(-1))
        finals = torch.where((rows[t] + 1 == ends[seq[t]]) & (torch.arange(batch, device=device) == seq[t])
                             [:, None, None, None], s[None], finals)
    y = torch.stack(ys) if ys else torch.zeros(0, heads, dim, device=device)
    if D is not None:
        d = D.float()
        y = y + xf * (d[None, :, None] if d.dim() == 1 else d[None])
    if z is not None:
        y = y * (z.float() * torch.sigmoid(z.float()))
    out[:tokens].copy_(y.to(out.dtype))
    return finals


def selective_state_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                           B: torch.Tensor, C: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor,
                           z: torch.Tensor | None = None, dt_softplus: bool = False,
                           state_batch_indices: torch.Tensor | None = None,
                           dst_state_batch_indices: torch.Tensor | None = None, null_block_id: int = 0,
                           out: torch.Tensor | None = None, num_accepted_tokens: torch.Tensor | None = None,
                           cu_seqlens: torch.Tensor | None = None, is_blackwell: bool = False,
                           **kwargs: Any) -> None:
    """vLLM's ``selective_state_update`` signature (``ssu_dispatch``) over the reference op."""
    if num_accepted_tokens is not None or kwargs.get("enable_stochastic_rounding"):
        raise CapturelintError("vLLM's selective_state_update was called for speculative decoding or with "
                               "stochastic rounding, which capturelint's reference (kernels/mamba_ssm.py) does "
                               "not implement")
    if cu_seqlens is not None and cu_seqlens.shape[0] - 1 != x.shape[0]:
        raise CapturelintError("vLLM's selective_state_update was called with several tokens a sequence, which "
                               "capturelint's reference (kernels/mamba_ssm.py) does not implement")
    if out is None or x.dim() != 3 or state.dim() != 4:
        raise CapturelintError("vLLM's selective_state_update was called without heads or an output, which "
                               "capturelint's reference (kernels/mamba_ssm.py) does not implement")
    own_op(STATE_UPDATE, IMPLS)(state, x, dt, A, B, C, D, dt_bias, z, bool(dt_softplus), state_batch_indices,
                                dst_state_batch_indices, int(null_block_id), out)


def mamba_chunk_scan_combined_varlen(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                                     C: torch.Tensor, chunk_size: int, cu_seqlens: torch.Tensor,
                                     cu_chunk_seqlens: Any, last_chunk_indices: Any, seq_idx: Any,
                                     out: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                                     dt_bias: torch.Tensor | None = None,
                                     initial_states: torch.Tensor | None = None, dt_softplus: bool = False,
                                     dt_limit: tuple[float, float] = (0.0, float("inf")),
                                     return_intermediate_states: bool = False, state_dtype: Any = None,
                                     final_states_out: torch.Tensor | None = None,
                                     final_state_indices: torch.Tensor | None = None) -> torch.Tensor | None:
    """vLLM's ``mamba_chunk_scan_combined_varlen`` signature over the reference op (the
    chunking arguments, how the kernels split the work, do not change the result)."""
    if return_intermediate_states:
        raise CapturelintError("vLLM's mamba_chunk_scan_combined_varlen was asked for intermediate states "
                               "(prefix-caching checkpoints), which capturelint's reference (kernels/mamba_ssm.py) "
                               "does not implement")
    finals = own_op(CHUNK_SCAN, IMPLS)(x, dt, A, B, C, cu_seqlens, out, D, z, dt_bias, initial_states,
                                       bool(dt_softplus), float(dt_limit[0]), float(dt_limit[1]))
    finals = finals.to(state_dtype if state_dtype is not None else C.dtype)
    if final_states_out is not None:
        final_states_out[final_state_indices] = finals.to(final_states_out.dtype)
        return None
    return finals


def _scan_fake(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
               cu_seqlens: torch.Tensor, *args: Any) -> torch.Tensor:
    return x.new_empty(cu_seqlens.shape[0] - 1, x.shape[1], x.shape[2], B.shape[-1], dtype=torch.float32)


IMPLS: Impls = {
    f"{OWN_NAMESPACE}::{STATE_UPDATE}": (
        "(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, Tensor? D, Tensor? dt_bias, "
        "Tensor? z, bool dt_softplus, Tensor? state_batch_indices, Tensor? dst_state_batch_indices, "
        "int null_block_id, Tensor(b!) out) -> ()",
        reference_selective_state_update, no_result_fake,
    ),
    f"{OWN_NAMESPACE}::{CHUNK_SCAN}": (
        "(Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, Tensor cu_seqlens, Tensor(a!) out, Tensor? D, "
        "Tensor? z, Tensor? dt_bias, Tensor? initial_states, bool dt_softplus, float dt_min, float dt_max) -> Tensor",
        reference_chunk_scan, _scan_fake,
    ),
}


__all__ = ["CHUNK_SCAN", "IMPLS", "STATE_UPDATE", "mamba_chunk_scan_combined_varlen", "reference_chunk_scan",
           "reference_selective_state_update", "selective_state_update"]
