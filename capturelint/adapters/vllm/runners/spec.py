"""Speculative decoding on the tiny DeepSeek V4 (``check --engine vllm --spec mtp|dspark``):
the drafts vLLM 0.33.0 ships for DeepSeek V4, around vLLM's real attention, the verify
step, and each runner's draft capture.

**The step** (``SpecLoop``), ``k = SPEC_TOKENS`` drafts per request, greedy:

1. verify: the target on ``k + 1`` tokens per request (the last committed token and the
   ``k`` drafts, positions ``p .. p + k``), a uniform batch that the SWA metadata treats
   as decodes (``max_decode_query_len`` = 1 + k, ``v1/attention/backend.py:572-589``), so
   ``forward_mqa`` takes ``_forward_decode`` with one query per token and a causal window
   per token (``sparse_swa.py:1052`` ``_compute_swa_indices_and_lens_kernel``);
2. rejection sampling, greedy: drafts are accepted while each equals the target's argmax
   at the token before it; the target's argmax after the last accepted one is the bonus;
3. the method's draft step (``propose``).

Logits are computed outside the graphs (vLLM's ``compute_logits``); every model's
attention is vLLM's ``DeepseekV4FlashMLAAttention`` built through its ``__init__`` in the
target's ``VllmConfig``: a draft layer has ``layer_id >= num_hidden_layers``, so it is a
sliding-window layer (compress ratio 1, attention.py:235-241). Norms, the mHC
hyper-connections (TileLang kernels, absent from the tiny target too) and the heads are
ours; the embedding (and DSpark's LM head) is the target's, as vLLM aliases them.

**MTP** (``TinyMTP``, ``MTPLoop``): the module structure of ``DeepSeekV4MTP``
(``models/deepseek_v4/nvidia/mtp.py:303``): ``model.layers[str(L)]``, ``L =
num_hidden_layers`` (:217, :231-244), a ``DeepSeekV4MultiTokenPredictorLayer`` (:79) of
``enorm``/``hnorm``, ``e_proj``/``h_proj`` (vLLM's ``ReplicatedLinear``, :103-118), a
shared head and ``mtp_block``; forward mtp.py:150-210. Draft pass 1 runs over the
verified tokens with the target's hidden states ("draft prefill"); passes 2..k one token
per request with the draft's own hidden state.

- V1 (MTP's drafter is ``EagleProposer``, ``gpu_model_runner.py:649-650``, on
  ``v1/spec_decode/llm_base_proposer.py``): the drafter's model is wrapped like the
  target, ``BreakableCUDAGraphWrapper(runtime_mode=PIECEWISE)``
  (``gpu_model_runner.py:5144-5148``), and it dispatches PIECEWISE whether the target's
  mode is PIECEWISE or FULL (``initialize_cudagraph_keys``, :420-435), every pass, keyed
  by token count. Its capture is ``dummy_run`` under ``set_forward_context(None, ...)``
  (:1650): **no attention metadata**, like the target's PIECEWISE capture. It captures
  only while the target captures PIECEWISE graphs (``use_cudagraphs``,
  ``gpu_model_runner.py:5811-5821``), and a capture after the capture loop raises
  (``validate_cudagraph_capturing_enabled``, ``compilation/monitor.py:101-110``), so a V1
  FULL configuration here is vLLM's ``FULL_AND_PIECEWISE``: the target's FULL graph and
  the drafter's PIECEWISE graphs, captured without metadata.
- V2 (``v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py``, MTP's base):
  draft pass 1 is captured in the runner's mode (``prefill_cudagraph_manager``, :91-96;
  PIECEWISE through the breakable runner, :125-126) with metadata built at capture
  (``cudagraph_utils.py:88-98``); passes 2..k have FULL graphs when the mode is FULL and
  run eagerly otherwise ("PIECEWISE cudagraphs are not supported for draft decodes",
  :98-102).

**DSpark** (``TinyDSpark``, ``DSparkLoop``; V2 only, config/vllm.py:3110-3113): the
structure of ``DSparkDeepseekV4ForCausalLM`` (``nvidia/dspark.py:348``). One draft step
per verify: the target's aux hidden states through ``main_proj``/``main_norm``, every
draft layer's context KV of the verified tokens written by vLLM's own
``_insert_context_kv`` (dspark.py:281; rejected tokens are not written), then a block of
``N = k`` query tokens per request, the anchor (the bonus token) and mask tokens,
non-causal within the block (sparse_swa.py:1268-1330), then the base logits and the
sequential Markov bias. V2 graphs that whole step under FULL (dspark/speculator.py:20-21,
the context step recorded in the graph, dflash/speculator.py:190-206) and runs it
eagerly otherwise (dflash/speculator.py:156-160).

FULL graphs are the breakable wrapper under a FULL forward context, as in
``reproduced``. Each wrapper is named (``target``, ``mtp draft``, ``dspark draft``),
and the graphs in the report say which model they are.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from capturelint.adapters.vllm.model import (
    HIDDEN,
    PAD_SLOT_ID,
    SWA_BLOCK,
    VOCAB,
    WINDOW,
    DecoderLayer,
    RMSNorm,
    build_attention,
    build_model,
    default_dtype,
    force_region,
    randomize,
    runner_env,
    use_cpu_gemm,
)
from capturelint.adapters.vllm.workload import RunSpec
from capturelint.options import Runner
from capturelint.runtime import frames

frames.register_runtime_file(__file__)

SPEC_TOKENS = 2


class SharedHead(nn.Module):
    """The MTP layer's head: a norm and the vocabulary projection (mtp.py:136,
    ``deepseek_mtp.SharedHead``; ours, like the target's head)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = RMSNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False, dtype=torch.bfloat16)


