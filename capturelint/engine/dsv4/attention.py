"""DeepSeek V4 attention: MLA-like projections, compressor, lightning indexer, sparse
attention, and the eager regions that decide what a PIECEWISE graph captures.

**Shape of the attention** (one layer, ``T`` tokens): a low-rank q projection with a norm
(``wq_a`` -> ``q_norm`` -> ``wq_b``, ``H`` heads of ``D``), one shared KV head (``wkv``
-> ``kv_norm``; the last ``rope_dim`` dims carry RoPE), a per-head q RMSNorm fused with
RoPE and the KV-cache insert, a sparse attention over the sliding window plus compressed
rows with a per-head sink, inverse RoPE on the output, and a low-rank output projection
(``wo_a`` -> ``wo_b``). Ratio-1 layers attend to the window only; ratio-4 layers add the
compressed rows a lightning indexer selects (top-k); larger ratios add every complete
compressed row.

**The forward and its eager regions**, exactly as vLLM's DeepSeek V4 attention::

    forward:                  projections (always captured)
                              self._prepare_and_attn_fn(qr, kv, positions, o)
                              o_proj(inverse_rope(o)) (always captured)
    _prepare_and_attn:        reads the forward context's attn_metadata; q projection,
                              fused q-norm/RoPE/KV insert, indexer q path, indexer
                              compressor, MLA compressor, then
                              self._sparse_indexer_and_attn(...)
    _sparse_indexer_and_attn: @eager_break_during_capture; indexer top-k into the shared
                              topk_indices_buffer, sparse attention into o in place
    _prepare_and_attn_eager:  @eager_break_during_capture around _prepare_and_attn (the
                              nested break then runs inline)

``eager_region="narrow"`` binds ``_prepare_and_attn_fn`` to ``_prepare_and_attn``: the
preparation is captured, only the indexer and attention re-run live. ``"wide"`` binds it
to ``_prepare_and_attn_eager``: the whole preparation re-runs live on every replay.

**Profile-run branches** sit where vLLM has them. When ``attn_metadata`` is not a dict
(profile and dummy runs, and V1's PIECEWISE capture), the KV insert only pads q to the
kernel's head count (no norm, no RoPE, no cache write), the compressors return at once,
and the indexer fakes its result (``-1``: no compressed row selected). A narrow region
captured in that state replays those branches forever: the engine's headline hazard.

**Invariants the code keeps.** No host values derived from per-step data: every branch
is on configuration or on whether metadata exists; every per-step quantity is a tensor.
The attention output ``o`` is allocated by the caller, inside the captured region, and
written in place by the break, so a replayed graph reads what the break wrote.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from capturelint.engine.config import EagerRegion, EngineConfig, Kernels
from capturelint.runtime.breakable import eager_break_during_capture
from capturelint.engine.dsv4 import ops
from capturelint.runtime.forward_context import get_forward_context
from capturelint.engine.kv_cache import INDEXER_RATIO, LayerKVCache
from capturelint.engine.metadata import CacheKind, metadata_key
from capturelint.errors import CapturelintError


class RMSNorm(nn.Module):
    """RMSNorm over the last dim with a learned weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)


def attention_kernels(kernels: Kernels, device: torch.device | str) -> tuple[Callable, Callable]:
    """``(kv_insert, sparse_attention)`` custom ops for the chosen implementation.

    Triton is imported only when chosen. On a CPU its kernels need the interpreter,
    which Triton picks from ``TRITON_INTERPRET`` at the first launch: set it unless the
    user already decided.
    """
    if kernels is Kernels.TRITON:
        if torch.device(device).type == "cpu":
            os.environ.setdefault("TRITON_INTERPRET", "1")
        try:
            import capturelint.engine.dsv4.triton_kernels  # noqa: F401  (registers the ops)
        except ImportError as e:
            raise _triton_missing(e) from None
        return torch.ops.dsv4.fused_qnorm_rope_kv_insert_triton, torch.ops.dsv4.sparse_attention_triton
    return torch.ops.dsv4.fused_qnorm_rope_kv_insert, torch.ops.dsv4.sparse_attention


