"""Paged KV caches of the bundled DeepSeek V4 model, and the block allocator.

**Layout** (docs/kernels.md). Every cache is a flat, slot-indexed tensor with **one
scratch row at the end**: a token cache has ``num_blocks * block_size + 1`` rows, a
compressed cache ``num_blocks * (block_size // ratio) + 1``. Token ``p`` of a request
lives in slot ``block_table[r, p // bs] * bs + p % bs``. Kernels send writes with a
negative slot (dummy runs, padding tokens) to the scratch row instead of filtering them
on the host, so every write is capturable; nothing reads the scratch row as data.

**Per layer**, by compression ratio:

- every layer: the sliding-window cache ``swa`` (RoPE'd shared KV, ``head_dim`` wide);
- ratio > 1: the compressed KV cache ``compressor.kv`` and the MLA compressor's partial
  state cache ``compressor.state`` (``[slots, 2, head_dim]``: kv and score per token);
- ratio 4 (an indexer layer): the indexer K cache ``indexer.k`` and the indexer
  compressor's state cache ``indexer.state``.

All layers share one block table: a block id names the same token range in every cache.

**Invariant.** Caches are allocated once and only ever written in place: a captured
graph holds their storages, so replacing a cache tensor would leave the graph writing
into the old one.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Iterator, Sequence

import torch

from capturelint.errors import CapturelintError

BlockId = int
INDEXER_RATIO = 4
"""Layers with this compression ratio have a lightning indexer (top-k selection);
larger ratios attend to every complete compressed row."""


class BlockAllocator:
    """Hands out KV-cache block ids, lowest free id first, so runs are reproducible."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free: list[BlockId] = list(range(num_blocks))
        heapq.heapify(self._free)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[BlockId]:
        if n > len(self._free):
            raise CapturelintError(
                f"KV cache out of blocks: {n} needed, {len(self._free)} free of {self.num_blocks}; "
                "raise max_blocks_per_request or lower max_num_seqs"
            )
        return [heapq.heappop(self._free) for _ in range(n)]

    def free(self, blocks: Sequence[BlockId]) -> None:
        for b in blocks:
            heapq.heappush(self._free, b)


@dataclasses.dataclass(frozen=True, eq=False)
class LayerKVCache:
    """The caches of one layer (``None`` where the layer's ratio has no such cache)."""

    ratio: int
    swa: torch.Tensor
    compressed: torch.Tensor | None = None
    compressor_state: torch.Tensor | None = None
    indexer_k: torch.Tensor | None = None
    indexer_state: torch.Tensor | None = None

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(suffix, tensor)`` pairs; the suffix follows the metadata prefixes."""
        yield "swa", self.swa
        if self.compressed is not None:
            yield "compressor.kv", self.compressed
        if self.compressor_state is not None:
            yield "compressor.state", self.compressor_state
        if self.indexer_k is not None:
            yield "indexer.k", self.indexer_k
        if self.indexer_state is not None:
            yield "indexer.state", self.indexer_state


class KVCache:
    """All layers' caches. ``layers[i]`` is layer ``i``'s ``LayerKVCache``."""

    def __init__(
        self,
        ratios: Sequence[int],
        num_blocks: int,
        block_size: int,
        head_dim: int,
        index_head_dim: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_slots = num_blocks * block_size
        layers = []
        for ratio in ratios:
            def alloc(*shape: int) -> torch.Tensor:
                return torch.zeros(*shape, device=device, dtype=dtype)

            swa = alloc(self.num_slots + 1, head_dim)
            if ratio == 1:
                layers.append(LayerKVCache(ratio, swa))
                continue
            comp_slots = num_blocks * (block_size // ratio) + 1
            layer = LayerKVCache(
                ratio,
                swa,
                compressed=alloc(comp_slots, head_dim),
                compressor_state=alloc(self.num_slots + 1, 2, head_dim),
            )
            if ratio == INDEXER_RATIO:
                layer = dataclasses.replace(
                    layer,
                    indexer_k=alloc(comp_slots, index_head_dim),
                    indexer_state=alloc(self.num_slots + 1, 2, index_head_dim),
                )
            layers.append(layer)
        self.layers: tuple[LayerKVCache, ...] = tuple(layers)

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``kv_cache.layers.<i>.<cache>`` names, e.g. ``kv_cache.layers.0.swa``."""
        for i, layer in enumerate(self.layers):
            for suffix, t in layer.named_tensors():
                yield f"kv_cache.layers.{i}.{suffix}", t

    def zero_(self) -> None:
        """Clear every cache in place (storages stay, so captured graphs stay valid)."""
        for _, t in self.named_tensors():
            t.zero_()
