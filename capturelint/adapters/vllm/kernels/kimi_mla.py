"""CPU references for the two fused MLA epilogues of Kimi's own MLA layer
(``vllm/models/kimi_k3/nvidia/mla.py``, ``MultiHeadLatentAttention._attention``, in its
eager break), CUDA ops of ``vllm._C`` behind the wrappers of
``vllm/models/kimi_k3/nvidia/ops/fused_mla_key_concat_kv_cache.py`` (bf16 cache):

``reference_key_concat_insert`` (``_C.fused_kimi_k3_mla_key_concat_kv_cache_insert``)
    The prefill epilogue: ``k_out[t, h] = [k_nope[t, h] | k_pe[t]]`` (the one rope key
    broadcast to every head) and the latent row ``[kv_c_normed[t] | k_pe[t]]`` written to
    ``kv_cache[slot // block_size, slot % block_size]`` for ``slot = slot_mapping[t] >=
    0`` (slot < 0, padding, writes nothing).
``reference_decode_q_concat_insert`` (``_C.fused_kimi_k3_mla_decode_q_concat_kv_cache_insert``)
    The decode epilogue: ``mqa_q[b, h] = [ql_nope[b, h] | q_pe[b, h]]`` and the same
    latent cache write.

Both are registered under vLLM's op names (``torch.ops._C.<name>``) where ``vllm._C`` is
absent, so vLLM's wrappers run as they are. They are written from the wrappers'
documented semantics (the CUDA source is not shipped in the wheel), in tensor ops with
no host read (capture-safe: the decode epilogue is captured in FULL graphs).

Limits: the NoPE path only (Kimi-Linear's MLA is NoPE, ``mla_use_nope``): a call with
``positions``/``cos_sin_cache`` (RoPE inside the epilogue) is refused in one line; the
fp8 and ``fp8_ds_mla`` epilogues are other ops, not registered (vLLM then reports the
missing op).
"""

from __future__ import annotations

import torch

from capturelint.adapters.vllm.kernels.library import Impls, no_result_fake, register_ops
from capturelint.errors import CapturelintError

KEY_CONCAT = "_C::fused_kimi_k3_mla_key_concat_kv_cache_insert"
DECODE_CONCAT = "_C::fused_kimi_k3_mla_decode_q_concat_kv_cache_insert"


def _nope_only(positions: torch.Tensor | None, cos_sin_cache: torch.Tensor | None, name: str) -> None:
    if positions is not None or cos_sin_cache is not None:
        raise CapturelintError(f"vLLM called {name} with RoPE inside the epilogue, which capturelint's reference "
                               "(kernels/kimi_mla.py) does not implement: Kimi-Linear's MLA is NoPE")


def _insert_latent(kv_c_normed: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                   slot_mapping: torch.Tensor, block_size: int) -> None:
    """``[kv_c_normed | k_pe]`` rows to the paged cache at ``slot_mapping`` (slot < 0
    skipped: those rows write slot 0's own value back, no host read of the mask)."""
    n = slot_mapping.shape[0]
    if kv_cache.dim() != 3 or kv_c_normed.shape[-1] + k_pe.shape[-1] != kv_cache.shape[-1]:
        raise ValueError(f"kv_c_normed {tuple(kv_c_normed.shape)} and k_pe {tuple(k_pe.shape)} do not fill the rows "
                         f"of kv_cache {tuple(kv_cache.shape)} ([blocks, block_size, kv_lora_rank + rope_dim])")
    valid = slot_mapping >= 0
    slots = torch.where(valid, slot_mapping, torch.zeros_like(slot_mapping)).to(torch.int64)
    block = torch.div(slots, block_size, rounding_mode="floor")
    offset = slots - block * block_size
    rows = torch.cat([kv_c_normed[:n], k_pe[:n]], dim=-1).to(kv_cache.dtype)
    keep = kv_cache[block, offset]
    kv_cache.index_put_((block, offset), torch.where(valid[:, None], rows, keep))


def reference_key_concat_insert(q: torch.Tensor, k_nope: torch.Tensor, k_pe: torch.Tensor, kv_c_normed: torch.Tensor,
                                k_out: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                                block_size: int, positions: torch.Tensor | None,
                                cos_sin_cache: torch.Tensor | None) -> None:
    """The prefill epilogue (module docstring): ``k_out`` and the latent cache written."""
    _nope_only(positions, cos_sin_cache, "fused_kimi_k3_mla_key_concat_kv_cache_insert")
    tokens, heads, _ = k_nope.shape
    rope = k_pe.reshape(tokens, -1)
    k_out.copy_(torch.cat([k_nope, rope[:, None, :].expand(tokens, heads, rope.shape[-1])], dim=-1))
    _insert_latent(kv_c_normed, rope, kv_cache, slot_mapping, block_size)


def reference_decode_q_concat_insert(ql_nope: torch.Tensor, q_pe: torch.Tensor, kv_c_normed: torch.Tensor,
                                     k_pe: torch.Tensor, mqa_q: torch.Tensor, kv_cache: torch.Tensor,
                                     slot_mapping: torch.Tensor, block_size: int, positions: torch.Tensor | None,
                                     cos_sin_cache: torch.Tensor | None) -> None:
    """The decode epilogue (module docstring): ``mqa_q`` and the latent cache written."""
    _nope_only(positions, cos_sin_cache, "fused_kimi_k3_mla_decode_q_concat_kv_cache_insert")
    mqa_q.copy_(torch.cat([ql_nope, q_pe], dim=-1))
    _insert_latent(kv_c_normed, k_pe.reshape(k_pe.shape[0], -1), kv_cache, slot_mapping, block_size)


IMPLS: Impls = {
    KEY_CONCAT: (
        "(Tensor(a!) q, Tensor k_nope, Tensor k_pe, Tensor kv_c_normed, Tensor(b!) k_out, Tensor(c!) kv_cache, "
        "Tensor slot_mapping, int block_size, Tensor? positions, Tensor? cos_sin_cache) -> ()",
        reference_key_concat_insert, no_result_fake,
    ),
    DECODE_CONCAT: (
        "(Tensor ql_nope, Tensor q_pe, Tensor kv_c_normed, Tensor k_pe, Tensor(a!) mqa_q, Tensor(b!) kv_cache, "
        "Tensor slot_mapping, int block_size, Tensor? positions, Tensor? cos_sin_cache) -> ()",
        reference_decode_q_concat_insert, no_result_fake,
    ),
}


def register() -> tuple[str, ...]:
    """The two ops under vLLM's names where ``vllm._C`` lacks them (idempotent)."""
    return register_ops(IMPLS)


__all__ = ["DECODE_CONCAT", "IMPLS", "KEY_CONCAT", "reference_decode_q_concat_insert", "reference_key_concat_insert",
           "register"]