def _is_profile_run(attn_metadata: Any) -> bool:
    """vLLM's test: no metadata dict means a profile or dummy run."""
    return not isinstance(attn_metadata, dict)


class Compressor(nn.Module):
    """Pools every ``ratio`` tokens' states into one compressed cache row.

    Every token saves partial kv/score states (``save_partial_states``); a token that
    completes a group of ``ratio`` positions pools the group (gated softmax per channel),
    normalises, applies RoPE and stores one row (``compress_norm_rope_store``).
    ``metadata_key`` names the forward-context entry it reads, ``<layer>.compressor`` for
    the MLA compressor, ``<layer>.indexer`` for the indexer's.
    """

    def __init__(self, in_dim: int, out_dim: int, ratio: int, config: EngineConfig, metadata_key: str):
        super().__init__()
        self.wkv = nn.Linear(in_dim, out_dim, bias=False)
        self.wgate = nn.Linear(in_dim, out_dim, bias=False)
        self.norm = RMSNorm(out_dim, config.rms_eps)
        self.ratio = ratio
        self.block_size = config.block_size
        self.rope_dim = config.rope_dim
        self.eps = config.rms_eps
        self.metadata_key = metadata_key
        self.state_cache: torch.Tensor | None = None
        self.out_cache: torch.Tensor | None = None

    def bind_caches(self, state_cache: torch.Tensor, out_cache: torch.Tensor) -> None:
        self.state_cache, self.out_cache = state_cache, out_cache

    def forward(self, x: torch.Tensor, positions: torch.Tensor, attn_metadata: Any) -> None:
        if _is_profile_run(attn_metadata):
            return  # profile run: vLLM's compressors return before touching any cache
        md = attn_metadata[self.metadata_key]
        torch.ops.dsv4.save_partial_states(self.wkv(x), self.wgate(x), md.slot_mapping, self.state_cache)
        torch.ops.dsv4.compress_norm_rope_store(
            positions,
            md.slot_mapping,
            md.req_idx,
            md.block_table,
            self.state_cache,
            self.norm.weight,
            self.out_cache,
            self.ratio,
            self.block_size,
            self.rope_dim,
            self.eps,
        )