class MTPLayer(nn.Module):
    """``DeepSeekV4MultiTokenPredictorLayer`` (mtp.py:79), without mHC (the target has none)."""

    def __init__(self, attn: nn.Module, prefix: str):
        from vllm.model_executor.layers.linear import ReplicatedLinear

        super().__init__()
        self.enorm = RMSNorm(HIDDEN)
        self.hnorm = RMSNorm(HIDDEN)
        self.e_proj = ReplicatedLinear(HIDDEN, HIDDEN, bias=False, return_bias=False, prefix=f"{prefix}.e_proj")
        self.h_proj = ReplicatedLinear(HIDDEN, HIDDEN, bias=False, return_bias=False, prefix=f"{prefix}.h_proj")
        self.shared_head = SharedHead()
        self.mtp_block = DecoderLayer(attn)

    def forward(self, positions: torch.Tensor, previous_hidden_states: torch.Tensor,
                inputs_embeds: torch.Tensor) -> torch.Tensor:
        """mtp.py:150-210: the embedding zeroed at position 0 (vLLM's fused enorm/hnorm
        kernel, ``fused_mtp_input_rmsnorm.py:6``), both normed, projected and summed,
        then the decoder layer."""
        inputs_embeds = torch.where(positions.unsqueeze(-1) == 0, 0, inputs_embeds)
        hidden = self.h_proj(self.hnorm(previous_hidden_states)) + self.e_proj(self.enorm(inputs_embeds))
        return self.mtp_block(positions, hidden)


class MTPPredictor(nn.Module):
    """``DeepSeekV4MultiTokenPredictor`` (mtp.py:213): one MTP layer at index
    ``num_hidden_layers``, the embedding shared with the target."""

    def __init__(self, index: int, layer: MTPLayer, embed: nn.Module):
        super().__init__()
        self.mtp_start_layer_idx = index
        self.layers = nn.ModuleDict({str(index): layer})
        self.embed_tokens = embed

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                previous_hidden_states: torch.Tensor) -> torch.Tensor:
        layer = self.layers[str(self.mtp_start_layer_idx)]
        return layer(positions, previous_hidden_states, self.embed_tokens(input_ids))


class TinyMTP(nn.Module):
    """``DeepSeekV4MTP`` (mtp.py:303): ``forward`` returns the hidden state (captured),
    ``compute_logits`` the draft logits (eager, outside the graph)."""

    def __init__(self, index: int, layer: MTPLayer, embed: nn.Module):
        super().__init__()
        self.model = MTPPredictor(index, layer, embed)

    @property
    def layer(self) -> MTPLayer:
        return self.model.layers[str(self.model.mtp_start_layer_idx)]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions, hidden_states)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        head = self.layer.shared_head
        return head.head(head.norm(hidden_states)).float()


