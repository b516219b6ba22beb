"""CPU references for the two kernels vLLM's MLA attention runs on its Triton MLA backend
(``v1/attention/backends/mla/triton_mla.py``) that a CPU cannot run as they are:

``reference_decode_attention`` / ``decode_attention_fwd``
    vLLM's ``decode_attention_fwd`` (``v1/attention/ops/triton_decode_attention.py``, two
    Triton kernels: per split of the keys, then the merge of the splits), called by
    ``TritonMLAImpl.forward_mqa`` inside the eager break ``unified_mla_attention_with_output``
    (``model_executor/layers/attention/mla_attention.py:1484``), and captured whole in FULL
    graphs of uniform decode batches. Query row ``b`` (``q [B, H, Lk]``; MLA: the latent
    query ``W_UK``-absorbed nope part then the rope part) attends to the positions ``j <
    b_seq_len[b]`` of its request's pages: key ``k_buffer[req_to_token[b, j // page_size],
    j % page_size, h // (H // Hkv)]`` (all ``Lk`` dims), value the same row of ``v_buffer``
    (MLA: its first ``Lv = kv_lora_rank`` dims, the latent itself), scores ``q . k *
    sm_scale`` (``logit_cap > 0``: ``logit_cap * tanh(s / logit_cap)``), softmax over the
    row's keys. Writes ``o [B, H, Lv]`` and ``lse [B, H]`` (natural log of the softmax's
    sum, as the merge kernel stores ``e_max + log(e_sum)``). A row with ``b_seq_len[b] ==
    0`` (a padded decode row) has no key: the kernel's merge divides 0 by 0, so ``o`` is
    NaN and ``lse`` is ``-inf`` there, and so they are here (vLLM drops those rows). The
    split count (``num_kv_splits``) and the scratch ``attn_logits`` are the kernel's
    launch choice: they do not change the result, and the reference does not write the
    scratch. Registered as ``torch.ops.capturelint_vllm.mla_decode_attention``.
``reference_concat_and_cache_mla``
    vLLM's ``_C_cache_ops.concat_and_cache_mla`` (CUDA, ``csrc/cache_kernels.cu``; called
    by ``AttentionImpl.do_kv_cache_update``, ``v1/attention/backend.py:1108``, from
    ``unified_mla_kv_cache_update``, **in captured code**): token ``t`` with
    ``slot_mapping[t] >= 0`` writes ``kv_c[t]`` (``[T, kv_lora_rank]``) then ``k_pe[t]``
    (``[T, rope_dim]``) into ``kv_cache[slot // block_size, slot % block_size]`` (``[blocks,
    block_size, kv_lora_rank + rope_dim]``); ``slot < 0`` (padding, a dummy run) writes
    nothing. vLLM's ``ops.concat_and_cache_mla`` calls the ``_C_cache_ops`` op by name;
    ``register_cache_op`` defines it there from this reference where ``vllm._C`` is absent.

Why references and not Triton's interpreter (``kernels.interpreter``) for the decode: it
runs inside captured code in FULL graphs, and the interpreter reads its arguments into
numpy, which a capture would record as copies of capture-time values. Both are written in
tensor ops with no host read (the keys by gathering the block table's slots, masked), so
they are capture-safe; the decode computes in float32 (the kernel's accumulator) and casts
once to ``o``'s dtype. ``tests/vllm/test_family_mla.py`` runs vLLM's ``decode_attention_fwd``
in Triton's interpreter against the decode reference (fp32: the interpreter computes bf16
tiles wrongly) and the cache write against its documented semantics (the CUDA op is not
in this wheel).

Limits: an unquantised cache (``kv_cache_dtype`` ``auto``/bf16/fp16/fp32: an fp8 cache's
scales are refused in one line).
"""

from __future__ import annotations

from typing import Any

import torch

from capturelint.adapters.vllm.kernels.library import OWN_NAMESPACE, Impls, no_result_fake, own_op, register_ops
from capturelint.errors import CapturelintError

DECODE_ATTENTION = "mla_decode_attention"
CACHE_OP = "_C_cache_ops::concat_and_cache_mla"
_PLAIN = (torch.bfloat16, torch.float16, torch.float32)