class Indexer(nn.Module):
    """The lightning indexer: its own RoPE'd queries scored against its own compressed
    K cache; the top-k compressed row ids go into the model's shared
    ``topk_indices_buffer``."""

    def __init__(self, config: EngineConfig, layer_prefix: str, ratio: int):
        super().__init__()
        self.num_heads = config.index_num_heads
        self.head_dim = config.index_head_dim
        self.rope_dim = config.rope_dim
        self.ratio = ratio
        self.block_size = config.block_size
        self.wq_b = nn.Linear(config.q_lora_rank, self.num_heads * self.head_dim, bias=False)
        self.weights_proj = nn.Linear(config.q_lora_rank, self.num_heads, bias=False)
        self.compressor = Compressor(
            config.head_dim,
            self.head_dim,
            ratio,
            config,
            metadata_key(layer_prefix, CacheKind.INDEXER),
        )
        self.metadata_key = metadata_key(layer_prefix, CacheKind.INDEXER)
        self.k_cache: torch.Tensor | None = None

    def query(self, qr: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The indexer q path: ``[T, Hi, Di]`` RoPE'd queries and ``[T, Hi]`` head weights."""
        q = self.wq_b(qr).view(qr.shape[0], self.num_heads, self.head_dim)
        q = ops.rope(q, positions, self.rope_dim)
        weights = self.weights_proj(qr) * self.num_heads**-0.5
        return q, weights

    def select(
        self,
        index_q: torch.Tensor,
        weights: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: Any,
        topk_buffer: torch.Tensor,
    ) -> torch.Tensor:
        """Top-k compressed row ids ``[T, K]`` (``-1``: none), in ``topk_buffer[:T]``."""
        out = topk_buffer[: index_q.shape[0]]
        if _is_profile_run(attn_metadata):
            out.fill_(-1)  # profile run: vLLM fakes the indexer result, no row selected
            return out
        md = attn_metadata[self.metadata_key]
        torch.ops.dsv4.sparse_attn_indexer(
            index_q, weights, self.k_cache, positions, md.req_idx, md.block_table, topk_buffer, self.ratio, self.block_size
        )
        return out


class DeepseekV4Attention(nn.Module):
    """One layer's attention. ``layer_prefix`` (``"layers.3"``) keys its metadata."""

    def __init__(
        self,
        config: EngineConfig,
        layer_prefix: str,
        ratio: int,
        eager_region: EagerRegion,
        topk_indices_buffer: torch.Tensor,
        kernels: tuple[Callable, Callable],
    ):
        super().__init__()
        self.prefix = layer_prefix
        self.ratio = ratio
        self.num_heads = config.num_heads
        self.padded_heads = config.padded_heads
        self.head_dim = config.head_dim
        self.rope_dim = config.rope_dim
        self.window = config.window
        self.block_size = config.block_size
        self.eps = config.rms_eps
        self.scale = self.head_dim**-0.5
        self.swa_key = metadata_key(layer_prefix, CacheKind.SWA)

        self.wq_a = nn.Linear(config.hidden_size, config.q_lora_rank, bias=False)
        self.q_norm = RMSNorm(config.q_lora_rank, config.rms_eps)
        self.wq_b = nn.Linear(config.q_lora_rank, self.num_heads * self.head_dim, bias=False)
        self.q_head_norm = RMSNorm(self.head_dim, config.rms_eps)
        self.wkv = nn.Linear(config.hidden_size, self.head_dim, bias=False)
        self.kv_norm = RMSNorm(self.head_dim, config.rms_eps)
        self.attn_sink = nn.Parameter(torch.zeros(self.num_heads))
        self.wo_a = nn.Linear(self.num_heads * self.head_dim, config.o_lora_rank, bias=False)
        self.wo_b = nn.Linear(config.o_lora_rank, config.hidden_size, bias=False)

        self.compressor: Compressor | None = None
        self.indexer: Indexer | None = None
        if ratio > 1:
            self.compressor = Compressor(
                self.head_dim, self.head_dim, ratio, config, metadata_key(layer_prefix, CacheKind.COMPRESSOR)
            )
        if ratio == INDEXER_RATIO:
            self.indexer = Indexer(config, layer_prefix, ratio)
        elif ratio > 1:
            # Large ratio: attend to every complete compressed row. The row ids are fixed
            # by configuration; which are complete is a per-token tensor comparison.
            num_rows = config.blocks_per_request * config.block_size // ratio
            self.register_buffer("compressed_row_ids", torch.arange(num_rows), persistent=False)

        # Shared across layers (one buffer in the model, as vLLM's topk_indices_buffer);
        # a plain attribute so it is named once, at the model.
        self.topk_indices_buffer = topk_indices_buffer
        self.kv_cache: LayerKVCache | None = None
        self._kv_insert_op, self._attention_op = kernels

        self.eager_region = eager_region
        if eager_region is EagerRegion.NARROW:
            self._prepare_and_attn_fn = self._prepare_and_attn
        else:
            self._prepare_and_attn_fn = self._prepare_and_attn_eager

    def bind_kv_cache(self, cache: LayerKVCache) -> None:
        """Point the layer (and its compressors) at its caches."""
        self.kv_cache = cache
        if self.compressor is not None:
            self.compressor.bind_caches(cache.compressor_state, cache.compressed)
        if self.indexer is not None:
            self.indexer.compressor.bind_caches(cache.indexer_state, cache.indexer_k)
            self.indexer.k_cache = cache.indexer_k

    # ---------------------------------------------------------------- forward

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        # The caller-provided output buffer: allocated here, inside the captured region,
        # so graph memory holds it across replays; the attention break writes it in place.
        o = hidden.new_empty(num_tokens, self.num_heads, self.head_dim)
        qr = self.q_norm(self.wq_a(hidden))
        kv = self.kv_norm(self.wkv(hidden))
        self._prepare_and_attn_fn(qr, kv, positions, o)
        o = ops.rope(o, positions, self.rope_dim, inverse=True)
        return self.wo_b(self.wo_a(o.flatten(1)))

    def _prepare_and_attn(
        self, qr: torch.Tensor, kv: torch.Tensor, positions: torch.Tensor, o: torch.Tensor
    ) -> None:
        """Input preparation and attention: captured under the narrow region."""
        attn_metadata = get_forward_context().attn_metadata
        q = self.wq_b(qr).view(qr.shape[0], self.num_heads, self.head_dim)
        q_out = self._fused_qnorm_rope_kv_insert(q, kv, positions, attn_metadata)
        index_q = index_weights = None
        if self.indexer is not None:
            index_q, index_weights = self.indexer.query(qr, positions)
            self.indexer.compressor(kv, positions, attn_metadata)
        if self.compressor is not None:
            self.compressor(kv, positions, attn_metadata)
        self._sparse_indexer_and_attn(q_out, positions, o, index_q, index_weights)

    @eager_break_during_capture
    def _prepare_and_attn_eager(
        self, qr: torch.Tensor, kv: torch.Tensor, positions: torch.Tensor, o: torch.Tensor
    ) -> None:
        """The wide region: all of the preparation re-runs live on every replay."""
        return self._prepare_and_attn(qr, kv, positions, o)

    def _fused_qnorm_rope_kv_insert(
        self, q: torch.Tensor, kv: torch.Tensor, positions: torch.Tensor, attn_metadata: Any
    ) -> torch.Tensor:
        """``q_out [T, Hp, D]``: normalised, RoPE'd q; writes RoPE'd kv to the SWA cache."""
        if _is_profile_run(attn_metadata):
            # Profile run: vLLM only pads q to the kernel's head count here. No per-head
            # norm, no RoPE, and no KV-cache write.
            return F.pad(q, (0, 0, 0, self.padded_heads - self.num_heads))
        md = attn_metadata[self.swa_key]
        q_out = q.new_empty(q.shape[0], self.padded_heads, self.head_dim)
        self._kv_insert_op(
            q, kv, positions, md.slot_mapping, self.q_head_norm.weight, self.kv_cache.swa, q_out, self.rope_dim, self.eps
        )
        return q_out

    @eager_break_during_capture
    def _sparse_indexer_and_attn(
        self,
        q: torch.Tensor,
        positions: torch.Tensor,
        o: torch.Tensor,
        index_q: torch.Tensor | None,
        index_weights: torch.Tensor | None,
    ) -> None:
        """Always an eager break: indexer top-k, then sparse attention into ``o``."""
        attn_metadata = get_forward_context().attn_metadata
        comp_cache = comp_rows = None
        if self.indexer is not None:
            comp_rows = self.indexer.select(index_q, index_weights, positions, attn_metadata, self.topk_indices_buffer)
            comp_cache = self.kv_cache.compressed
        elif self.ratio > 1:
            ids = self.compressed_row_ids
            complete = (ids[None, :] + 1) * self.ratio <= positions[:, None] + 1
            comp_rows = torch.where(complete, ids[None, :], torch.full_like(ids, -1)[None, :])
            comp_cache = self.kv_cache.compressed
        if _is_profile_run(attn_metadata):
            o.zero_()  # profile run: nothing to attend to; the output is never used
            return
        md = attn_metadata[self.swa_key]
        self._attention_op(
            q,
            self.kv_cache.swa,
            comp_cache,
            comp_rows,
            positions,
            md.req_idx,
            md.block_table,
            self.attn_sink,
            o,
            self.window,
            self.ratio,
            self.block_size,
            self.scale,
        )


def _triton_missing(e: ImportError) -> CapturelintError:
    """The error for ``--kernels triton`` when Triton, or a package it needs, is missing
    (numpy, which its CPU interpreter imports)."""
    missing = getattr(e, "name", None) or ""
    if missing and missing.split(".")[0] not in ("triton", "capturelint"):
        return CapturelintError(
            f"kernels triton: Triton needs the package {missing!r}, which is missing ({e}); install it "
            f"(pip install {missing.split('.')[0]}) or use --kernels torch"
        )
    return CapturelintError(f"kernels triton need Triton ({e}); install triton or use --kernels torch")
