"""The DeepSeek-V4-shaped decoder: embedding, layers of attention plus MoE, final norm,
and an LM head that the runner applies outside the graph.

**What the runner captures.** ``DeepseekV4ForCausalLM.model`` (a ``DeepseekV4Model``)
maps ``(input_ids, positions)`` to final hidden states; that is the callable the
``CUDAGraphWrapper`` captures and replays. ``compute_logits`` runs the LM head on the
sampled positions after the graph, as vLLM does, so a padded graph never computes logits
for padding tokens.

**Weights** come from the seed alone (``init_weights``): no downloads. Their scales make
attention matter for the argmax: the attention output projection is scaled up and the
LM head sharpened, so a configuration that attends to the wrong keys (or never writes
its KV cache) changes greedy tokens within a few steps instead of hiding in the noise.

**Parameter names** follow vLLM's style and are what the checker prints:
``model.layers.0.attn.wq_a.weight``, ``model.layers.1.attn.indexer.compressor.wkv.weight``,
``model.layers.0.ffn.w1``, ``lm_head.weight``; the shared indexer buffer is
``model.topk_indices_buffer``.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn

from capturelint.engine.config import EagerRegion, EngineConfig
from capturelint.engine.dsv4.attention import DeepseekV4Attention, RMSNorm, attention_kernels
from capturelint.engine.dsv4.moe import MoE
from capturelint.engine.kv_cache import KVCache
from capturelint.engine.metadata import CacheKind

ATTENTION_OUTPUT_GAIN = 3.0
"""Scale of the attention output projection relative to a unit-variance init: keeps the
attention contribution to the residual stream comparable to the embedding's, so what
attention reads decides the argmax."""

LM_HEAD_GAIN = 4.0
"""Logit scale: greedy choices are clear-cut (float noise never flips them) and a wrong
hidden state moves logits by whole units."""


class DecoderLayer(nn.Module):
    """Pre-norm residual block: attention, then MoE."""

    def __init__(
        self,
        config: EngineConfig,
        index: int,
        eager_region: EagerRegion,
        topk_buffer: torch.Tensor,
        kernels: tuple[Callable, Callable],
    ):
        super().__init__()
        ratio = config.layer_ratios[index]
        self.ratio = ratio
        self.prefix = f"layers.{index}"
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_eps)
        self.attn = DeepseekV4Attention(config, self.prefix, ratio, eager_region, topk_buffer, kernels)
        self.ffn_norm = RMSNorm(config.hidden_size, config.rms_eps)
        self.ffn = MoE(config.hidden_size, config.moe_intermediate_size, config.num_experts, config.num_experts_per_tok)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.attn(positions, self.attn_norm(hidden))
        return hidden + self.ffn(self.ffn_norm(hidden))

    def cache_kinds(self) -> tuple[CacheKind, ...]:
        """Metadata entries this layer reads from the forward context."""
        if self.ratio == 1:
            return (CacheKind.SWA,)
        if self.attn.indexer is not None:
            return (CacheKind.SWA, CacheKind.COMPRESSOR, CacheKind.INDEXER)
        return (CacheKind.SWA, CacheKind.COMPRESSOR)


class DeepseekV4Model(nn.Module):
    """``(input_ids [T], positions [T]) -> hidden [T, hidden]``: the captured callable."""

    def __init__(self, config: EngineConfig, eager_region: EagerRegion, max_num_tokens: int, device):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        # One top-k buffer shared by every indexer layer, sized for the largest step,
        # as vLLM's topk_indices_buffer: the indexer writes rows [:T] in place.
        self.register_buffer(
            "topk_indices_buffer",
            torch.full((max_num_tokens, config.index_topk), -1, dtype=torch.int64),
            persistent=False,
        )
        kernels = attention_kernels(config.kernels, device)
        self.layers = nn.ModuleList(
            DecoderLayer(config, i, eager_region, self.topk_indices_buffer, kernels) for i in range(config.num_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids)
        for layer in self.layers:
            hidden = layer(positions, hidden)
        return self.norm(hidden)

    def bind_kv_cache(self, kv_cache: KVCache) -> None:
        for layer, cache in zip(self.layers, kv_cache.layers):
            layer.attn.bind_kv_cache(cache)

    def cache_layout(self) -> tuple[tuple[str, tuple[CacheKind, ...]], ...]:
        """``(layer prefix, cache kinds)`` per layer: the keys of ``attn_metadata``."""
        return tuple((layer.prefix, layer.cache_kinds()) for layer in self.layers)


class DeepseekV4ForCausalLM(nn.Module):
    """The decoder plus its LM head."""

    def __init__(self, config: EngineConfig, eager_region: EagerRegion, max_num_tokens: int, device="cpu"):
        super().__init__()
        self.model = DeepseekV4Model(config, eager_region, max_num_tokens, device)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)


def init_weights(model: nn.Module, seed: int) -> None:
    """Initialise every parameter from ``seed``, in ``named_parameters`` order.

    Norm weights are 1 and attention sinks 0 (their usual starting points); matrices are
    normal with standard deviation ``gain / sqrt(fan_in)`` (fan-in is the last dim), the
    embedding unit-normal.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            owner = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else ""
            if "norm" in owner:
                p.fill_(1.0)
                continue
            if leaf == "attn_sink":
                p.zero_()
                continue
            gain = 1.0
            if owner == "wo_b":
                gain = ATTENTION_OUTPUT_GAIN
            elif owner == "lm_head":
                gain = LM_HEAD_GAIN
            std = 1.0 if owner == "embed" else gain / math.sqrt(p.shape[-1])
            p.copy_(torch.randn(p.shape, generator=gen) * std)