def reference_decode_attention(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, o: torch.Tensor,
                               lse: torch.Tensor, req_to_token: torch.Tensor, b_seq_len: torch.Tensor,
                               sm_scale: float, page_size: int, logit_cap: float) -> None:
    """Paged decode attention of ``q [B, H, Lk]`` over ``k_buffer [..., Hkv, Lk]`` /
    ``v_buffer [..., Hkv, Lv]`` (pages of ``page_size`` rows) into ``o [B, H, Lv]`` and
    ``lse [B, H]``; see the module docstring."""
    batch, heads, lk = q.shape
    kv_heads, lv = v_buffer.shape[-2], v_buffer.shape[-1]
    if heads % kv_heads or k_buffer.shape[-1] != lk:
        raise ValueError(f"q {tuple(q.shape)} does not fit k_buffer {tuple(k_buffer.shape)} / v_buffer "
                         f"{tuple(v_buffer.shape)}")
    keys_all = k_buffer.reshape(-1, kv_heads, lk)
    values_all = v_buffer.reshape(-1, kv_heads, lv)
    pages = req_to_token.shape[1]
    span = pages * page_size
    j = torch.arange(span, device=q.device)
    table = req_to_token.to(torch.int64)
    rows = table[:, j // page_size] * page_size + j % page_size  # [B, span]
    rows = rows.clamp(0, keys_all.shape[0] - 1)
    keys = keys_all[rows].float()  # [B, span, Hkv, Lk]
    values = values_all[rows].float()  # [B, span, Hkv, Lv]
    group = heads // kv_heads
    qf = q.float().view(batch, kv_heads, group, lk)
    scores = torch.einsum("bhgd,blhd->bhgl", qf, keys) * sm_scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    live = j[None, :] < b_seq_len.to(torch.int64)[:, None]  # [B, span]
    scores = scores.masked_fill(~live[:, None, None, :], float("-inf"))
    total = torch.logsumexp(scores, dim=-1)  # -inf for a row with no key
    probs = torch.exp(scores - total[..., None])  # NaN there, as the kernel's 0 / 0
    result = torch.einsum("bhgl,blhd->bhgd", probs, values).reshape(batch, heads, lv)
    o.copy_(result.to(o.dtype))
    lse.copy_(total.reshape(batch, heads).to(lse.dtype))


def decode_attention_fwd(q: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor, o: torch.Tensor,
                         lse: torch.Tensor, req_to_token: torch.Tensor, b_seq_len: torch.Tensor,
                         attn_logits: torch.Tensor, num_kv_splits: int, sm_scale: float, page_size: int = 1,
                         logit_cap: float = 0.0, k_scale: Any = None, v_scale: Any = None,
                         is_mla: bool = False) -> None:
    """vLLM's ``decode_attention_fwd`` signature over the reference op; an fp8 cache (its
    scales) is refused in one line."""
    if k_buffer.dtype not in _PLAIN or v_buffer.dtype not in _PLAIN:
        raise CapturelintError(f"vLLM's decode_attention_fwd was called with a {k_buffer.dtype} cache, which "
                               "capturelint's reference (kernels/mla_decode.py) does not implement: check with "
                               "kv_cache_dtype auto")
    if num_kv_splits != attn_logits.shape[2]:
        raise ValueError(f"num_kv_splits {num_kv_splits} does not match attn_logits {tuple(attn_logits.shape)}")
    own_op(DECODE_ATTENTION, IMPLS)(q, k_buffer, v_buffer, o, lse, req_to_token, b_seq_len, float(sm_scale),
                                    int(page_size), float(logit_cap or 0.0))


def reference_concat_and_cache_mla(kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                                   slot_mapping: torch.Tensor, kv_cache_dtype: str, scale: torch.Tensor,
                                   skip_scale: bool = False) -> None:
    """Write ``[kv_c | k_pe]`` rows to the paged latent cache at ``slot_mapping`` (slot <
    0 skipped); see the module docstring."""
    if kv_cache_dtype not in ("auto", "bfloat16", "float16", "float32") or kv_cache.dtype not in _PLAIN:
        raise CapturelintError(f"vLLM's concat_and_cache_mla was called with kv_cache_dtype={kv_cache_dtype}, which "
                               "capturelint's reference (kernels/mla_decode.py) does not implement: check with "
                               "kv_cache_dtype auto")
    if kv_cache.dim() != 3 or kv_c.shape[-1] + k_pe.shape[-1] != kv_cache.shape[-1]:
        raise ValueError(f"kv_c {tuple(kv_c.shape)} and k_pe {tuple(k_pe.shape)} do not fill the rows of kv_cache "
                         f"{tuple(kv_cache.shape)} ([blocks, block_size, kv_lora_rank + rope_dim])")
    n = slot_mapping.shape[0]
    block_size = kv_cache.shape[1]
    # slot < 0 writes the value already in slot 0 back to it (no host read of the mask, so
    # a capture records the same ops for any slots); vLLM's block 0 is the null block.
    valid = slot_mapping >= 0
    slots = torch.where(valid, slot_mapping, torch.zeros_like(slot_mapping)).to(torch.int64)
    block = torch.div(slots, block_size, rounding_mode="floor")
    offset = slots - block * block_size
    rows = torch.cat([kv_c[:n], k_pe[:n].reshape(n, -1)], dim=-1).to(kv_cache.dtype)
    keep = kv_cache[block, offset]
    kv_cache.index_put_((block, offset), torch.where(valid[:, None], rows, keep))


def register_cache_op() -> tuple[str, ...]:
    """``torch.ops._C_cache_ops.concat_and_cache_mla`` from the reference where vLLM's
    compiled op is absent (idempotent)."""
    return register_ops(CACHE_IMPLS)


IMPLS: Impls = {
    f"{OWN_NAMESPACE}::{DECODE_ATTENTION}": (
        "(Tensor q, Tensor k_buffer, Tensor v_buffer, Tensor(a!) o, Tensor(b!) lse, Tensor req_to_token, "
        "Tensor b_seq_len, float sm_scale, int page_size, float logit_cap) -> ()",
        reference_decode_attention, no_result_fake,
    ),
}

CACHE_IMPLS: Impls = {
    CACHE_OP: (
        "(Tensor kv_c, Tensor k_pe, Tensor(a!) kv_cache, Tensor slot_mapping, str kv_cache_dtype, Tensor scale, "
        "bool skip_scale=False) -> ()",
        reference_concat_and_cache_mla, no_result_fake,
    ),
}


__all__ = ["CACHE_IMPLS", "CACHE_OP", "DECODE_ATTENTION", "IMPLS", "decode_attention_fwd",
           "reference_concat_and_cache_mla", "reference_decode_attention", "register_cache_op"]
