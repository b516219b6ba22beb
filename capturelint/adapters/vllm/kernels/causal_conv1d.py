"""CPU references for vLLM's two causal depthwise convolution kernels
(``model_executor/layers/mamba/ops/causal_conv1d.py``), which Mamba2 mixers
(``mamba_mixer2.py``) and gated delta-net layers (``layers/mamba/gdn``) call:

``reference_causal_conv1d_fn`` / ``causal_conv1d_fn``
    vLLM's ``causal_conv1d_fn``, the prefill path (in the mixer's eager break): ``x
    [dim, T]`` holds the sequences ``query_start_loc [B+1]`` concatenated; token ``p``
    of sequence ``b`` computes ``sum_j weight[:, j] * e[p + j] (+ bias)`` (then SiLU when
    ``activation`` is ``"silu"``/``"swish"``/``True``) over ``e = init_b ++ x_b``, where
    ``init_b`` is ``conv_states[cache_indices[b], :, :W-1]`` when
    ``has_initial_state[b]`` and zeros otherwise (``W`` = the kernel width). It then
    writes the last ``W-1`` columns of ``e`` to that cache line
    (``conv_states[cache_indices[b], :, :W-1]``; columns past ``W-1`` untouched).
    A sequence whose cache index is ``null_block_id`` (vLLM's padding), negative, or
    whose length is 0 is skipped: nothing written, and its output columns, which the
    kernel leaves as ``torch.empty`` made them, are zeros here; so are the columns past
    ``query_start_loc[-1]``. Returns a new tensor like ``x`` (in ``x``'s dtype).
``reference_causal_conv1d_update`` / ``causal_conv1d_update``
    vLLM's ``causal_conv1d_update``, the decode path (captured in FULL decode graphs):
    ``x`` is ``[B, dim]`` (one token each), ``[B, dim, S]``, or ``[T, dim]`` with
    ``query_start_loc`` (varlen, ``S = max_query_len``). Sequence ``b`` of length
    ``L_b`` reads its window ``w_b = conv_state[i_b, :, o_b : o_b + W-1]`` (``i_b`` =
    ``conv_state_indices[b]``; ``o_b = num_accepted_tokens[b] - 1`` under speculative
    decoding, else 0), computes its ``L_b`` outputs as above over ``e = w_b ++ x_b``,
    and writes the first ``n_b`` columns of its cache line with the kernel's shift:
    ``n_b = W-1`` (speculative: ``W-2+S``) less ``S - L_b`` in varlen; column ``i`` is
    ``conv_state[i_b, :, o_b + i + s]`` (``s`` = 1 speculative, else ``L_b``) while
    ``i + L_b < n_b``, else ``x_b[i - (n_b - L_b)]`` (zero outside ``x_b``). Without
    speculation and with full-length sequences this is "the last ``W-1`` columns of
    ``conv_state[..., :W-1] ++ x_b``"; with it, the window slides by one per call and
    holds the drafts. Outputs go to ``out`` (``x`` itself when not given, as vLLM's);
    a sequence whose index is ``null_block_id`` or negative, or of length 0, writes
    nothing.

Why references and not Triton's interpreter (``kernels.interpreter``): the update runs
inside FULL decode graphs, and the interpreter reads its arguments into numpy, so a
capture would record copies of capture-time values. Both references are tensor ops with
no host read (each token's sequence by ``searchsorted``, the windows by gathers, skipped
sequences by ``where``), so they are capture-safe. They multiply and sum in float32
(the kernel accumulates in float32 but multiplies in the state's dtype) and cast once.
Cache lines are written by gathering the line, replacing its columns and putting it
back (``index_put_``): a skipped sequence puts back what it read (vLLM's padding points
at the null block 0, which no request owns). The conv state may be any strided view
(vLLM passes ``[..., dim, W-1]`` as a transpose of a token-major cache).

``tests/vllm/test_causal_conv1d.py`` runs vLLM's own Triton kernels in Triton's
interpreter (fp32) against both references: prefills with and without initial states,
sequences shorter than the window, a null-block line, plain and varlen decode,
speculative decode. Limits: the widths vLLM's kernels compute, 2 to 4 for
``causal_conv1d_fn`` and 2 to 6 for ``causal_conv1d_update`` (a call with another is a
one-line error).
"""

from __future__ import annotations

from typing import Any

import torch

from capturelint.adapters.vllm.kernels.library import OWN_NAMESPACE, Impls, no_result_fake, own_op
from capturelint.errors import CapturelintError

