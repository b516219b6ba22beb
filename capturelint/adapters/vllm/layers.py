"""The tiny DeepSeek V4's three attention layer kinds: their caches, the metadata the
runner passes them, and a stand-in prefill of a long request's context.

**Layout.** Layer ``i`` has compress ratio ``RATIO_PATTERN[i % 3]``: 1 (sliding window
only), 4 (compressed sparse: ``DeepseekCompressor`` plus ``DeepseekV4Indexer``) and 128
(heavily compressed: ``DeepseekCompressor``), vLLM's ``layer_types`` /
``compress_rates`` of ``hf_config``. ``--layers 3`` (the default) has one of each;
``--layers 1`` is the sliding-window layer alone.

**Positions** (the workload is ``workload.schedule``). Fresh requests are
prefilled from position 0; long ones have a 3-token prompt that begins at
``START_POSITION`` (125) and is prefilled for real. So the default six steps cross
what each kind does at a boundary: a ratio-4 compression at 3 and 127, the ratio-128
compression at 127 (in the long prompt's prefill; with vLLM's eager skip of the C128
compressor off the boundary, compressor.py:410-417, on the other steps), and the
indexer's switch from "every candidate" (``max_seq_len // 4 <= index_topk``,
attention.py:1121, ``_fill_short_context_topk_indices``) while only fresh requests
run, to the real top-k (``sparse_attn_indexer``'s prefill and decode paths) once the
long request does (``index_topk`` is 16).

**Stand-in prefill.** A long request's positions before its prompt are not computed
(a 125-token prefill per request would cost more than the whole check):
``LayerCaches.prefill`` writes random, well-formed entries, seeded by the run's seed
(the graph run and its eager twin see the same), into every cache its steps read:
the sliding-window rows of the last ``WINDOW`` positions, the compressor states of the
windows still open, the compressed entries of the closed ones (main and indexer
caches). What the steps compute from there is vLLM's.

**Caches** (``LayerCaches``), allocated and bound as vLLM's ``bind_kv_cache`` takes
them (``[blocks, 1, block_size, width]``; vLLM shares pages between some of them, here
each is its own tensor): per compressed layer its compressed KV cache (block size
``COMPRESSED_BLOCK`` tokens = 256/ratio entries of 584 bytes, sparse_mla.py:57), its
compressor's state cache (fp32 ``[4|8, 2*coff*512]`` blocks, compressor.py:160-171)
and, at ratio 4, the indexer's K cache (132 bytes per entry) and its compressor's
state cache. Each request owns its own blocks; block 0 of each cache is the null block
padded rows point at.

**Metadata** (``LayerMetadata``), built per step over persistent buffers (each
builder's own) from the runner's ``Buffers`` (positions, slots, sequence lengths, query
starts, the token-to-request map) and by the counts the runner built the SWA metadata
with (padded under FULL, real under PIECEWISE and eager; slot mappings as long as the
runner pads them; the decode/prefill split of ``split_decodes_and_prefills``), with
vLLM's builders' semantics and, where the builder's work is a wrapper around a kernel,
vLLM's wrapper itself (its kernel a reference, ``kernels.compressed``):

- ``{layer}`` -> ``DeepseekV4FlashMLAMetadata`` (``DeepseekV4SparseMLAMetadataBuilder.build``,
  sparse_mla.py:185): the compressed slot mapping from vLLM's
  ``get_compressed_slot_mapping``; at ratio 128 the C128A decode indices and the
  prefill tokens' local indices from vLLM's ``build_c128a_topk_metadata``
  (``_build_c128a_metadata``, width rounded to 128);
- ``{layer}.compressor.state_cache`` and ``{layer}.indexer.compressor.state_cache`` ->
  ``CompressorMetadata`` (``CompressorMetadataBuilder.build``, compressor.py:107): the
  state slots, the block table, ``c128_boundary`` (vLLM's ``_get_c128_boundary``
  rule) for the 8-token state blocks;
- ``{layer}.indexer.k_cache`` -> ``DeepseekV32IndexerMetadata``
  (``DeepseekV32IndexerMetadataBuilder.build``, v1/attention/backends/mla/indexer.py
  :1415): its decode part (the uniform non-varlen decode: compressed ``seq_lens``
  ``[B, 1]``, ``decode_lens`` of ones, no padding) and its prefill part: vLLM's own
  chunk split and ``build_prefill_chunk_metadata`` (``LayerMetadata._indexer_prefill``),
  which makes no chunk while the prefills hold no compressed entry.

A dummy batch (capture and warmup) has every slot ``-1`` and the null blocks.

Under vLLM's own runners (``runners.real``) vLLM plans, allocates and binds these
caches and its builders make the metadata; only the stand-in prefill is taken from
here, at the blocks vLLM's runner owns (``LayerCaches.bound``).
"""

