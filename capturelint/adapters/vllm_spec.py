"""Speculative decoding on the tiny DeepSeek V4 (``check --engine vllm --spec mtp``): an
MTP draft around vLLM's real attention, the verify step, and each runner's draft capture.

**The draft** (``TinyMTP``) has the module structure of vLLM's ``DeepSeekV4MTP``
(``models/deepseek_v4/nvidia/mtp.py:303``): ``model`` (the predictor, :213) holds
``layers[str(L)]`` with ``L = num_hidden_layers`` (:217, :231-244), a
``DeepSeekV4MultiTokenPredictorLayer`` (:79) of ``enorm``/``hnorm``, ``e_proj``/``h_proj``
(vLLM's own ``ReplicatedLinear``, :103-118), a ``shared_head`` (norm + head) and an
``mtp_block`` whose attention is vLLM's real ``DeepseekV4FlashMLAAttention`` with prefix
``model.layers.L.attn``. Built through its ``__init__`` in the target's ``VllmConfig``,
it is a sliding-window layer: ``layer_id >= num_hidden_layers`` gives compress ratio 1
(attention.py:235-241). Its forward is mtp.py:150-210: the embedding zeroed at position 0
and ``enorm``, ``hnorm`` of the target's hidden state, ``h_proj(h) + e_proj(e)``, the
decoder layer; ``compute_logits`` (:274-300) runs outside the graph. The embedding is
the target's (vLLM aliases it when loading the draft).

**The step** (``SpecRunner``), ``k = SPEC_TOKENS`` drafts per request, greedy:

1. verify: the target on ``k + 1`` tokens per request (the last committed token and the
   ``k`` drafts, positions ``p .. p + k``), a uniform batch that the SWA metadata treats
   as decodes (``max_decode_query_len`` = 1 + k, ``v1/attention/backend.py:572-589``), so
   ``forward_mqa`` takes ``_forward_decode`` with one query per token and a causal window
   per token (``sparse_swa.py:1052`` ``_compute_swa_indices_and_lens_kernel``);
2. rejection sampling, greedy: drafts are accepted while each equals the target's argmax
   at the token before it; the target's argmax after the last accepted one is the bonus;
3. draft pass 1 ("draft prefill"): the draft on the same ``k + 1`` tokens per request,
   each the target's argmax after it, with the target's hidden state; the row of the
   last accepted token gives draft 1;
4. draft passes 2..k: one token per request, the previous draft and the draft's own
   hidden state.

**The runners' draft graphs.**

- V1 (``v1/spec_decode/llm_base_proposer.py``): the drafter's model is wrapped like the
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

FULL graphs are the breakable wrapper under a FULL forward context, as in
``vllm_runners``. Each wrapper is named (``target``, ``mtp draft``), and the graphs in
the report say which model they are.

DSpark (``--spec dspark``) is not run: see ``vllm_plan.DSPARK_BLOCKER``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from capturelint.adapters.vllm_runners import (
    HIDDEN,
    PAD_SLOT_ID,
    SWA_BLOCK,
    VOCAB,
    WINDOW,
    DecoderLayer,
    RMSNorm,
    RunSpec,
    _default_dtype,
    _randomize,
    _runner_env,
    _use_cpu_gemm,
    build_attention,
    build_model,
    force_region,
)
from capturelint.options import Runner as RunnerName
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


def build_draft(spec: RunSpec, vc: Any, embed: nn.Module) -> TinyMTP:
    """The MTP draft, its attention built by vLLM's ``__init__`` in the target's config."""
    from vllm.config import set_current_vllm_config

    index = spec.layers
    with _runner_env(spec.runner), set_current_vllm_config(vc), _default_dtype(torch.bfloat16):
        topk = torch.zeros(64, 16, dtype=torch.int32)  # the predictor's own buffer (mtp.py:221)
        attn = build_attention(vc, index, topk)
        draft = TinyMTP(index, MTPLayer(attn, f"model.layers.{index}"), embed)
    _use_cpu_gemm(draft)
    _randomize(draft.model.layers, spec.seed + 7)  # not the shared embedding
    draft.requires_grad_(False)
    force_region(attn, spec.eager_region)
    return draft


class StepBuffers:
    """Persistent inputs of one forward shape (``reqs`` requests of ``query_len`` tokens):
    what its graphs read, refilled per step. ``hidden`` is the draft's input hidden state."""

    def __init__(self, reqs: int, query_len: int, block_table: torch.Tensor, hidden: bool = False):
        n = reqs * query_len
        self.reqs, self.query_len = reqs, query_len
        self.input_ids = torch.zeros(n, dtype=torch.long)
        self.positions = torch.zeros(n, dtype=torch.long)
        self.slot_mapping = torch.full((n,), PAD_SLOT_ID, dtype=torch.long)
        self.block_table = block_table
        self.seq_lens = torch.zeros(reqs, dtype=torch.int32)
        self.query_start_loc = torch.arange(0, n + 1, query_len, dtype=torch.int32)
        self.is_valid_token = torch.ones(n, dtype=torch.bool)
        self.token_to_req_indices = torch.arange(reqs, dtype=torch.int32).repeat_interleave(query_len)
        self.swa_indices = torch.full((n, 1, WINDOW), -1, dtype=torch.int32)
        self.swa_lens = torch.zeros(n, dtype=torch.int32)
        if hidden:
            self.hidden_states = torch.zeros(n, HIDDEN, dtype=torch.bfloat16)

    @property
    def num_tokens(self) -> int:
        return self.reqs * self.query_len

    def fill(self, tokens: torch.Tensor, positions: torch.Tensor | None, hidden: torch.Tensor | None = None) -> None:
        """Step inputs in place; ``positions`` per token (``None``: a dummy batch, every
        token at position 0 with slot -1). Each token's SWA indices are its own causal
        window (``_compute_swa_indices_and_lens_kernel``, sparse_swa.py:1052)."""
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
            start = (pos - (WINDOW - 1)).clamp(min=0)
            window = start.unsqueeze(1) + torch.arange(WINDOW)
            valid = window <= pos.unsqueeze(1)
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
            decode_swa_lens=self.swa_lens, decode_swa_width=WINDOW, num_decodes=self.reqs, num_prefills=0,
            num_decode_tokens=self.num_tokens, num_prefill_tokens=0, max_decode_query_len=self.query_len,
            tile_sched_swaonly=FlashMLASchedMeta(),
        )
        return {attn.swa_cache_layer.prefix: swa for attn in layers}


