"""The two model runners' capture conditions, reproduced: the step loop of FULL
configurations (and of PIECEWISE ones where asked for).

**The runners** (``ReproducedLoop``), a loop over those steps with the model wrapped by vLLM's
``BreakableCUDAGraphWrapper``, over persistent buffers (``Buffers``: input ids,
positions, slot mapping, block table, sequence lengths, query starts, and the SWA
metadata builder's own index buffers) sized for ``max_num_batched_tokens``:

- **Dispatch** is vLLM's ``CudagraphDispatcher`` (real code) over
  ``cudagraph_capture_sizes`` (default 2,4): the smallest capture size >= the step's
  token count, eager above the largest. The configured FULL mode is resolved by vLLM's
  ``resolve_cudagraph_mode_and_sizes`` (real code) with DeepSeek V4's builders' support
  (``resolved_cudagraph_mode``): FULL_DECODE_ONLY, so prefill and mixed steps run
  eagerly and uniform decode batches replay FULL graphs. V2's own candidate table
  (cudagraph_utils.py:256-395) is stood in for by the dispatcher; for these modes it
  picks the same graphs.
- **Capture** (``ReproducedLoop.capture``), per capture size, largest first. Model Runner V1
  (``v1/worker/gpu_model_runner.py``, wrapped with ``runtime_mode=PIECEWISE``,
  :5130-5147): ``_warmup_and_capture`` (:6523) runs the warmup and the capturing
  ``_dummy_run`` with ``force_attention = mode == FULL`` (:6536): a PIECEWISE graph is
  captured **without attention metadata** (``attn_metadata=None``, :5637) and slots
  filled with -1 (:5628); a FULL graph with the dummy's padded metadata. Model Runner V2
  (``v1/worker/gpu/cudagraph_utils.py``, any non-NONE mode, :570): ``capture``
  (:424-486) runs a warmup (mode NONE) and the capture, metadata always built
  (``prepare_inputs_to_capture`` :827, ``prepare_attn`` :898) over ``PAD_SLOT_ID``
  slots (``block_table.py:262 get_dummy_slot_mappings``). The dummy batches are each
  runner's (``ReproducedLoop.dummy_batch``): all decode tokens.
- **Padding** (``ReproducedLoop.step_batch``): a step padded to its capture size gets metadata
  over the padded counts under FULL and over the real ones under PIECEWISE and eager
  (V1 ``pad_attn``; V2 ``model_states/default.py:179-186``); V1's slot mapping spans
  the real tokens unless FULL, V2's always spans the padded ones. Padded request rows
  get the null block, ``seq_len`` 0 and empty queries; padded token rows slot -1.
- **Metadata** (``ReproducedLoop.metadata``): what ``DeepseekSparseSWAMetadataBuilder.build``
  makes (its Triton kernels are in torch here), with vLLM's own
  ``split_decodes_and_prefills``; prefill fields for the prefill path.

Each step runs under ``set_forward_context(attn_metadata, ...)`` with the dispatched
mode and batch descriptor; only its real rows are kept (and compared). V1's FULL graphs
are captured here by the breakable wrapper under a FULL forward context (vLLM's
FULL-mode bypass makes the whole forward one captured segment), where vLLM's V1 uses
``CUDAGraphWrapper``: the same ops in one graph. ``tests/vllm/test_vllm_contract.py``
pins every vLLM function stood in for here.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import torch

from capturelint.adapters.vllm import layers as vllm_layers
from capturelint.adapters.vllm.model import (
    MAX_BLOCKS,
    MAX_REQS,
    MAX_TOKENS,
    PAD_SLOT_ID,
    SWA_BLOCK,
    WINDOW,
    build_model,
    runner_env,
)
from capturelint.adapters.vllm.workload import RunSpec, Scheduled, prompts, workload
from capturelint.options import Runner
from capturelint.runtime import frames

frames.register_runtime_file(__file__)

NULL_BLOCK_ID = 0  # vLLM's block 0 is reserved for padding rows (gpu_model_runner.py:2302-2304)


@dataclasses.dataclass(frozen=True)
class Batch:
    """A batch as the runner lays it out in its persistent buffers.

    ``scheduled``: the real requests (decodes first). ``num_tokens_padded`` /
    ``num_reqs_padded``: what it was dispatched to (the capture size; the real counts
    when it runs eagerly). ``max_query_len``: what the runner tells the metadata
    builders. ``padded_metadata``: the attention metadata counts the padded rows (FULL
    graphs); otherwise it is built with the real counts. ``padded_slots``: the slot
    mapping spans the padded tokens (``PAD_SLOT_ID`` past the real ones) rather than
    the real ones only. ``dummy``: a capture's or warmup's dummy batch (every slot
    ``PAD_SLOT_ID``, inputs zero)."""

    scheduled: tuple[Scheduled, ...]
    num_tokens_padded: int
    num_reqs_padded: int
    max_query_len: int
    padded_metadata: bool
    padded_slots: bool
    dummy: bool = False

    @property
    def num_tokens(self) -> int:
        return sum(s.query_len for s in self.scheduled)

    @property
    def num_reqs(self) -> int:
        return len(self.scheduled)

def uniform_decode(scheduled: tuple[Scheduled, ...]) -> bool:
    """V1's ``_is_uniform_decode`` (gpu_model_runner.py:3620-3637): every request
    schedules ``uniform_decode_query_len`` (1) token."""
    max_query_len = max(s.query_len for s in scheduled)
    return max_query_len == 1 and sum(s.query_len for s in scheduled) == max_query_len * len(scheduled)

class Buffers:
    """The runner's persistent buffers, and the SWA metadata builder's (what captured
    graphs read): sized for ``MAX_TOKENS`` tokens and ``MAX_REQS`` requests, as vLLM
    sizes them for ``max_num_batched_tokens`` / ``max_num_seqs``; each step writes its
    prefix, so a graph captured for ``n`` tokens reads the same addresses on every
    replay of ``n``."""

    def __init__(self) -> None:
        self.input_ids = torch.zeros(MAX_TOKENS, dtype=torch.long)
        self.positions = torch.zeros(MAX_TOKENS, dtype=torch.long)
        self.slot_mapping = torch.full((MAX_TOKENS,), PAD_SLOT_ID, dtype=torch.long)
        self.block_table = torch.zeros(MAX_REQS, MAX_BLOCKS, dtype=torch.int32)
        self.seq_lens = torch.zeros(MAX_REQS, dtype=torch.int32)
        self.query_start_loc = torch.zeros(MAX_REQS + 1, dtype=torch.int32)
        # DeepseekSparseSWAMetadataBuilder.__init__'s buffers (sparse_swa.py:497-546)
        self.token_to_req_indices = torch.zeros(MAX_TOKENS, dtype=torch.int32)
        self.is_valid_token = torch.zeros(MAX_TOKENS, dtype=torch.bool)
        self.swa_indices = torch.zeros(MAX_TOKENS, 1, WINDOW, dtype=torch.int32)
        self.swa_lens = torch.zeros(MAX_TOKENS, dtype=torch.int32)
        self.prefill_swa_indices = torch.zeros(MAX_TOKENS, 1, WINDOW, dtype=torch.int32)
        self.prefill_swa_lens = torch.zeros(MAX_TOKENS, dtype=torch.int32)

    def fill(self, batch: Batch, tokens: torch.Tensor | None) -> None:
        """The batch's inputs, block table, sequence lengths, query starts and slots, in
        place. Request ``r`` owns blocks ``1 + MAX_BLOCKS*r ...`` (block 0 is vLLM's
        null block); padded request rows get the null block, ``seq_len`` 0 and empty
        queries (``query_start_loc`` repeats the token count), as both runners pad
        them (gpu_model_runner.py:2302-2304, :5600-5602; input_batch.py:165-179).
        Padded token rows keep what the buffers held (vLLM does not clear them);
        ``tokens=None`` with a dummy batch: zero inputs (input_batch.py:182-183)."""
        n, r = batch.num_tokens, batch.num_reqs
        with torch.no_grad():
            if batch.dummy:
                self.input_ids[: batch.num_tokens_padded].zero_()
                self.positions[: batch.num_tokens_padded].zero_()
            else:
                self.input_ids[:n].copy_(tokens)
            self.block_table.fill_(NULL_BLOCK_ID)
            self.seq_lens.zero_()
            t = 0
            for i, s in enumerate(batch.scheduled):
                if not batch.dummy:
                    self.block_table[i] = torch.arange(MAX_BLOCKS, dtype=torch.int32) + 1 + MAX_BLOCKS * s.req
                    self.positions[t : t + s.query_len] = torch.arange(s.start, s.start + s.query_len)
                self.seq_lens[i] = s.start + s.query_len
                self.query_start_loc[i + 1] = t + s.query_len
                t += s.query_len
            self.query_start_loc[r + 1 :] = n
            self.slot_mapping.fill_(PAD_SLOT_ID)
            if not batch.dummy:
                pos = self.positions[:n]
                rows = torch.repeat_interleave(torch.arange(r), torch.tensor([s.query_len for s in batch.scheduled]))
                blocks = self.block_table.long()[rows, pos // SWA_BLOCK]
                self.slot_mapping[:n] = blocks * SWA_BLOCK + pos % SWA_BLOCK

def swa_indices_and_lens(buffers: Buffers, out_indices: torch.Tensor, out_lens: torch.Tensor, num_tokens: int,
                         token_offset: int) -> None:
    """vLLM's Triton ``_compute_swa_indices_and_lens_kernel`` (sparse_swa.py:1057-1132),
    in torch, for tokens ``token_offset ..`` (rows ``0 ..`` of the outputs): an invalid
    token (slot < 0) gets length 0 and a row of -1; a valid one the slots of its
    window ``[max(pos - (window - 1), 0), pos]`` and its length, -1 after (no image
    spans, no bounded replay: ``replay_start`` 0)."""
    width = out_indices.shape[-1]
    for row in range(num_tokens):
        token = row + token_offset
        out_indices[row].fill_(-1)
        if not bool(buffers.is_valid_token[token]):
            out_lens[row] = 0
            continue
        req = int(buffers.token_to_req_indices[token])
        query_start, query_end = int(buffers.query_start_loc[req]), int(buffers.query_start_loc[req + 1])
        pos = int(buffers.seq_lens[req]) - (query_end - query_start) + token - query_start
        window = torch.arange(max(pos - (WINDOW - 1), 0), pos + 1)[:width]
        blocks = buffers.block_table.long()[req, window // SWA_BLOCK]
        out_indices[row, 0, : len(window)] = (blocks * SWA_BLOCK + window % SWA_BLOCK).to(torch.int32)
        out_lens[row] = len(window)

def resolved_cudagraph_mode(vc: Any, mode: Any) -> Any:
    """The ``cudagraph_mode`` vLLM runs DeepSeek V4 with when ``mode`` is configured:
    its own ``resolve_cudagraph_mode_and_sizes`` (compilation.py:1376-1418), given the
    least CUDA-graph support of the metadata builders of DeepSeek V4's layer kinds
    (each builder's own ``get_cudagraph_support``): the SWA cache's, the compressed
    attention's, the compressor's and the indexer's (ratio 4). The indexer supports
    mixed batches only with varlen paged MQA logits (SM100 with DeepGEMM,
    indexer.py:930-997); elsewhere, and so here, FULL resolves to FULL_DECODE_ONLY:
    uniform decode batches replay FULL graphs, every other batch runs eagerly.
    PIECEWISE stays PIECEWISE."""
    from vllm.models.deepseek_v4.compressor import CompressorMetadataBuilder
    from vllm.models.deepseek_v4.nvidia.flashmla import DeepseekSparseSWAFlashMLAMetadataBuilder
    from vllm.models.deepseek_v4.sparse_mla import DeepseekV4FlashMLAMetadataBuilder
    from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerMetadataBuilder

    builders = (DeepseekSparseSWAFlashMLAMetadataBuilder, DeepseekV4FlashMLAMetadataBuilder, CompressorMetadataBuilder,
                DeepseekV32IndexerMetadataBuilder)
    support = min((b.get_cudagraph_support(vc, None) for b in builders), key=lambda s: s.value)
    cc = vc.compilation_config
    saved = cc.cudagraph_mode
    try:
        return cc.resolve_cudagraph_mode_and_sizes(support, "DeepSeek V4", uniform_decode_query_len=1,
                                                   max_num_reqs=MAX_REQS)
    finally:
        cc.cudagraph_mode = saved

class ReproducedLoop:
    """A model runner's capture and step loop, reproduced; see the module docstring."""

    def __init__(self, spec: RunSpec, graphs: bool = True):
        from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
        from vllm.config import CUDAGraphMode as VllmMode

        self.spec = spec
        self.steps = workload(spec)
        self.model, self.vc = build_model(spec.runner, spec.layers, spec.seed, spec.eager_region)
        self.buffers = Buffers()
        self.caches = self._bind_caches()
        self.mode = VllmMode[spec.mode.value] if graphs else VllmMode.NONE
        self.dispatcher = self._dispatcher()
        # V1 wraps for PIECEWISE dispatch only (gpu_model_runner.py:5139); V2 for any
        # non-NONE mode (cudagraph_utils.py:570). FULL: see the module docstring.
        runtime_mode = VllmMode.PIECEWISE if spec.runner is Runner.V1 and self.mode is VllmMode.PIECEWISE else None
        self.wrapper = BreakableCUDAGraphWrapper(self.model, self.vc, runtime_mode=runtime_mode)
        self.prompts = prompts(self.steps, spec.seed)

    def _dispatcher(self) -> Any:
        """vLLM's ``CudagraphDispatcher`` over the spec's capture sizes, with its keys
        for the resolved mode (``initialize_cudagraph_keys``): what picks each step's
        graph. The sizes are set as a user's ``compilation_config`` sets them, then
        ``post_init_cudagraph_sizes`` (compilation.py:1136) checks them."""
        from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

        cc = self.vc.compilation_config
        cc.cudagraph_capture_sizes = sorted(self.spec.capture_sizes)
        cc.max_cudagraph_capture_size = max(self.spec.capture_sizes)
        cc.cudagraph_mode = self.mode
        cc.post_init_cudagraph_sizes()
        self.cudagraph_mode = resolved_cudagraph_mode(self.vc, self.mode)
        with runner_env(self.spec.runner):
            dispatcher = CudagraphDispatcher(self.vc)
        dispatcher.initialize_cudagraph_keys(self.cudagraph_mode, uniform_decode_query_len=1)
        return dispatcher

    def _bind_caches(self) -> list[tuple[str, torch.Tensor]]:
        """Every layer's SWA cache (request ``r`` owns blocks ``1 + MAX_BLOCKS*r ...``,
        block 0 is the null block), the compressed layers' caches (``layers``), and
        the stand-in prefill of each request's positions before its first step."""
        caches = []
        requests = 1 + max(s.req for step in self.steps for s in step)
        blocks = 1 + MAX_BLOCKS * requests
        for i, layer in enumerate(self.model.layers):
            cache = torch.zeros(blocks, 1, SWA_BLOCK, 584, dtype=torch.uint8)
            layer.attn.swa_cache_layer.bind_kv_cache(cache)
            caches.append((f"kv_cache.layers.{i}.swa", layer.attn.swa_cache_layer.kv_cache))
        first: dict[int, int] = {}
        for step in self.steps:
            for s in step:
                first.setdefault(s.req, s.start)
        layer_caches = vllm_layers.LayerCaches(self.model, requests, self.vc.model_config.max_model_len)
        swa_table = 1 + torch.arange(requests * MAX_BLOCKS, dtype=torch.int32).view(requests, MAX_BLOCKS)
        swa = [(c.view(c.shape[0], -1), swa_table) for _, c in caches]
        layer_caches.prefill([first[r] for r in range(requests)], swa, SWA_BLOCK, WINDOW, self.spec.seed)
        self.layer_metadata = vllm_layers.LayerMetadata(layer_caches, self.vc)
        return caches + layer_caches.named

    # -- the runners' rules for a batch
    def _full(self, mode: Any) -> bool:
        return mode.name == "FULL"

    def step_batch(self, scheduled: tuple[Scheduled, ...]) -> tuple[Batch, Any, Any]:
        """A real step: dispatch, then the batch as the runner pads it, with the runtime
        mode and batch descriptor.

        Both runners dispatch with vLLM's ``CudagraphDispatcher`` (V1's
        ``_determine_batch_execution_and_padding``, gpu_model_runner.py:3684-3740, with
        ``uniform_decode`` from ``_is_uniform_decode``); V2's ``ModelCudaGraphManager``
        (cudagraph_utils.py:256-395, 523-553) picks the same graph for these modes:
        the smallest capture size >= the token count, eager above the largest.
        Metadata: FULL is built over the padded counts, PIECEWISE and eager over the
        real ones (V1: ``pad_attn``, gpu_model_runner.py:4047, 4108-4112; V2:
        ``prepare_attn``, model_states/default.py:179-186). Slot mapping: V1 spans the
        real tokens unless FULL (gpu_model_runner.py:4096-4104), V2 always spans the
        padded ones (``compute_slot_mappings``, gpu/model_runner.py:1609-1614)."""
        n = sum(s.query_len for s in scheduled)
        max_query_len = max(s.query_len for s in scheduled)
        mode, descriptor = self.dispatcher.dispatch(n, uniform_decode=uniform_decode(scheduled))
        full = self._full(mode)
        reqs_padded = descriptor.num_reqs if full and descriptor.num_reqs is not None else len(scheduled)
        batch = Batch(scheduled, descriptor.num_tokens, reqs_padded, max_query_len, padded_metadata=full,
                      padded_slots=full or self.spec.runner is Runner.V2)
        return batch, mode, descriptor

    def dummy_batch(self, descriptor: Any, mode: Any, warmup: bool) -> Batch:
        """A capture's (``warmup``: its warmup's) dummy batch of ``descriptor.num_tokens``
        tokens.

        V1's ``_dummy_run`` (gpu_model_runner.py:5519-5545): a uniform descriptor is
        one token per request; otherwise ``min(tokens, max_num_seqs)`` requests share
        the tokens, and ``max_query_len`` is the token count; ``seq_lens`` are
        ``max_query_len`` (:5658). V2's ``prepare_inputs_to_capture``
        (cudagraph_utils.py:827-844, ``InputBatch.make_dummy``, input_batch.py:152-170):
        ``min(tokens, max_num_reqs)`` requests, ``seq_len == query_len``, and
        ``max_query_len`` the token count for FULL, else the longest query. Metadata
        over the dummy's own counts (V1 pads them for FULL, :5689-5692; V2 builds them
        with mode NONE, :898), slots all ``PAD_SLOT_ID`` (V1 :5626-5628, V2
        ``get_dummy_slot_mappings``, block_table.py:262-271)."""
        tokens = descriptor.num_tokens
        uniform = bool(getattr(descriptor, "uniform", False))
        reqs = tokens if uniform else min(tokens, MAX_REQS)
        lens = [tokens // reqs] * reqs
        if self.spec.runner is Runner.V1:
            lens[-1] += tokens % reqs
            max_query_len = 1 if uniform else tokens
            starts = [max_query_len - q for q in lens]
        else:
            for i in range(tokens % reqs):
                lens[-1 - i] += 1
            max_query_len = 1 if uniform else tokens if self._full(mode) else max(lens)
            starts = [0] * reqs
        scheduled = tuple(Scheduled(-1, s, q) for s, q in zip(starts, lens))
        return Batch(scheduled, tokens, reqs, max_query_len, padded_metadata=self._full(mode), padded_slots=True,
                     dummy=True)

    # -- attention metadata, built by the runner (vLLM's builders are Triton kernels)
    def metadata(self, batch: Batch) -> dict[str, Any]:
        """One step's ``attn_metadata``: per layer, the SWA cache's metadata over the
        persistent buffers, and a fresh ``FlashMLASchedMeta`` (vLLM makes one per build).

        What ``DeepseekSparseSWAMetadataBuilder.build`` (sparse_swa.py:560-720) makes of
        the runner's ``CommonAttentionMetadata`` (``num_reqs`` / ``num_actual_tokens``
        padded or not, as ``batch`` says): the decode/prefill split by vLLM's own
        ``split_decodes_and_prefills``, ``is_valid_token = slot >= 0``, the token to
        request map (tokens past the real ones map to request 0,
        ``compute_token_to_req_indices``), the decode and prefill window indices, the
        prefill gather lengths (``_COMPUTE_PREFILL_METADATA_KERNEL``: query length plus
        up to ``window - 1`` tokens of prefix), and the tile-scheduler plan holders."""
        from vllm.third_party.flashmla.flash_mla_interface import FlashMLASchedMeta
        from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadata
        from vllm.v1.attention.backends.utils import split_decodes_and_prefills

        b = self.buffers
        num_reqs = batch.num_reqs_padded if batch.padded_metadata else batch.num_reqs
        num_tokens = batch.num_tokens_padded if batch.padded_metadata else batch.num_tokens
        num_slots = batch.num_tokens_padded if batch.padded_slots else batch.num_tokens
        qsl_cpu = b.query_start_loc[: num_reqs + 1].clone()
        common = types.SimpleNamespace(max_query_len=batch.max_query_len, num_reqs=num_reqs,
                                       num_actual_tokens=num_tokens, query_start_loc_cpu=qsl_cpu)
        num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens = split_decodes_and_prefills(
            common, decode_threshold=1)
        slot_mapping = b.slot_mapping[:num_slots]
        with torch.no_grad():
            torch.ge(slot_mapping, 0, out=b.is_valid_token[:num_slots])
            n = batch.num_tokens
            b.token_to_req_indices[: max(n, num_tokens)].zero_()
            lens = qsl_cpu[1:] - qsl_cpu[:-1]
            b.token_to_req_indices[:n] = torch.repeat_interleave(torch.arange(num_reqs, dtype=torch.int32), lens)[:n]
            if num_decode_tokens > 0:
                b.swa_lens[num_decode_tokens:] = 0
                swa_indices_and_lens(b, b.swa_indices, b.swa_lens, num_decode_tokens, 0)
            if num_prefill_tokens > 0:
                swa_indices_and_lens(b, b.prefill_swa_indices, b.prefill_swa_lens, num_prefill_tokens, num_decode_tokens)
        prefill: dict[str, Any] = {}
        if num_prefills > 0:
            seq_lens = b.seq_lens[num_decodes:num_reqs]
            query_lens = lens[num_decodes : num_decodes + num_prefills].to(torch.int32)
            prefix = seq_lens - query_lens
            prefill = dict(
                prefill_seq_lens=b.seq_lens[num_decodes:num_reqs], prefill_seq_lens_cpu=seq_lens.clone(),
                prefill_gather_lens=(query_lens + prefix.clamp(min=0, max=WINDOW - 1)).to(torch.int32),
                prefill_query_lens_cpu=query_lens, prefill_window_size=WINDOW,
                prefill_max_model_len=self.vc.model_config.max_model_len,
                prefill_max_num_batched_tokens=self.vc.scheduler_config.max_num_batched_tokens,
            )
        swa = DeepseekSparseSWAMetadata(
            block_table=b.block_table[:num_reqs], slot_mapping=slot_mapping, block_size=SWA_BLOCK,
            seq_lens=b.seq_lens[:num_reqs], query_start_loc=b.query_start_loc[: num_reqs + 1],
            query_start_loc_cpu=qsl_cpu, is_valid_token=b.is_valid_token[:num_slots],
            token_to_req_indices=b.token_to_req_indices[:num_tokens],
            decode_swa_indices=b.swa_indices[:num_decode_tokens], decode_swa_lens=b.swa_lens[:num_decode_tokens],
            decode_swa_width=WINDOW,
            prefill_swa_indices=b.prefill_swa_indices[:num_prefill_tokens] if num_prefill_tokens else None,
            prefill_swa_lens=b.prefill_swa_lens[:num_prefill_tokens] if num_prefill_tokens else None,
            num_decodes=num_decodes, num_prefills=num_prefills, num_decode_tokens=num_decode_tokens,
            num_prefill_tokens=num_prefill_tokens, max_decode_query_len=min(batch.max_query_len, 1),
            **({"tile_sched_swaonly": FlashMLASchedMeta(), "tile_sched_c4a": FlashMLASchedMeta(),
                "tile_sched_c128a": FlashMLASchedMeta()} if num_decode_tokens > 0 else {}), **prefill,
        )
        md = {layer.attn.swa_cache_layer.prefix: swa for layer in self.model.layers}
        # the compressed layers' (vllm_layers), by the same counts and split
        md.update(self.layer_metadata.build(b, [s.req for s in batch.scheduled], num_reqs, num_tokens, slot_mapping,
                                            (num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens),
                                            batch.max_query_len))
        return md

    def _forward(self, batch: Batch, attn_metadata: Any, mode: Any, descriptor: Any) -> torch.Tensor:
        from vllm.config import set_current_vllm_config
        from vllm.forward_context import set_forward_context

        from capturelint.adapters.vllm.bridge import real_rows

        n = batch.num_tokens_padded
        with set_current_vllm_config(self.vc), set_forward_context(attn_metadata, self.vc, num_tokens=n,
                                                                    cudagraph_runtime_mode=mode,
                                                                    batch_descriptor=descriptor), \
                real_rows(batch.num_tokens):
            return self.wrapper(input_ids=self.buffers.input_ids[:n], positions=self.buffers.positions[:n])

    def capture(self) -> None:
        """Warm up and capture every graph the dispatcher has a key for, largest first
        (``get_capture_descs``), as each runner does.

        V1 (``_warmup_and_capture``, gpu_model_runner.py:6523-6569): warmup(s) in mode
        NONE, then the capture, both building attention metadata only when
        ``force_attention = mode == FULL`` (:6536, :5637): a PIECEWISE graph is
        captured with ``attn_metadata=None``. V2 (``capture``, cudagraph_utils.py
        :465-486): a warmup in mode NONE, then a capture with fresh inputs, metadata
        always built (``prepare_inputs_to_capture``, :898)."""
        from vllm.config import CUDAGraphMode as VllmMode

        if self.mode is VllmMode.NONE:
            return
        v1 = self.spec.runner is Runner.V1
        warmups = 1  # V1: cudagraph_num_of_warmups, which VllmConfig sets to 1 with graphs on (config/vllm.py:2011)
        for mode, descriptors in self.dispatcher.get_capture_descs():
            with_metadata = not v1 or self._full(mode)
            for descriptor in descriptors:
                for _ in range(warmups):
                    batch = self.dummy_batch(descriptor, mode, warmup=True)
                    self.buffers.fill(batch, None)
                    self._forward(batch, self.metadata(batch) if with_metadata else None, VllmMode.NONE, None)
                batch = self.dummy_batch(descriptor, mode, warmup=False)
                self.buffers.fill(batch, None)
                self._forward(batch, self.metadata(batch) if with_metadata else None, mode, descriptor)

    def generate(self) -> torch.Tensor:
        """Capture, then the workload's steps; the logits of every real token of every
        step, concatenated (padded rows left out). Each request's next input is the
        greedy token of its last row."""
        self.capture()
        logits = []
        last: dict[int, int] = {}
        for scheduled in self.steps:
            batch, mode, descriptor = self.step_batch(scheduled)
            tokens = torch.cat([self.prompts[s.req][-s.query_len:] if s.req not in last else torch.tensor([last[s.req]])
                                for s in scheduled])
            self.buffers.fill(batch, tokens)
            out = self._forward(batch, self.metadata(batch), mode, descriptor)
            out = out[: batch.num_tokens].detach().clone()
            logits.append(out)
            ends = torch.cumsum(torch.tensor([s.query_len for s in scheduled]), 0) - 1
            for s, row in zip(scheduled, ends.tolist()):
                last[s.req] = int(out[row].argmax())
        return torch.cat(logits)

    def roots(self) -> dict[str, Any]:
        return {"model": self.model, "runner": self.buffers, "caches": self.caches}


__all__ = ["Batch", "Buffers", "ReproducedLoop", "resolved_cudagraph_mode", "swa_indices_and_lens", "uniform_decode"]