from __future__ import annotations

from typing import Any

import torch

RATIO_PATTERN = (1, 4, 128)
START_POSITION = 125
INDEX_TOPK = 16
COMPRESSED_BLOCK = 256  # tokens per block of the compressed caches (sparse_mla.py:57)
STATE_BLOCK = {4: 4, 128: 8}  # CompressorStateCache.block_size (compressor.py:166-171)
INDEXER_ENTRY_BYTES = 132  # 128 fp8 + one fp32 scale (attention.py, DeepseekV4Indexer)
C128A_ALIGNMENT = 128  # sparse_mla._C128A_TOPK_ALIGNMENT
MAX_TOKENS = 64  # scheduler_config.max_num_batched_tokens of the tiny model
MAX_REQS = 16  # scheduler_config.max_num_seqs


def layer_ratios(num_layers: int) -> tuple[int, ...]:
    """The compress ratio of each layer: ``RATIO_PATTERN`` repeated."""
    return tuple(RATIO_PATTERN[i % len(RATIO_PATTERN)] for i in range(num_layers))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def cuda_indexer_op(attn: Any) -> None:
    """The indexer's ``SparseAttnIndexer`` on its CUDA path: a ``CustomOp`` dispatches by
    platform, on a CPU to ``forward_cpu`` (vLLM's own CPU kernels, not in the CUDA wheel)."""
    op = attn.indexer.indexer_op
    op._forward_method = op.forward_cuda