CONV1D_FN = "causal_conv1d_fn"
CONV1D_UPDATE = "causal_conv1d_update"


def _silu(activation: Any) -> bool:
    if activation is None or activation is False:
        return False
    if activation is True or activation in ("silu", "swish"):
        return True
    raise CapturelintError(f"vLLM's causal_conv1d takes activation None, True, 'silu' or 'swish', not {activation!r}")


def _first_column(indices: torch.Tensor) -> torch.Tensor:
    """A sequence's cache line: the kernels read ``indices[b]`` by its first stride, so
    of a ``[B, blocks]`` table (vLLM's state indices) the first column."""
    return (indices[:, 0] if indices.dim() > 1 else indices).to(torch.int64)


def _skipped(indices: torch.Tensor, null_block_id: int | None) -> torch.Tensor:
    """The sequences the kernels do not process: a null-block (or negative) cache index."""
    skip = indices < 0
    if null_block_id is not None:
        skip = skip | (indices == null_block_id)
    return skip


def _convolve(e: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool) -> torch.Tensor:
    """``e [..., dim, W-1+n]`` -> ``[..., dim, n]``: the causal depthwise convolution."""
    width = weight.shape[1]
    windows = e.unfold(-1, width, 1)  # [..., dim, n, W]
    acc = (windows * weight.float()[:, None, :]).sum(-1)
    if bias is not None:
        acc = acc + bias.float()[:, None]
    return acc * torch.sigmoid(acc) if silu else acc


def _put_lines(state: torch.Tensor, lines: torch.Tensor, old: torch.Tensor, write: torch.Tensor,
               columns: torch.Tensor, keep: torch.Tensor) -> None:
    """Put cache lines back: line ``b`` gets ``columns[b]`` where ``write[b, col]``
    (``[B, cols]``), its old values elsewhere; a skipped line (``keep[b]``) all old."""
    width = columns.shape[-1]
    new = old.clone()
    new[..., :width] = torch.where(write[:, None, :] & ~keep[:, None, None], columns.to(state.dtype),
                                   old[..., :width])
    state.index_put_((lines,), new)