def build_mtp(spec: RunSpec, vc: Any, embed: nn.Module) -> TinyMTP:
    """The MTP draft, its attention built by vLLM's ``__init__`` in the target's config."""
    from vllm.config import set_current_vllm_config

    index = spec.layers
    with runner_env(spec.runner), set_current_vllm_config(vc), default_dtype(torch.bfloat16):
        topk = torch.zeros(64, 16, dtype=torch.int32)  # the predictor's own buffer (mtp.py:221)
        attn = build_attention(vc, index, topk)
        draft = TinyMTP(index, MTPLayer(attn, f"model.layers.{index}"), embed)
    use_cpu_gemm(draft)
    randomize(draft.model.layers, spec.seed + 7)  # not the shared embedding
    draft.requires_grad_(False)
    force_region(attn, spec.eager_region)
    return draft


class MarkovHead(nn.Module):
    """DSpark's sequential transition bias (``DSparkMarkovHead``, qwen3_dspark.py:48):
    ``markov_w2(markov_w1[previous token])`` added to the next position's logits (ours)."""

    def __init__(self, rank: int = 16):
        super().__init__()
        self.markov_w1 = nn.Embedding(VOCAB, rank, dtype=torch.bfloat16)
        self.markov_w2 = nn.Linear(rank, VOCAB, bias=False, dtype=torch.bfloat16)

    def bias(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.markov_w2(self.markov_w1(token_ids)).float()


class DSparkModel(nn.Module):
    """``DSparkDeepseekV4Model`` (dspark.py:89), without mHC (the target has none):
    ``main_proj``/``main_norm`` over the target's aux hidden states, ``layers`` (keyed by
    their index, so module scopes are vLLM's prefixes ``model.layers.L+i``), the
    cross-layer ``context_wkv_proj`` (vLLM's ``MergedColumnParallelLinear``, :142-150),
    the final ``norm`` and the Markov head."""

    def __init__(self, first: int, attns: list[nn.Module], embed: nn.Module, num_aux: int):
        from vllm.model_executor.layers.linear import MergedColumnParallelLinear, ReplicatedLinear

        super().__init__()
        self.embed_tokens = embed  # shared with the target (dspark.py:108)
        self.main_proj = ReplicatedLinear(HIDDEN * num_aux, HIDDEN, bias=False, return_bias=False,
                                          prefix="model.main_proj")
        self.main_norm = RMSNorm(HIDDEN)
        self.layers = nn.ModuleDict({str(first + i): DecoderLayer(a) for i, a in enumerate(attns)})
        self.context_wkv_proj = MergedColumnParallelLinear(HIDDEN, [attns[0].head_dim] * len(attns), bias=False,
                                                           return_bias=False, prefix="model.context_wkv_proj",
                                                           disable_tp=True)
        self.norm = RMSNorm(HIDDEN)
        self.markov_head = MarkovHead()

    def store_context_kv(self, main_x: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """``precompute_and_store_context_kv`` (dspark.py:193-224): every layer's context KV
        from the same ``main_x`` (its ``wkv`` slice, its ``kv_norm``), written by vLLM's
        ``_insert_context_kv`` (:281) at the context slots (-1: not written)."""
        from vllm.models.deepseek_v4.nvidia.dspark import _insert_context_kv

        all_kv = self.context_wkv_proj(main_x).view(main_x.shape[0], len(self.layers), -1)
        for layer, kv in zip(self.layers.values(), all_kv.unbind(1)):
            _insert_context_kv(layer.attn, layer.attn.kv_norm(kv), positions, slot_mapping)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        for layer in self.layers.values():
            hidden = layer(positions, hidden)
        return hidden


class TinyDSpark(nn.Module):
    """``DSparkDeepseekV4ForCausalLM`` (dspark.py:348) and the draft step its speculator
    graphs whole under FULL (dspark/speculator.py:20-21, dflash/speculator.py:190-206 and
    :341-373): combine the target's aux hidden states, store the context KV, run the
    query block, then the base logits (the target's head, :418-420) and the sequential
    Markov sampling (``_sample_sequential``). Returns the biased logits ``[reqs, N, V]``."""

    def __init__(self, first: int, attns: list[nn.Module], embed: nn.Module, lm_head: nn.Module, num_aux: int):
        super().__init__()
        self.model = DSparkModel(first, attns, embed, num_aux)
        self.lm_head = lm_head  # shared with the target

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, aux_hidden_states: torch.Tensor,
                context_positions: torch.Tensor, context_slot_mapping: torch.Tensor, reqs: int) -> torch.Tensor:
        model = self.model
        model.store_context_kv(model.main_norm(model.main_proj(aux_hidden_states)), context_positions,
                               context_slot_mapping)
        hidden = model(input_ids, positions)
        base = self.lm_head(model.norm(hidden)).float().view(reqs, -1, VOCAB)
        previous = input_ids.view(reqs, -1)[:, 0]  # the anchor
        out = []
        for i in range(base.shape[1]):
            out.append(base[:, i] + model.markov_head.bias(previous))
            previous = out[-1].argmax(-1)
        return torch.stack(out, 1)


class AuxTarget(nn.Module):
    """The target's forward for DSpark: its final hidden state and, concatenated, the
    residual stream after each of its layers (DSpark's ``dspark_target_layer_ids``: all
    of them here), as vLLM's runner hands them to the speculator."""

    def __init__(self, stack: nn.Module):
        super().__init__()
        self.stack = stack

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.stack.embed(input_ids)
        aux = []
        for layer in self.stack.layers:
            hidden = layer(positions, hidden)
            aux.append(hidden)
        return torch.cat([self.stack.norm(hidden), *aux], -1)


class StepBuffers:
    """Persistent inputs of one forward shape (``reqs`` requests of ``query_len`` tokens):
    what its graphs read, refilled per step. ``hidden`` is the draft's input hidden state."""

    def __init__(self, reqs: int, query_len: int, block_table: torch.Tensor, hidden: bool = False,
                 noncausal_width: int | None = None):
        n = reqs * query_len
        self.reqs, self.query_len = reqs, query_len
        self.causal = noncausal_width is None
        width = WINDOW if noncausal_width is None else noncausal_width
        self.input_ids = torch.zeros(n, dtype=torch.long)
        self.positions = torch.zeros(n, dtype=torch.long)
        self.slot_mapping = torch.full((n,), PAD_SLOT_ID, dtype=torch.long)
        self.block_table = block_table
        self.seq_lens = torch.zeros(reqs, dtype=torch.int32)
        self.query_start_loc = torch.arange(0, n + 1, query_len, dtype=torch.int32)
        self.is_valid_token = torch.ones(n, dtype=torch.bool)
        self.token_to_req_indices = torch.arange(reqs, dtype=torch.int32).repeat_interleave(query_len)
        self.swa_indices = torch.full((n, 1, width), -1, dtype=torch.int32)
        self.swa_lens = torch.zeros(n, dtype=torch.int32)
        if hidden:
            self.hidden_states = torch.zeros(n, HIDDEN, dtype=torch.bfloat16)

    @property
    def num_tokens(self) -> int:
        return self.reqs * self.query_len

    def fill(self, tokens: torch.Tensor, positions: torch.Tensor | None, hidden: torch.Tensor | None = None) -> None:
        """Step inputs in place; ``positions`` per token (``None``: a dummy batch, every
        token at position 0 with slot -1). Each token's SWA indices are its own causal
        window (``_compute_swa_indices_and_lens_kernel``, sparse_swa.py:1052), or in a
        non-causal (DSpark) block the window before the block and the whole block
        (``ComputeDSparkNoncausalSWAIndicesKernel``, sparse_swa.py:1268-1330)."""
        with torch.no_grad():
            self.input_ids.copy_(tokens)
            pos = torch.zeros_like(self.positions) if positions is None else positions
            self.positions.copy_(pos)
            req = self.token_to_req_indices.long()
            self.seq_lens.copy_(pos.view(self.reqs, self.query_len)[:, -1] + 1)
            if positions is None:
                self.slot_mapping.fill_(PAD_SLOT_ID)
            else:
                self.slot_mapping.copy_(self.block_table.long()[req, pos // SWA_BLOCK] * SWA_BLOCK + pos % SWA_BLOCK)
            if self.causal:
                start, end = (pos - (WINDOW - 1)).clamp(min=0), pos
            else:
                block = pos.view(self.reqs, self.query_len)
                start = (block[:, :1] - WINDOW).clamp(min=0).expand_as(block).flatten()
                end = block[:, -1:].expand_as(block).flatten()
            window = start.unsqueeze(1) + torch.arange(self.swa_indices.shape[-1])
            valid = window <= end.unsqueeze(1)
            window = torch.where(valid, window, 0)
            slots = self.block_table.long()[req.unsqueeze(1), window // SWA_BLOCK] * SWA_BLOCK + window % SWA_BLOCK
            self.swa_indices[:, 0].copy_(torch.where(valid, slots, -1).to(torch.int32))
            self.swa_lens.copy_(valid.sum(1).to(torch.int32))
            if hidden is not None:
                self.hidden_states.copy_(hidden)

    def metadata(self, layers: list[nn.Module]) -> dict[str, Any]:
        """The SWA metadata of ``layers`` over these buffers: uniform decodes of
        ``query_len`` tokens, one fresh ``FlashMLASchedMeta`` per build (sparse_swa.py)."""
        from vllm.third_party.flashmla.flash_mla_interface import FlashMLASchedMeta
        from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadata

        swa = DeepseekSparseSWAMetadata(
            block_table=self.block_table, slot_mapping=self.slot_mapping, block_size=SWA_BLOCK,
            seq_lens=self.seq_lens, query_start_loc=self.query_start_loc,
            query_start_loc_cpu=self.query_start_loc.clone(), is_valid_token=self.is_valid_token,
            token_to_req_indices=self.token_to_req_indices, decode_swa_indices=self.swa_indices,
            decode_swa_lens=self.swa_lens, decode_swa_width=self.swa_indices.shape[-1], num_decodes=self.reqs,
            num_prefills=0,
            num_decode_tokens=self.num_tokens, num_prefill_tokens=0, max_decode_query_len=self.query_len,
            tile_sched_swaonly=FlashMLASchedMeta(),
        )
        return {attn.swa_cache_layer.prefix: swa for attn in layers}


class ContextBuffers:
    """DSpark's context inputs, persistent (what its FULL graph reads): the target's aux
    hidden states, and the verified tokens' positions and draft-cache slots."""

    def __init__(self, tokens: int, num_aux: int):
        self.aux_hidden_states = torch.zeros(tokens, HIDDEN * num_aux, dtype=torch.bfloat16)
        self.context_positions = torch.zeros(tokens, dtype=torch.long)
        self.context_slot_mapping = torch.full((tokens,), PAD_SLOT_ID, dtype=torch.long)

    def fill(self, aux: torch.Tensor | None, positions: torch.Tensor | None, slots: torch.Tensor | None) -> None:
        """``None``: a capture, which writes no context KV (dflash/speculator.py:175-176)."""
        with torch.no_grad():
            self.aux_hidden_states.copy_(0 if aux is None else aux)
            self.context_positions.copy_(0 if positions is None else positions)
            self.context_slot_mapping.copy_(PAD_SLOT_ID if slots is None else slots)


class SpecLoop:
    """The step loop of speculative decoding under one runner and mode (module
    docstring): the target's verify step, greedy rejection, then the method's draft step
    (``propose``); the interface of ``reproduced.ReproducedLoop`` (``generate``, ``capture``,
    ``roots``, ``model``)."""

    name = ""

    def __init__(self, spec: RunSpec, graphs: bool = True, k: int = SPEC_TOKENS):
        from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
        from vllm.config import CUDAGraphMode as VllmMode

        self.spec, self.k = spec, k
        self.model, self.vc = build_model(spec.runner, spec.layers, spec.seed, spec.eager_region)
        self.target_attns = [layer.attn for layer in self.model.layers]
        b = spec.batch
        self.block_table = torch.arange(b * 4, dtype=torch.int32).view(b, 4)
        self.verify = StepBuffers(b, k + 1, self.block_table)
        self.mode = VllmMode[spec.mode.value] if graphs else VllmMode.NONE
        self.v1 = spec.runner is Runner.V1
        self.draft, self.draft_attns = self.build_draft()
        self.caches = self._bind_caches(int(self.block_table.numel()))
        # The target as in reproduced.ReproducedLoop; its forward returns hidden states (logits
        # are computed outside the graph, as vLLM's compute_logits).
        target_rt = VllmMode.PIECEWISE if self.v1 and self.mode is VllmMode.PIECEWISE else None
        self.target = BreakableCUDAGraphWrapper(self.target_runnable(), self.vc, runtime_mode=target_rt)
        self.target._capturelint_name = "target"
        # V1 wraps the drafter for PIECEWISE (gpu_model_runner.py:5144-5148); V2's breakable runner takes any mode.
        self.drafter = BreakableCUDAGraphWrapper(self.draft, self.vc,
                                                 runtime_mode=VllmMode.PIECEWISE if self.v1 else None)
        self.drafter._capturelint_name = f"{self.name} draft"
        self.first_tokens = torch.randint(0, VOCAB, (b,), generator=torch.Generator().manual_seed(spec.seed + 1))

    # -- what a method says
    def build_draft(self) -> tuple[nn.Module, list[nn.Module]]:
        raise NotImplementedError

    def target_runnable(self) -> nn.Module:
        return self.model.model  # the decoder: embedding, layers, final norm

    def capture_draft(self) -> None:
        raise NotImplementedError

    def propose(self, target_out: torch.Tensor, greedy: torch.Tensor, accepted: torch.Tensor,
                positions: torch.Tensor, pos: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The draft step after a verify: the draft's logits and the ``k`` drafts."""
        raise NotImplementedError

    def _bind_caches(self, blocks: int) -> list[tuple[str, torch.Tensor]]:
        caches = []
        for attn in self.target_attns + self.draft_attns:
            attn.swa_cache_layer.bind_kv_cache(torch.zeros(blocks, 1, SWA_BLOCK, 584, dtype=torch.uint8))
            caches.append((f"kv_cache.{attn.prefix}.swa", attn.swa_cache_layer.kv_cache))
        return caches

    def _forward(self, wrapper: Any, buffers: StepBuffers, attn_metadata: Any, mode: Any,
                 **inputs: Any) -> torch.Tensor:
        from vllm.config import CUDAGraphMode as VllmMode
        from vllm.config import set_current_vllm_config
        from vllm.forward_context import BatchDescriptor, set_forward_context

        n = buffers.num_tokens
        descriptor = None if mode is VllmMode.NONE else BatchDescriptor(
            num_tokens=n, num_reqs=buffers.reqs if mode is VllmMode.FULL else None, uniform=True)
        inputs.update(input_ids=buffers.input_ids, positions=buffers.positions)
        if hasattr(buffers, "hidden_states"):
            inputs["hidden_states"] = buffers.hidden_states
        with set_current_vllm_config(self.vc), set_forward_context(attn_metadata, self.vc, num_tokens=n,
                                                                    cudagraph_runtime_mode=mode,
                                                                    batch_descriptor=descriptor):
            return wrapper(**inputs).detach().clone()

    def _capture_one(self, wrapper: Any, buffers: StepBuffers, attns: list[nn.Module], mode: Any,
                     with_metadata: bool, **inputs: Any) -> None:
        """A warmup (mode NONE), then the capture, over a dummy batch (slots -1)."""
        from vllm.config import CUDAGraphMode as VllmMode

        buffers.fill(torch.zeros(buffers.num_tokens, dtype=torch.long), None,
                     torch.zeros(buffers.num_tokens, HIDDEN) if hasattr(buffers, "hidden_states") else None)
        for m in (VllmMode.NONE, mode):
            self._forward(wrapper, buffers, buffers.metadata(attns) if with_metadata else None, m, **inputs)

    def capture(self) -> None:
        """The capture loop: the verify shape for the target, then the draft's graphs
        its runner captures before serving (module docstring)."""
        from vllm.config import CUDAGraphMode as VllmMode

        if self.mode is VllmMode.NONE:
            return
        self._capture_one(self.target, self.verify, self.target_attns, self.mode,
                          with_metadata=not self.v1 or self.mode is VllmMode.FULL)
        self.capture_draft()

    def generate(self) -> torch.Tensor:
        """Capture, then ``steps`` speculative steps; per step the verify logits and the
        draft's logits, stacked."""
        self.capture()
        b, k = self.spec.batch, self.k
        last = self.first_tokens.clone()
        pos = torch.zeros(b, dtype=torch.long)
        drafts = torch.zeros(b, k, dtype=torch.long)
        rows = torch.arange(b)
        out = []
        for _ in range(self.spec.steps):
            # verify: the last committed token and the k drafts, causal within each request
            positions = (pos.unsqueeze(1) + torch.arange(k + 1)).flatten()
            self.verify.fill(torch.cat([last.unsqueeze(1), drafts], 1).flatten(), positions)
            target_out = self._forward(self.target, self.verify, self.verify.metadata(self.target_attns), self.mode)
            logits = self.model.lm_head(target_out[:, :HIDDEN]).float()
            # greedy rejection sampling: drafts accepted while each is the target's
            # argmax before it; the argmax after the last accepted one is the bonus token
            greedy = logits.argmax(-1).view(b, k + 1)
            accepted = (drafts == greedy[:, :k]).long().cumprod(1).sum(1)
            last, pos = greedy[rows, accepted], pos + accepted + 1
            draft_logits, drafts = self.propose(target_out, greedy, accepted, positions, pos)
            out.append(torch.cat([logits, *draft_logits]))
        return torch.stack(out)

    def roots(self) -> dict[str, Any]:
        return {"model": self.model, "draft": self.draft, "runner": self.verify, "caches": self.caches}


class MTPLoop(SpecLoop):
    """``--spec mtp``: draft pass 1 over the verified tokens, passes 2..k one token per
    request (module docstring)."""

    name = "mtp"

    def build_draft(self) -> tuple[nn.Module, list[nn.Module]]:
        draft = build_mtp(self.spec, self.vc, self.model.model.embed)
        b, k = self.spec.batch, self.k
        self.draft_first = StepBuffers(b, k + 1, self.block_table, hidden=True)
        self.draft_next = StepBuffers(b, 1, self.block_table, hidden=True)
        return draft, [draft.layer.mtp_block.attn]

    def _draft_mode(self, first: bool) -> Any:
        from vllm.config import CUDAGraphMode as VllmMode

        if self.mode is VllmMode.NONE or self.v1:
            return VllmMode.NONE if self.mode is VllmMode.NONE else VllmMode.PIECEWISE
        return self.mode if first or self.mode is VllmMode.FULL else VllmMode.NONE

    def capture_draft(self) -> None:
        from vllm.config import CUDAGraphMode as VllmMode

        if self.v1:  # the drafter's dummy_run: no metadata (llm_base_proposer.py:1650)
            for buffers in (self.draft_first, self.draft_next):
                self._capture_one(self.drafter, buffers, self.draft_attns, VllmMode.PIECEWISE, with_metadata=False)
            return
        self._capture_one(self.drafter, self.draft_first, self.draft_attns, self.mode, with_metadata=True)
        if self.k > 1 and self._draft_mode(first=False) is not VllmMode.NONE:
            self._capture_one(self.drafter, self.draft_next, self.draft_attns, self.mode, with_metadata=True)

    def propose(self, target_out: torch.Tensor, greedy: torch.Tensor, accepted: torch.Tensor,
                positions: torch.Tensor, pos: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        b, k = self.spec.batch, self.k
        # pass 1 over the verified tokens (each the target's argmax after it), with the target's hidden states
        self.draft_first.fill(greedy.flatten(), positions, target_out)
        h = self._forward(self.drafter, self.draft_first, self.draft_first.metadata(self.draft_attns),
                          self._draft_mode(first=True))
        logits = [self.draft.compute_logits(h)]
        sample = torch.arange(b) * (k + 1) + accepted  # the last accepted token's row
        h = h[sample]
        drafts = torch.zeros(b, k, dtype=torch.long)
        drafts[:, 0] = logits[-1][sample].argmax(-1)
        # passes 2..k, one token per request, with the draft's own hidden state
        for i in range(1, k):
            self.draft_next.fill(drafts[:, i - 1], pos + i - 1, h)
            h = self._forward(self.drafter, self.draft_next, self.draft_next.metadata(self.draft_attns),
                              self._draft_mode(first=False))
            logits.append(self.draft.compute_logits(h))
            drafts[:, i] = logits[-1].argmax(-1)
        return logits, drafts

    def roots(self) -> dict[str, Any]:
        return {**super().roots(), "drafter": self.draft_first, "drafter_next": self.draft_next}


class DSparkLoop(SpecLoop):
    """``--spec dspark`` (V2 only): one draft step of ``N = k`` query tokens per request,
    the anchor (the bonus token) and ``N - 1`` mask tokens, non-causal within the block
    (``sample_from_anchor``, dspark/speculator.py:5-13), after the context KV of the
    verified tokens. FULL graphs only: under PIECEWISE the draft runs eagerly
    (dflash/speculator.py:156-160)."""

    name = "dspark"
    layers = 2  # draft layers (vLLM's default is 3, dspark.py:106)
    mask_token = VOCAB - 1  # the block's noise token (parallel_drafting_token_id)

    def build_draft(self) -> tuple[nn.Module, list[nn.Module]]:
        from vllm.config import set_current_vllm_config
        from vllm.v1.attention.backends.mla.compressor_utils import get_dspark_swa_index_width

        spec, first = self.spec, self.spec.layers
        with runner_env(spec.runner), set_current_vllm_config(self.vc), default_dtype(torch.bfloat16):
            topk = torch.zeros(64, 16, dtype=torch.int32)  # the draft's own buffer (dspark.py:125)
            attns = [build_attention(self.vc, first + i, topk) for i in range(self.layers)]
            draft = TinyDSpark(first, attns, self.model.model.embed, self.model.lm_head, num_aux=spec.layers)
        use_cpu_gemm(draft)
        for i, (name, child) in enumerate(draft.model.named_children()):
            if name != "embed_tokens":  # the target's
                randomize(child, spec.seed + 11 + i)
        draft.requires_grad_(False)
        for attn in attns:
            force_region(attn, spec.eager_region)
        b, k = spec.batch, self.k
        self.query = StepBuffers(b, k, self.block_table, noncausal_width=get_dspark_swa_index_width(WINDOW, k))
        self.context = ContextBuffers(b * (k + 1), spec.layers)
        return draft, attns

    def target_runnable(self) -> nn.Module:
        return AuxTarget(self.model.model)

    def _inputs(self) -> dict[str, Any]:
        return {**vars(self.context), "reqs": self.spec.batch}

    def _draft_mode(self) -> Any:
        from vllm.config import CUDAGraphMode as VllmMode

        return VllmMode.FULL if self.mode is VllmMode.FULL else VllmMode.NONE

    def capture_draft(self) -> None:
        from vllm.config import CUDAGraphMode as VllmMode

        if self._draft_mode() is VllmMode.FULL:
            self.context.fill(None, None, None)
            self._capture_one(self.drafter, self.query, self.draft_attns, VllmMode.FULL, with_metadata=True,
                              **self._inputs())

    def propose(self, target_out: torch.Tensor, greedy: torch.Tensor, accepted: torch.Tensor,
                positions: torch.Tensor, pos: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        b, k = self.spec.batch, self.k
        # the context: every verified token's KV in the draft's layers, rejected ones not written
        rejected = torch.arange(k + 1).unsqueeze(0) > accepted.unsqueeze(1)
        slots = torch.where(rejected.flatten(), PAD_SLOT_ID, self.verify.slot_mapping)
        self.context.fill(target_out[:, HIDDEN:], positions, slots)
        # the query block: the anchor at the next position, then mask tokens
        anchor = greedy[torch.arange(b), accepted]
        ids = torch.full((b, k), self.mask_token, dtype=torch.long)
        ids[:, 0] = anchor
        self.query.fill(ids.flatten(), (pos.unsqueeze(1) + torch.arange(k)).flatten())
        logits = self._forward(self.drafter, self.query, self.query.metadata(self.draft_attns), self._draft_mode(),
                               **self._inputs())
        return [logits.flatten(0, 1)], logits.argmax(-1)

    def roots(self) -> dict[str, Any]:
        return {**super().roots(), "drafter": self.query, "context": self.context}


LOOPS = {"mtp": MTPLoop, "dspark": DSparkLoop}  # --spec method -> its step loop


__all__ = ["LOOPS", "SPEC_TOKENS", "DSparkLoop", "MTPLoop", "SpecLoop", "StepBuffers", "TinyDSpark", "TinyMTP",
           "build_mtp"]