class SpecRunner:
    """The step loop of speculative decoding under one runner and mode (module
    docstring); the interface of ``vllm_runners.Runner`` (``generate``, ``capture``,
    ``roots``, ``model``)."""

    def __init__(self, spec: RunSpec, graphs: bool = True, k: int = SPEC_TOKENS):
        from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
        from vllm.config import CUDAGraphMode as VllmMode

        self.spec, self.k = spec, k
        self.model, self.vc = build_model(spec)
        self.draft = build_draft(spec, self.vc, self.model.model.embed)
        self.target_attns = [layer.attn for layer in self.model.layers]
        self.draft_attns = [self.draft.layer.mtp_block.attn]
        b = spec.batch
        block_table = torch.arange(b * 4, dtype=torch.int32).view(b, 4)
        self.verify = StepBuffers(b, k + 1, block_table)
        self.draft_first = StepBuffers(b, k + 1, block_table, hidden=True)
        self.draft_next = StepBuffers(b, 1, block_table, hidden=True)
        self.caches = self._bind_caches(int(block_table.numel()))
        self.mode = VllmMode[spec.mode.value] if graphs else VllmMode.NONE
        v1 = spec.runner is RunnerName.V1
        # The target as in vllm_runners.Runner; its forward returns the hidden state
        # (logits are computed outside the graph, as vLLM's compute_logits).
        target_rt = VllmMode.PIECEWISE if v1 and self.mode is VllmMode.PIECEWISE else None
        self.target = BreakableCUDAGraphWrapper(self.model.model, self.vc, runtime_mode=target_rt)
        self.target._capturelint_name = "target"
        # V1 wraps the drafter for PIECEWISE (gpu_model_runner.py:5144-5148); V2's breakable runner takes any mode.
        self.drafter = BreakableCUDAGraphWrapper(self.draft, self.vc, runtime_mode=VllmMode.PIECEWISE if v1 else None)
        self.drafter._capturelint_name = "mtp draft"
        self.gen = torch.Generator().manual_seed(spec.seed + 1)
        self.first_tokens = torch.randint(0, VOCAB, (b,), generator=self.gen)

    def _bind_caches(self, blocks: int) -> list[tuple[str, torch.Tensor]]:
        caches = []
        for name, attn in [(f"layers.{i}", a) for i, a in enumerate(self.target_attns)] + [
                (f"layers.{self.spec.layers}.mtp", self.draft_attns[0])]:
            attn.swa_cache_layer.bind_kv_cache(torch.zeros(blocks, 1, SWA_BLOCK, 584, dtype=torch.uint8))
            caches.append((f"kv_cache.{name}.swa", attn.swa_cache_layer.kv_cache))
        return caches

    # -- the modes each pass runs in (module docstring)
    def _draft_mode(self, first: bool) -> Any:
        from vllm.config import CUDAGraphMode as VllmMode

        if self.mode is VllmMode.NONE:
            return VllmMode.NONE
        if self.spec.runner is RunnerName.V1:
            return VllmMode.PIECEWISE
        return self.mode if first or self.mode is VllmMode.FULL else VllmMode.NONE

    def _forward(self, wrapper: Any, buffers: StepBuffers, attn_metadata: Any, mode: Any) -> torch.Tensor:
        from vllm.config import CUDAGraphMode as VllmMode
        from vllm.config import set_current_vllm_config
        from vllm.forward_context import BatchDescriptor, set_forward_context

        n = buffers.num_tokens
        descriptor = None if mode is VllmMode.NONE else BatchDescriptor(
            num_tokens=n, num_reqs=buffers.reqs if mode is VllmMode.FULL else None, uniform=True)
        kwargs = {"input_ids": buffers.input_ids, "positions": buffers.positions}
        if hasattr(buffers, "hidden_states"):
            kwargs["hidden_states"] = buffers.hidden_states
        with set_current_vllm_config(self.vc), set_forward_context(attn_metadata, self.vc, num_tokens=n,
                                                                    cudagraph_runtime_mode=mode,
                                                                    batch_descriptor=descriptor):
            return wrapper(**kwargs).detach().clone()

    def _capture_one(self, wrapper: Any, buffers: StepBuffers, attns: list[nn.Module], mode: Any,
                     with_metadata: bool) -> None:
        from vllm.config import CUDAGraphMode as VllmMode

        buffers.fill(torch.zeros(buffers.num_tokens, dtype=torch.long), None,
                     torch.zeros(buffers.num_tokens, HIDDEN) if hasattr(buffers, "hidden_states") else None)
        self._forward(wrapper, buffers, buffers.metadata(attns) if with_metadata else None, VllmMode.NONE)  # warmup
        self._forward(wrapper, buffers, buffers.metadata(attns) if with_metadata else None, mode)

    def capture(self) -> None:
        """The capture loop: the verify shape for the target, then the draft's graphs
        its runner captures before serving (module docstring)."""
        from vllm.config import CUDAGraphMode as VllmMode

        if self.mode is VllmMode.NONE:
            return
        v1 = self.spec.runner is RunnerName.V1
        self._capture_one(self.target, self.verify, self.target_attns, self.mode,
                          with_metadata=not v1 or self.mode is VllmMode.FULL)
        if v1:  # the drafter's dummy_run: no metadata (llm_base_proposer.py:1650)
            for buffers in (self.draft_first, self.draft_next):
                self._capture_one(self.drafter, buffers, self.draft_attns, VllmMode.PIECEWISE, with_metadata=False)
            return
        self._capture_one(self.drafter, self.draft_first, self.draft_attns, self.mode, with_metadata=True)
        if self.k > 1 and self._draft_mode(first=False) is not VllmMode.NONE:
            self._capture_one(self.drafter, self.draft_next, self.draft_attns, self.mode, with_metadata=True)

    def generate(self) -> torch.Tensor:
        """Capture, then ``steps`` speculative steps; per step the verify logits and
        every draft pass's logits, stacked."""
        self.capture()
        b, k = self.spec.batch, self.k
        last = self.first_tokens.clone()
        pos = torch.zeros(b, dtype=torch.long)
        drafts = torch.zeros(b, k, dtype=torch.long)
        offsets = torch.arange(k + 1)
        rows = torch.arange(b)
        out = []
        for _ in range(self.spec.steps):
            # 1. verify: the last committed token and the k drafts, causal within each request
            positions = (pos.unsqueeze(1) + offsets).flatten()
            self.verify.fill(torch.cat([last.unsqueeze(1), drafts], 1).flatten(), positions)
            hidden = self._forward(self.target, self.verify, self.verify.metadata(self.target_attns), self.mode)
            logits = self.model.lm_head(hidden).float()
            # 2. greedy rejection sampling: accepted drafts, then the bonus token
            greedy = logits.argmax(-1).view(b, k + 1)
            accepted = (drafts == greedy[:, :k]).long().cumprod(1).sum(1)
            last, pos = greedy[rows, accepted], pos + accepted + 1
            # 3. draft pass 1 over the verified tokens, with the target's hidden states
            self.draft_first.fill(greedy.flatten(), positions, hidden)
            h = self._forward(self.drafter, self.draft_first, self.draft_first.metadata(self.draft_attns),
                              self._draft_mode(first=True))
            step_logits = [logits, self.draft.compute_logits(h)]
            sample = rows * (k + 1) + accepted
            h = h[sample]
            drafts = drafts.clone()
            drafts[:, 0] = step_logits[-1][sample].argmax(-1)
            # 4. draft passes 2..k, one token per request
            for i in range(1, k):
                self.draft_next.fill(drafts[:, i - 1], pos + i - 1, h)
                h = self._forward(self.drafter, self.draft_next, self.draft_next.metadata(self.draft_attns),
                                  self._draft_mode(first=False))
                step_logits.append(self.draft.compute_logits(h))
                drafts[:, i] = step_logits[-1].argmax(-1)
            out.append(torch.cat(step_logits))
        return torch.stack(out)

    def roots(self) -> dict[str, Any]:
        return {"model": self.model, "draft": self.draft, "runner": self.verify, "drafter": self.draft_first,
                "drafter_next": self.draft_next, "caches": self.caches}


__all__ = ["SPEC_TOKENS", "SpecRunner", "StepBuffers", "TinyMTP",
           "build_draft"]