def reference_causal_conv1d_fn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                               conv_states: torch.Tensor, query_start_loc: torch.Tensor,
                               cache_indices: torch.Tensor | None, has_initial_state: torch.Tensor | None,
                               silu: bool, null_block_id: int | None) -> torch.Tensor:
    """The prefill convolution of ``x [dim, T]``; writes each sequence's last ``W-1``
    columns to its conv state line; see the module docstring."""
    dim, tokens = x.shape
    width = weight.shape[1]
    state_len = width - 1
    batch = query_start_loc.shape[0] - 1
    device = x.device
    starts = query_start_loc[:-1].to(torch.int64)
    lengths = query_start_loc[1:].to(torch.int64) - starts
    indices = _first_column(cache_indices) if cache_indices is not None else torch.arange(batch, device=device)
    skip = _skipped(indices, null_block_id) | (lengths <= 0)
    lines = indices.clamp(0, conv_states.shape[0] - 1)
    old = conv_states[lines]  # [B, dim, S]
    has = (has_initial_state.to(torch.bool) if has_initial_state is not None
           else torch.zeros(batch, dtype=torch.bool, device=device))
    init = torch.where(has[:, None, None], old[..., :state_len].float(), torch.zeros((), device=device))
    xf = x.float()

    def column(b: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """Column ``q`` of ``e_b = init_b ++ x_b`` (``q`` in ``x_b``'s frame: < 0 reads
        ``init_b``): ``[dim, n]`` for ``b``, ``q`` of shape ``[n]``."""
        own = xf[:, (starts[b] + q).clamp(0, max(tokens - 1, 0))]
        prior = init[b, :, (state_len + q).clamp(0, state_len - 1)].transpose(0, 1)
        return torch.where((q >= 0)[None, :], own, prior)

    # Each token: its sequence, its position in it, then the W columns ending at it.
    rows = torch.arange(tokens, device=device)
    seq = torch.searchsorted(query_start_loc[1:].to(torch.int64), rows, right=True)
    live = seq < batch
    seq = seq.clamp(max=max(batch - 1, 0))
    position = rows - starts[seq]
    taps = torch.stack([column(seq, position + j - state_len) for j in range(width)], dim=-1)  # [dim, T, W]
    acc = (taps * weight.float()[:, None, :]).sum(-1)
    if bias is not None:
        acc = acc + bias.float()[:, None]
    if silu:
        acc = acc * torch.sigmoid(acc)
    written = live & ~skip[seq]
    out = torch.where(written[None, :], acc, torch.zeros((), device=device)).to(x.dtype)

    # The new state: the last W-1 columns of e_b.
    b_all = torch.arange(batch, device=device).repeat_interleave(state_len)
    q = (lengths[:, None] - state_len + torch.arange(state_len, device=device)[None, :]).reshape(-1)
    columns = column(b_all, q).reshape(dim, batch, state_len).permute(1, 0, 2)  # [B, dim, W-1]
    _put_lines(conv_states, lines, old, torch.ones(batch, state_len, dtype=torch.bool, device=device), columns, skip)
    return out


def reference_causal_conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                                   bias: torch.Tensor | None, silu: bool, conv_state_indices: torch.Tensor | None,
                                   num_accepted_tokens: torch.Tensor | None, query_start_loc: torch.Tensor | None,
                                   max_query_len: int, null_block_id: int | None, out: torch.Tensor) -> None:
    """The decode convolution of ``x`` (``[B, dim, S]``, or ``[T, dim]`` with
    ``query_start_loc``) into ``out`` (same shape), sliding each sequence's conv state
    line; see the module docstring."""
    width = weight.shape[1]
    device = x.device
    varlen = query_start_loc is not None
    if varlen:
        assert conv_state_indices is not None
        batch, steps = conv_state_indices.shape[0], max_query_len
        starts = query_start_loc[:-1].to(torch.int64)
        lengths = query_start_loc[1:].to(torch.int64) - starts
        k = torch.arange(steps, device=device)
        token = (starts[:, None] + k[None, :]).clamp(0, max(x.shape[0] - 1, 0))
        xb = x.float()[token].permute(0, 2, 1)  # [B, dim, S]
    else:
        batch, _, steps = x.shape
        lengths = torch.full((batch,), steps, dtype=torch.int64, device=device)
        xb = x.to(torch.float32, copy=True)  # out is x itself unless given: read before it is written
    indices = (_first_column(conv_state_indices) if conv_state_indices is not None
               else torch.arange(batch, device=device))
    skip = _skipped(indices, null_block_id) | (lengths <= 0)
    lines = indices.clamp(0, conv_state.shape[0] - 1)
    old = conv_state[lines]  # [B, dim, S_state]
    columns_held = old.shape[-1]
    spec = num_accepted_tokens is not None
    offset = (num_accepted_tokens.to(torch.int64) - 1 if spec
              else torch.zeros(batch, dtype=torch.int64, device=device))

    def state_columns(pos: torch.Tensor) -> torch.Tensor:
        """``old[b, :, pos[b, i]]`` -> ``[B, dim, n]``."""
        index = pos.clamp(0, columns_held - 1)[:, None, :].expand(-1, old.shape[1], -1)
        return old.float().gather(-1, index)

    window = state_columns(offset[:, None] + torch.arange(width - 1, device=device)[None, :])
    result = _convolve(torch.cat([window, xb], dim=-1), weight, bias, silu)  # [B, dim, S]
    k = torch.arange(steps, device=device)
    written = (k[None, :] < lengths[:, None]) & ~skip[:, None]  # [B, S]

    if varlen:
        rows = torch.arange(out.shape[0], device=device)
        seq = torch.searchsorted(query_start_loc[1:].to(torch.int64), rows, right=True)
        live = seq < batch
        seq = seq.clamp(max=max(batch - 1, 0))
        step = (rows - starts[seq]).clamp(0, steps - 1)
        keep = live & written[seq, step]
        out.copy_(torch.where(keep[:, None], result[seq, :, step].to(out.dtype), out))
    else:
        out.copy_(torch.where(written[:, None, :], result.to(out.dtype), out))

    # The state's shift (the kernel's own arithmetic, per sequence).
    held = (width - 1 + steps - 1) if spec else width - 1
    count = min(held, columns_held)
    n = held - (steps - lengths) if varlen else torch.full((batch,), held, dtype=torch.int64, device=device)
    i = torch.arange(count, device=device)[None, :]
    from_state = (i + lengths[:, None]) < n[:, None]
    shift = 1 if spec else lengths[:, None]
    prior = state_columns(offset[:, None] + i + shift)
    q = i - (n - lengths)[:, None]
    fresh = xb.gather(-1, q.clamp(0, steps - 1)[:, None, :].expand(-1, xb.shape[1], -1))
    fresh = torch.where(((q >= 0) & (q < lengths[:, None]))[:, None, :], fresh, torch.zeros((), device=device))
    columns = torch.where(from_state[:, None, :], prior, fresh)
    _put_lines(conv_state, lines, old, i < n[:, None], columns, skip)


