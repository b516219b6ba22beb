"""Attention metadata: what the kernels read about a step, and the builders that make it.

**What the kernels read.** ``AttentionMetadata`` holds tensors only: the slot of every
token (``slot_mapping``, ``-1`` for padding and dummy tokens), the block-table row of
every token (``req_idx``), the block table, and the sequence lengths. No host ints: a
captured graph freezes host values at capture, so anything that varies per step must be
a tensor the runner refreshes.

**The forward context** carries a dict from layer-cache prefix (``"layers.0.swa"``,
``"layers.1.compressor"``, ``"layers.1.indexer"``) to metadata, one entry per cache kind
of each layer, or ``None`` in profile and dummy runs.

**Builders**, one per cache kind, decide where the tensors live, which is what decides
whether a FULL graph replays correctly:

- ``ViewMetadataBuilder`` (V1): views of the runner's persistent buffers, which the
  runner refreshes in place every step. A graph captured on them reads fresh values.
- ``FreshMetadataBuilder`` (V1 with ``fresh_metadata``): new tensors every step. A FULL
  graph keeps reading the tensors of its capture step: the address hazard (R4).
- ``PersistentMetadataBuilder`` (V2): the builder owns persistent buffers and writes
  each step's metadata into them in place; the block table is the runner's.

Every builder pads to the step's padded token count, so the metadata of a replayed step
has exactly the shapes (and, for persistent builders, the storages and views) of the
metadata the graph was captured with.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from typing import Iterator, Sequence

import torch

PAD_SLOT = -1
"""Slot of padding and dummy tokens: the write kernels send it to the scratch row."""


class CacheKind(enum.Enum):
    """The kinds of KV cache a layer can have; also the last part of a metadata key."""

    SWA = "swa"
    COMPRESSOR = "compressor"
    INDEXER = "indexer"

    def __str__(self) -> str:
        return self.value


def metadata_key(layer_prefix: str, kind: CacheKind) -> str:
    """``metadata_key("layers.0", CacheKind.SWA) == "layers.0.swa"``."""
    return f"{layer_prefix}.{kind.value}"


@dataclasses.dataclass(frozen=True)
class StepBatch:
    """Host-side description of one step's tokens, before it is written to tensors.

    ``num_padded >= num_tokens`` is the token count the forward runs with (the graph's
    size, or ``num_tokens`` when running eagerly). Per-token tuples have ``num_tokens``
    entries; per-request ones one entry per scheduled request, in block-table row order.
    ``logits_indices`` are the tokens whose logits are sampled (each request's last).
    """

    num_tokens: int
    num_padded: int
    uniform_decode: bool
    input_ids: tuple[int, ...]
    positions: tuple[int, ...]
    slot_mapping: tuple[int, ...]
    req_idx: tuple[int, ...]
    block_table: tuple[tuple[int, ...], ...]
    seq_lens: tuple[int, ...]
    logits_indices: tuple[int, ...]

    @classmethod
    def dummy(cls, num_tokens: int, uniform_decode: bool) -> "StepBatch":
        """A capture or warm-up batch: every token at position 0 of block-table row 0,
        with slot ``-1`` so no cache is written (vLLM's dummy run)."""
        return cls(
            num_tokens=num_tokens,
            num_padded=num_tokens,
            uniform_decode=uniform_decode,
            input_ids=(0,) * num_tokens,
            positions=(0,) * num_tokens,
            slot_mapping=(PAD_SLOT,) * num_tokens,
            req_idx=(0,) * num_tokens,
            block_table=(),
            seq_lens=(),
            logits_indices=(),
        )

    def padded(self, values: Sequence[int], fill: int) -> list[int]:
        """``values`` padded with ``fill`` to ``num_padded`` entries."""
        return list(values) + [fill] * (self.num_padded - len(values))

    def table_rows(self, num_rows: int, num_cols: int) -> list[list[int]]:
        """The block table as ``num_rows x num_cols``; unused entries are 0 (a valid
        block, so clamped gathers of masked keys stay in bounds)."""
        rows = [list(r) + [0] * (num_cols - len(r)) for r in self.block_table]
        return rows + [[0] * num_cols for _ in range(num_rows - len(rows))]

    def padded_seq_lens(self, num_rows: int) -> list[int]:
        return list(self.seq_lens) + [0] * (num_rows - len(self.seq_lens))


@dataclasses.dataclass(frozen=True, eq=False)
class AttentionMetadata:
    """The tensors the DSV4 kernels read about a step (shapes for ``Tp`` padded tokens).

    - ``slot_mapping`` ``[Tp]`` int64: cache slot of each token, ``-1`` for padding.
    - ``req_idx`` ``[Tp]`` int64: block-table row of each token (padding: row 0).
    - ``block_table`` ``[max_num_seqs, max_blocks_per_request]`` int64: block ids.
    - ``seq_lens`` ``[max_num_seqs]`` int64: tokens of each request after the step.
    """

    slot_mapping: torch.Tensor
    req_idx: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for f in dataclasses.fields(self):
            yield f.name, getattr(self, f.name)


@dataclasses.dataclass(frozen=True, eq=False)
class MetadataBuffers:
    """Persistent metadata tensors, sized for the largest step; ``write`` refreshes them
    in place and ``views`` hands out the step's slices (same storages every step)."""

    slot_mapping: torch.Tensor
    req_idx: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor

    @classmethod
    def allocate(
        cls,
        max_tokens: int,
        max_reqs: int,
        max_blocks: int,
        device: torch.device | str,
        block_table: torch.Tensor | None = None,
    ) -> "MetadataBuffers":
        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, dtype=torch.int64, device=device)

        return cls(
            slot_mapping=torch.full((max_tokens,), PAD_SLOT, dtype=torch.int64, device=device),
            req_idx=zeros(max_tokens),
            block_table=zeros(max_reqs, max_blocks) if block_table is None else block_table,
            seq_lens=zeros(max_reqs),
        )

    def write(self, batch: StepBatch, include_block_table: bool = True) -> None:
        n = batch.num_padded
        dev = self.slot_mapping.device
        self.slot_mapping[:n].copy_(torch.tensor(batch.padded(batch.slot_mapping, PAD_SLOT), device=dev))
        self.req_idx[:n].copy_(torch.tensor(batch.padded(batch.req_idx, 0), device=dev))
        rows = self.seq_lens.shape[0]
        self.seq_lens.copy_(torch.tensor(batch.padded_seq_lens(rows), device=dev))
        if include_block_table:
            write_block_table(self.block_table, batch)

    def views(self, batch: StepBatch) -> AttentionMetadata:
        n = batch.num_padded
        return AttentionMetadata(self.slot_mapping[:n], self.req_idx[:n], self.block_table, self.seq_lens)


def write_block_table(block_table: torch.Tensor, batch: StepBatch) -> None:
    """Refresh a persistent block table in place from the step's host rows."""
    rows, cols = block_table.shape
    block_table.copy_(torch.tensor(batch.table_rows(rows, cols), device=block_table.device))


class AttentionMetadataBuilder(abc.ABC):
    """Builds one cache kind's metadata for a step."""

    def __init__(self, kind: CacheKind):
        self.kind = kind

    @abc.abstractmethod
    def build(self, batch: StepBatch) -> AttentionMetadata:
        """The step's metadata, padded to ``batch.num_padded`` tokens."""

    def named_buffers(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Persistent tensors this builder owns (``metadata.<kind>.<field>``)."""
        return iter(())


class ViewMetadataBuilder(AttentionMetadataBuilder):
    """Views of persistent buffers that someone else (the V1 runner) refreshes."""

    def __init__(self, kind: CacheKind, buffers: MetadataBuffers):
        super().__init__(kind)
        self.buffers = buffers

    def build(self, batch: StepBatch) -> AttentionMetadata:
        return self.buffers.views(batch)


class FreshMetadataBuilder(AttentionMetadataBuilder):
    """New tensors every step, built from the host description (V1 ``fresh_metadata``).

    Correct for eager execution and for breaks that read the forward context; wrong for
    a FULL graph, whose captured kernels keep the capture step's tensors.
    """

    def __init__(self, kind: CacheKind, max_reqs: int, max_blocks: int, device: torch.device | str):
        super().__init__(kind)
        self.max_reqs = max_reqs
        self.max_blocks = max_blocks
        self.device = device

    def build(self, batch: StepBatch) -> AttentionMetadata:
        def t(values: list) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=self.device)

        return AttentionMetadata(
            slot_mapping=t(batch.padded(batch.slot_mapping, PAD_SLOT)),
            req_idx=t(batch.padded(batch.req_idx, 0)),
            block_table=t(batch.table_rows(self.max_reqs, self.max_blocks)),
            seq_lens=t(batch.padded_seq_lens(self.max_reqs)),
        )


class PersistentMetadataBuilder(AttentionMetadataBuilder):
    """Owns persistent buffers and writes every step's metadata into them (V2).

    The block table is the runner's persistent one, which the runner refreshes.
    """

    def __init__(self, kind: CacheKind, max_tokens: int, block_table: torch.Tensor):
        super().__init__(kind)
        self.buffers = MetadataBuffers.allocate(
            max_tokens, block_table.shape[0], block_table.shape[1], block_table.device, block_table
        )

    def build(self, batch: StepBatch) -> AttentionMetadata:
        self.buffers.write(batch, include_block_table=False)
        return self.buffers.views(batch)

    def named_buffers(self) -> Iterator[tuple[str, torch.Tensor]]:
        b = self.buffers
        for name in ("slot_mapping", "req_idx", "seq_lens"):
            yield f"metadata.{self.kind}.{name}", getattr(b, name)