class LayerCaches:
    """The compressed layers' caches, bound to vLLM's modules; see the module docstring.
    ``requests``: how many requests the workload has; request ``r`` owns compressed
    block ``1 + r`` and its own state blocks (block 0 of each is the null block that
    padded rows point at)."""

    def __init__(self, model: Any, requests: int, max_len: int):
        self.requests = requests
        self.max_len = max_len
        self.compressed_table = 1 + torch.arange(requests, dtype=torch.int32).view(requests, 1)
        self.state_tables = {r: 1 + torch.arange(requests * (max_len // bs), dtype=torch.int32).view(requests, -1)
                             for r, bs in STATE_BLOCK.items()}
        self.named: list[tuple[str, torch.Tensor]] = []
        self.layers = []
        for i, layer in enumerate(model.layers):
            attn = layer.attn
            if attn.compress_ratio == 1:
                continue
            self.layers.append(attn)
            r = attn.compress_ratio
            self._bind(f"kv_cache.layers.{i}.compressed", attn,
                       torch.zeros(1 + requests, 1, COMPRESSED_BLOCK // r, 584, dtype=torch.uint8))
            self._bind_state(f"kv_cache.layers.{i}.compressor_state", attn.compressor)
            if attn.indexer is not None:
                self._bind(f"kv_cache.layers.{i}.indexer", attn.indexer.k_cache,
                           torch.zeros(1 + requests, 1, COMPRESSED_BLOCK // r, INDEXER_ENTRY_BYTES, dtype=torch.uint8))
                self._bind_state(f"kv_cache.layers.{i}.indexer_compressor_state", attn.indexer.compressor)
                cuda_indexer_op(attn)

    @classmethod
    def bound(cls, model: Any, batch: int, compressed_table: torch.Tensor | None,
              state_tables: dict[int, torch.Tensor]) -> LayerCaches:
        """The compressed layers' caches as someone else (vLLM's own runner) allocated and
        bound them, with that owner's block tables (``[batch, blocks]``: the compressed
        caches', each ratio's state caches'), for ``prefill``."""
        self = cls.__new__(cls)
        self.requests, self.compressed_table, self.state_tables = batch, compressed_table, state_tables
        self.layers = [layer.attn for layer in model.layers if layer.attn.compress_ratio > 1]
        self.named = []
        for attn in self.layers:
            if attn.indexer is not None:
                cuda_indexer_op(attn)
        return self

    def _bind(self, name: str, owner: Any, cache: torch.Tensor) -> None:
        owner.bind_kv_cache(cache)
        self.named.append((name, owner.kv_cache))

    def _bind_state(self, name: str, compressor: Any) -> None:
        r = compressor.compress_ratio
        blocks = 1 + self.state_tables[r].numel()
        width = compressor.state_cache.state_dim
        self._bind(name, compressor.state_cache,
                   torch.zeros(blocks, 1, STATE_BLOCK[r], width, dtype=torch.float32))

    # -- the stand-in prefill
    def prefill(self, starts: list[int], swa: list[tuple[torch.Tensor, torch.Tensor]], swa_block: int, window: int,
                seed: int) -> None:
        """Random, well-formed cache entries for each request's positions before its
        first step (request ``r``: before ``starts[r]``): ``swa`` lists each
        sliding-window cache (2-D byte view) with its block table (a row per request)."""
        from capturelint.adapters.vllm.kernels.fp8_ds_mla import write_fp8_ds_mla

        gen = torch.Generator().manual_seed(seed + 7)

        def rows(n: int, dim: int) -> torch.Tensor:
            return torch.randn(n, dim, generator=gen)

        for req, start in enumerate(starts):
            if start <= 0:
                continue
            positions = torch.arange(max(start - window, 0), start)
            for cache, table in swa:
                slots = table.long()[req, positions // swa_block] * swa_block + positions % swa_block
                write_fp8_ds_mla(cache, rows(slots.numel(), 512).bfloat16(), slots, swa_block)
            for attn in self.layers:
                r = attn.compress_ratio
                slots = int(self.compressed_table[req, 0]) * (COMPRESSED_BLOCK // r) + torch.arange(start // r)
                if slots.numel():
                    cache = attn.kv_cache.view(attn.kv_cache.shape[0], -1)
                    write_fp8_ds_mla(cache, rows(slots.numel(), 512).bfloat16(), slots, COMPRESSED_BLOCK // r)
                self._prefill_state(attn.compressor, req, start, rows)
                if attn.indexer is not None:
                    self._prefill_indexer(attn.indexer.k_cache.kv_cache, slots, gen)
                    self._prefill_state(attn.indexer.compressor, req, start, rows)

    def _prefill_state(self, compressor: Any, req: int, start: int, rows: Any) -> None:
        """States of the positions of the windows still open at ``start``."""
        r = compressor.compress_ratio
        window = (1 + int(compressor.overlap)) * r
        first = max((start // r) * r - (window - r), 0)
        positions = torch.arange(first, start)
        bs = STATE_BLOCK[r]
        blocks = self.state_tables[r].long()[req, positions // bs]
        state = compressor.state_cache.kv_cache
        state[blocks, positions % bs] = rows(blocks.numel(), state.shape[-1])

    @staticmethod
    def _prefill_indexer(cache: torch.Tensor, slots: torch.Tensor, gen: torch.Generator) -> None:
        """Indexer entries: e4m3 values and power-of-two fp32 scales."""
        if slots.numel() == 0:
            return
        bs = cache.shape[1]
        flat = cache.view(cache.shape[0], -1)
        block, offset = slots // bs, slots % bs
        values = torch.randn(slots.numel(), 128, generator=gen).mul(64).to(torch.float8_e4m3fn).view(torch.uint8)
        flat[block[:, None], offset[:, None] * 128 + torch.arange(128)] = values
        exponents = torch.randint(-8, -4, (slots.numel(),), generator=gen)
        scales = torch.ldexp(torch.ones(slots.numel()), exponents)[:, None].view(torch.uint8)
        flat[block[:, None], bs * 128 + offset[:, None] * 4 + torch.arange(4)] = scales


class LayerMetadata:
    """Per-layer-kind decode metadata over persistent buffers (each builder's own, sized
    for ``MAX_TOKENS`` tokens and ``MAX_REQS`` requests); see the module docstring."""

    def __init__(self, caches: LayerCaches, vllm_config: Any):
        from vllm.v1.attention.backends.mla.indexer import get_max_prefill_buffer_size

        self.caches = caches
        self.layers = caches.layers
        self.prefill_buffer = get_max_prefill_buffer_size(vllm_config)  # the indexer builder's, uncompressed rows
        self.state_slots = {r: torch.full((MAX_TOKENS,), -1, dtype=torch.long) for r in STATE_BLOCK}
        self.compressed_slots: dict[str, torch.Tensor] = {}
        for attn in caches.layers:  # one buffer per builder: the layer's and its indexer's
            self.compressed_slots[attn.prefix] = torch.full((MAX_TOKENS,), -1, dtype=torch.long)
            if attn.indexer is not None:
                self.compressed_slots[attn.indexer.k_cache.prefix] = torch.full((MAX_TOKENS,), -1, dtype=torch.long)
        width = _cdiv(_cdiv(caches.max_len, 128), C128A_ALIGNMENT) * C128A_ALIGNMENT
        self.c128a = (torch.empty(MAX_TOKENS, width, dtype=torch.int32), torch.empty(MAX_TOKENS, dtype=torch.int32),
                      torch.empty(MAX_TOKENS, width, dtype=torch.int32))
        self.c128a_width = width
        # the runner's block tables of the compressed cache groups: a row per batch row
        self.compressed_table = torch.zeros(MAX_REQS, 1, dtype=torch.int32)
        self.state_tables = {r: torch.zeros(MAX_REQS, t.shape[1], dtype=torch.int32)
                             for r, t in caches.state_tables.items()}
        self.indexer_seq_lens = torch.zeros(MAX_REQS, 1, dtype=torch.int32)
        self.indexer_decode_lens = torch.ones(MAX_REQS, dtype=torch.int32)
        self.schedule_metadata = torch.zeros(1, 2, dtype=torch.int32)  # DeepGEMM's SM schedule: no meaning on CPU

    def build(self, b: Any, reqs: list[int], num_reqs: int, num_tokens: int, slot_mapping: torch.Tensor,
              split: tuple[int, int, int, int], max_query_len: int) -> dict[str, Any]:
        """The compressed layers' entries of one step's ``attn_metadata``, from the
        runner's buffers ``b`` (filled for the step, the SWA metadata built), by the
        counts the runner builds the SWA metadata with: ``num_reqs`` / ``num_tokens``
        (padded under FULL, real otherwise), its ``slot_mapping`` (what the runner pads
        it to) and its decode/prefill ``split`` (``split_decodes_and_prefills``:
        decodes, prefills, decode tokens, prefill tokens). ``reqs``: the real rows'
        requests (-1: a dummy's); padded rows point at the null blocks, and a token with
        slot -1 gets state slot -1."""
        from vllm.model_executor.layers.sparse_attn_indexer import (
            DeepseekV32IndexerMetadata,
        )
        from vllm.models.deepseek_v4.sparse_mla import (
            DeepseekV4FlashMLAMetadata,
            build_c128a_topk_metadata,
        )
        from vllm.v1.attention.backends.mla.compressor_utils import (
            get_compressed_slot_mapping,
        )
        from vllm.v1.attention.backends.mla.indexer import (
            DeepSeekV32IndexerDecodeMetadata,
        )

        if not self.layers:
            return {}
        num_decodes, num_prefills, d, num_prefill_tokens = split
        n = num_tokens
        seq_lens = b.seq_lens[:num_reqs]
        max_seq_len = int(seq_lens.max())
        positions = b.positions[:n]
        with torch.no_grad():
            self.compressed_table.zero_()
            for table in self.state_tables.values():
                table.zero_()
            for row, req in enumerate(reqs):
                if req >= 0:
                    self.compressed_table[row] = self.caches.compressed_table[req]
                    for r, table in self.state_tables.items():
                        table[row] = self.caches.state_tables[r][req]
            # each state cache group's slot mapping, as long as the runner's (PAD past the real tokens)
            m = slot_mapping.shape[0]
            pos = b.positions[:m]
            req = b.token_to_req_indices[:m].long().clamp(0, MAX_REQS - 1)
            valid = slot_mapping >= 0
            for r, bs in STATE_BLOCK.items():
                slots = self.state_tables[r].long()[req, torch.div(pos, bs, rounding_mode="floor")] * bs + pos % bs
                self.state_slots[r].fill_(-1)
                self.state_slots[r][:m] = torch.where(valid, slots, -1)
        # _get_c128_boundary (compressor.py:45), from the host's sequence and query lengths
        query_lens = (b.query_start_loc[1:num_reqs + 1] - b.query_start_loc[:num_reqs]).tolist()
        starts = (seq_lens.long() - torch.tensor(query_lens, dtype=torch.long)).tolist()
        c128_boundary = any(s % 128 + q >= 128 for s, q in zip(starts, query_lens))
        md: dict[str, Any] = {}
        table = self.compressed_table[:num_reqs]
        for attn in self.layers:
            r = attn.compress_ratio
            slots = get_compressed_slot_mapping(n, slot_mapping, b.query_start_loc[: num_reqs + 1], seq_lens,
                                                table.clamp_(min=0), COMPRESSED_BLOCK // r, r,
                                                out=self.compressed_slots[attn.prefix])
            c128a: dict[str, Any] = {}
            if r == 128:  # _build_c128a_metadata (sparse_mla.py:229-285)
                width = min(max(_next_pow2(max(max_seq_len // r, 1)), C128A_ALIGNMENT), self.c128a_width)
                decode, lens, prefill = build_c128a_topk_metadata(
                    positions[: d + num_prefill_tokens], r, d, b.token_to_req_indices[:n], table[:num_decodes],
                    COMPRESSED_BLOCK // r, slot_mapping, *self.c128a, max_compressed_tokens=width)
                if d:
                    c128a = {"c128a_global_decode_topk_indices": decode.view(d, 1, -1), "c128a_decode_topk_lens": lens}
                if num_prefill_tokens:
                    c128a["c128a_prefill_topk_indices"] = prefill
            md[attn.prefix] = DeepseekV4FlashMLAMetadata(
                num_reqs=num_reqs, max_query_len=max_query_len, max_seq_len=max_seq_len, num_actual_tokens=n,
                query_start_loc=b.query_start_loc[: num_reqs + 1], slot_mapping=slots, block_table=table,
                req_id_per_token=b.token_to_req_indices[:n], block_size=COMPRESSED_BLOCK, topk_tokens=INDEX_TOPK,
                **c128a)
            md[attn.compressor.state_cache.prefix] = self._state(attn.compressor, num_reqs, m, b, c128_boundary)
            if attn.indexer is not None:
                indexer = attn.indexer
                prefix = indexer.k_cache.prefix
                islots = get_compressed_slot_mapping(n, slot_mapping, b.query_start_loc[: num_reqs + 1], seq_lens,
                                                     table.clamp_(min=0), COMPRESSED_BLOCK // r, r,
                                                     out=self.compressed_slots[prefix])
                decode = None
                if num_decodes:
                    self.indexer_seq_lens[:num_decodes, 0] = torch.div(seq_lens[:num_decodes], r,
                                                                       rounding_mode="floor")
                    decode = DeepSeekV32IndexerDecodeMetadata(
                        block_table=table[:num_decodes], seq_lens=self.indexer_seq_lens[:num_decodes],
                        decode_lens=self.indexer_decode_lens[:num_decodes], requires_padding=False,
                        schedule_metadata=self.schedule_metadata)
                md[prefix] = DeepseekV32IndexerMetadata(
                    seq_lens=seq_lens, max_seq_len=max_seq_len, slot_mapping=islots, num_decodes=num_decodes,
                    num_decode_tokens=d, num_prefills=num_prefills, num_prefill_tokens=num_prefill_tokens,
                    decode=decode, prefill=self._indexer_prefill(b, num_decodes, num_reqs, table, r),
                    positions=positions, block_table=table)
                md[indexer.compressor.state_cache.prefix] = self._state(indexer.compressor, num_reqs, m, b,
                                                                        c128_boundary)
        return md

    def _indexer_prefill(self, b: Any, num_decodes: int, num_reqs: int, table: torch.Tensor, r: int) -> Any:
        """The indexer's prefill metadata as ``DeepseekV32IndexerMetadataBuilder.build``
        makes it (indexer.py:1485-1595, no context parallelism, no row sharding): vLLM's
        own chunk split (``_split_indexer_prefill_chunks``) and
        ``build_prefill_chunk_metadata``, which makes no chunk for prefills that hold
        no compressed entry yet."""
        import vllm.envs as envs
        from vllm.v1.attention.backends.mla.indexer import (
            DeepseekV32IndexerMetadataBuilder,
            DeepseekV32IndexerPrefillMetadata,
            build_prefill_chunk_metadata,
        )

        if num_reqs == num_decodes:
            return None
        seq_lens = b.seq_lens[:num_reqs]
        query_start_loc = b.query_start_loc[: num_reqs + 1]
        compressed = torch.div(seq_lens, r, rounding_mode="floor")
        query_lens = torch.diff(query_start_loc[num_decodes:])
        specs = DeepseekV32IndexerMetadataBuilder._split_indexer_prefill_chunks(
            compressed[num_decodes:], query_lens, self.prefill_buffer // r,
            envs.VLLM_SPARSE_INDEXER_MAX_LOGITS_MB * 1024 * 1024, request_offset=num_decodes)
        chunks = []
        for req_slice, query_slice in specs:
            chunk = build_prefill_chunk_metadata(req_slice.start, req_slice.stop, query_start_loc,
                                                 query_start_loc.clone(), seq_lens, compressed, compressed.clone(),
                                                 table, r, query_slice=query_slice,
                                                 skip_kv_gather=query_slice.start > 0)
            if chunk is not None:
                chunks.append(chunk)
        return DeepseekV32IndexerPrefillMetadata(chunks, max_prefill_seq_len=int(seq_lens[num_decodes:].max()))

    def _state(self, compressor: Any, num_reqs: int, m: int, b: Any, c128_boundary: bool) -> Any:
        from vllm.models.deepseek_v4.compressor import CompressorMetadata

        r = compressor.compress_ratio
        bs = STATE_BLOCK[r]
        return CompressorMetadata(block_table=self.state_tables[r][:num_reqs].clamp_(min=0),
                                  slot_mapping=self.state_slots[r][:m], block_size=bs,
                                  token_to_req_indices=b.token_to_req_indices[:m], num_decode_tokens=None,
                                  c128_boundary=c128_boundary if bs == 8 else None)


def _next_pow2(x: int) -> int:
    return 1 << (x - 1).bit_length()


__all__ = [
    "COMPRESSED_BLOCK",
    "INDEX_TOPK",
    "RATIO_PATTERN",
    "START_POSITION",
    "LayerCaches",
    "LayerMetadata",
    "layer_ratios",
]