def causal_conv1d_fn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv_states: torch.Tensor,
                     query_start_loc: torch.Tensor, cache_indices: torch.Tensor | None = None,
                     has_initial_state: torch.Tensor | None = None, activation: Any = "silu",
                     pad_slot_id: int = -1, null_block_id: int | None = 0, metadata: Any = None,
                     validate_data: bool = False) -> torch.Tensor:
    """vLLM's ``causal_conv1d_fn`` signature over the reference op (``metadata``, the
    kernel's launch bookkeeping, does not change the result)."""
    width = weight.shape[1]
    if not 2 <= width <= 4 or x.dim() != 2 or conv_states is None:
        raise CapturelintError(f"vLLM's causal_conv1d_fn was called with a width-{width} kernel over a "
                               f"{x.dim()}-D input{' and no conv_states' if conv_states is None else ''}, which "
                               "capturelint's reference (kernels/causal_conv1d.py) does not implement")
    silu = _silu(activation)
    original = x.dtype
    x = x.to(conv_states.dtype)
    out = own_op(CONV1D_FN, IMPLS)(x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state,
                                   silu, null_block_id)
    return out.to(original)


def causal_conv1d_update(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None = None, activation: Any = None,
                         conv_state_indices: torch.Tensor | None = None,
                         num_accepted_tokens: torch.Tensor | None = None,
                         query_start_loc: torch.Tensor | None = None, max_query_len: int = -1,
                         null_block_id: int | None = 0, validate_data: bool = False,
                         out: torch.Tensor | None = None) -> torch.Tensor:
    """vLLM's ``causal_conv1d_update`` signature over the reference op: ``x`` converted
    to the state's dtype, written in place unless ``out`` is given."""
    width = weight.shape[1]
    if not 2 <= width <= 6:
        raise CapturelintError(f"vLLM's causal_conv1d_update was called with a width-{width} kernel, which "
                               "capturelint's reference (kernels/causal_conv1d.py) does not implement")
    if query_start_loc is not None and (conv_state_indices is None or max_query_len < 1):
        raise CapturelintError("vLLM's causal_conv1d_update was called varlen (query_start_loc) without "
                               "conv_state_indices and max_query_len")
    silu = _silu(activation)
    original = x.dtype
    x = x.to(conv_state.dtype)
    if out is None:
        out = x
    elif out.shape != x.shape:
        raise ValueError(f"`out` shape {tuple(out.shape)} must match `x` shape {tuple(x.shape)}.")
    unsqueeze = query_start_loc is None and x.dim() == 2
    xs, outs = (x.unsqueeze(-1), out.unsqueeze(-1)) if unsqueeze else (x, out)
    own_op(CONV1D_UPDATE, IMPLS)(xs, conv_state, weight, bias, silu, conv_state_indices, num_accepted_tokens,
                                 query_start_loc, int(max_query_len), null_block_id, outs)
    return out.to(original)


def _fn_fake(x: torch.Tensor, *args: Any) -> torch.Tensor:
    return torch.empty_like(x)


IMPLS: Impls = {
    f"{OWN_NAMESPACE}::{CONV1D_FN}": (
        "(Tensor x, Tensor weight, Tensor? bias, Tensor(a!) conv_states, Tensor query_start_loc, "
        "Tensor? cache_indices, Tensor? has_initial_state, bool silu, int? null_block_id) -> Tensor",
        reference_causal_conv1d_fn, _fn_fake,
    ),
    f"{OWN_NAMESPACE}::{CONV1D_UPDATE}": (
        "(Tensor x, Tensor(a!) conv_state, Tensor weight, Tensor? bias, bool silu, Tensor? conv_state_indices, "
        "Tensor? num_accepted_tokens, Tensor? query_start_loc, int max_query_len, int? null_block_id, "
        "Tensor(b!) out) -> ()",
        reference_causal_conv1d_update, no_result_fake,
    ),
}


__all__ = ["CONV1D_FN", "CONV1D_UPDATE", "IMPLS", "causal_conv1d_fn", "causal_conv1d_update",
           "reference_causal_conv1d_fn", "reference_causal_conv1d_update"]
