"""Model runners: turn a scheduled step into a (possibly replayed) forward and logits.

**The per-step flow** (both runners, as vLLM's ``execute_model``): the dispatcher picks
the runtime mode and the padded batch descriptor; the runner writes the step into its
persistent input buffers, padded to the descriptor's size; the metadata builders make
the step's attention metadata; the runner sets the forward context and calls the
``CUDAGraphWrapper`` around the model with views of the *same* persistent buffers every
step (``self.input_ids[:n]``), so a replay reads this step's inputs; logits are computed
outside the graph for each request's last token.

**Capture** (``capture_model``) runs before generation, for every descriptor the
dispatcher can return, largest first: a warm-up run in eager mode, then a run in the
graph's mode, which the wrapper captures on first sight. What the two runners feed that
capture is the whole difference between them:

- ``ModelRunnerV1`` (legacy): persistent input buffers refreshed in place, metadata
  tensors are views of them. A PIECEWISE capture is a dummy run **without attention
  metadata** (``attn_metadata=None``); a FULL capture forces metadata to be built (from
  a dummy batch whose slots are all ``-1``). ``fresh_metadata=True`` makes its builders
  allocate new metadata tensors every step.
- ``ModelRunnerV2``: input buffers and the block table persistent; metadata builders
  own persistent buffers and write every step into them. Capture always builds real
  metadata, for PIECEWISE too, and rebuilds it between warm-up and capture.

**Naming state.** ``named_state_tensors()`` lists every tensor that exists before a step
begins (parameters, runner buffers, builder buffers, KV caches) with a human name; the
checker uses it to say *which* tensor a finding is about.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar, Iterator

import torch

from capturelint.engine.config import EngineConfig, Runner
from capturelint.runtime.breakable import CUDAGraphWrapper
from capturelint.engine.dispatcher import CudagraphDispatcher
from capturelint.engine.dsv4.model import DeepseekV4ForCausalLM
from capturelint.runtime.forward_context import BatchDescriptor, CUDAGraphMode, set_forward_context
from capturelint.engine.kv_cache import KVCache
from capturelint.engine.metadata import (
    AttentionMetadata,
    AttentionMetadataBuilder,
    CacheKind,
    FreshMetadataBuilder,
    MetadataBuffers,
    PersistentMetadataBuilder,
    StepBatch,
    ViewMetadataBuilder,
    metadata_key,
    write_block_table,
)
from capturelint.engine.scheduler import SchedulerOutput

AttnMetadataDict = dict[str, AttentionMetadata]


@dataclasses.dataclass(frozen=True, eq=False)
class StepOutput:
    """What one forward produced: logits of each scheduled request's last token, and how
    the step ran (``descriptor`` is ``None`` for an eager step)."""

    logits: torch.Tensor
    runtime_mode: CUDAGraphMode
    descriptor: BatchDescriptor | None
    num_tokens: int
    num_padded: int


def make_step_batch(sched: SchedulerOutput, num_padded: int, block_size: int) -> StepBatch:
    """The host-side description of a scheduled step; request ``i`` gets block-table row ``i``."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    req_idx: list[int] = []
    logits_indices: list[int] = []
    for row, req in enumerate(sched.requests):
        for i, token in enumerate(req.token_ids):
            p = req.start_position + i
            input_ids.append(token)
            positions.append(p)
            slots.append(req.block_ids[p // block_size] * block_size + p % block_size)
            req_idx.append(row)
        logits_indices.append(len(input_ids) - 1)
    return StepBatch(
        num_tokens=len(input_ids),
        num_padded=num_padded,
        uniform_decode=sched.uniform_decode,
        input_ids=tuple(input_ids),
        positions=tuple(positions),
        slot_mapping=tuple(slots),
        req_idx=tuple(req_idx),
        block_table=tuple(r.block_ids for r in sched.requests),
        seq_lens=tuple(r.start_position + r.num_tokens for r in sched.requests),
        logits_indices=tuple(logits_indices),
    )


class ModelRunner(abc.ABC):
    """What both runners share: input buffers, dispatch, the graph wrapper, the step."""

    version: ClassVar[Runner]

    def __init__(self, config: EngineConfig, model: DeepseekV4ForCausalLM, kv_cache: KVCache, device: torch.device):
        self.config = config
        self.model = model
        self.kv_cache = kv_cache
        self.device = device
        self.block_size = config.block_size
        self.max_num_tokens = config.max_num_batched_tokens
        self.max_num_reqs = config.max_num_seqs
        self.max_blocks = config.blocks_per_request
        self.dispatcher = CudagraphDispatcher(config.cudagraph_mode, config.capture_sizes)
        self.input_ids = torch.zeros(self.max_num_tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(self.max_num_tokens, dtype=torch.int64, device=device)
        self.cudagraph_wrapper = CUDAGraphWrapper(model.model, config.graph_backend, config.break_outputs)
        self.cache_layout = model.model.cache_layout()
        self.cache_kinds = tuple(k for k in CacheKind if any(k in kinds for _, kinds in self.cache_layout))
        self.builders: dict[CacheKind, AttentionMetadataBuilder] = {}

    # ------------------------------------------------------------------ per step

    @torch.no_grad()
    def execute_model(self, sched: SchedulerOutput) -> StepOutput:
        """Run one scheduled step (graph replay where the dispatcher says so)."""
        mode, descriptor = self.dispatcher.dispatch(sched.num_tokens, sched.uniform_decode)
        graphed = mode is not CUDAGraphMode.NONE
        num_padded = descriptor.num_tokens if graphed else sched.num_tokens
        batch = make_step_batch(sched, num_padded, self.block_size)
        self._prepare_inputs(batch)
        attn_metadata = self.build_attn_metadata(batch)
        hidden = self._forward(batch, attn_metadata, mode, descriptor)
        index = torch.tensor(batch.logits_indices, dtype=torch.int64, device=self.device)
        logits = self.model.compute_logits(hidden[index])
        return StepOutput(logits, mode, descriptor if graphed else None, batch.num_tokens, num_padded)

    def _forward(
        self,
        batch: StepBatch,
        attn_metadata: AttnMetadataDict | None,
        mode: CUDAGraphMode,
        descriptor: BatchDescriptor | None,
    ) -> torch.Tensor:
        n = batch.num_padded
        with set_forward_context(attn_metadata, mode, descriptor):
            # Always views of the same persistent buffers: a replay reads them.
            return self.cudagraph_wrapper(self.input_ids[:n], self.positions[:n])

    def _write_inputs(self, batch: StepBatch) -> None:
        n = batch.num_padded
        self.input_ids[:n].copy_(torch.tensor(batch.padded(batch.input_ids, 0), device=self.device))
        self.positions[:n].copy_(torch.tensor(batch.padded(batch.positions, 0), device=self.device))

    @abc.abstractmethod
    def _prepare_inputs(self, batch: StepBatch) -> None:
        """Refresh the runner's persistent buffers in place for ``batch``."""

    def build_attn_metadata(self, batch: StepBatch) -> AttnMetadataDict:
        """One build per cache kind, shared by every layer's entry of that kind."""
        by_kind = {kind: self.builders[kind].build(batch) for kind in self.cache_kinds}
        return {
            metadata_key(prefix, kind): by_kind[kind] for prefix, kinds in self.cache_layout for kind in kinds
        }

    # ------------------------------------------------------------------ capture

    @torch.no_grad()
    def capture_model(self) -> None:
        """Capture every graph the dispatcher can ask for, largest size first."""
        for mode, descriptor in self.dispatcher.capture_descriptors():
            self._capture(mode, descriptor)

    @abc.abstractmethod
    def _capture(self, mode: CUDAGraphMode, descriptor: BatchDescriptor) -> None:
        """Warm up and capture one graph."""

    def _dummy_run(
        self,
        batch: StepBatch,
        mode: CUDAGraphMode,
        descriptor: BatchDescriptor | None,
        build_metadata: bool,
    ) -> torch.Tensor:
        """A forward on a dummy batch; with ``build_metadata=False`` the model sees
        ``attn_metadata=None`` and takes its profile-run branches."""
        self._prepare_inputs(batch)
        attn_metadata = self.build_attn_metadata(batch) if build_metadata else None
        return self._forward(batch, attn_metadata, mode, descriptor)

    # ------------------------------------------------------------------ introspection

    @property
    def num_graphs(self) -> int:
        return self.cudagraph_wrapper.num_graphs

    @property
    def num_eager_breaks(self) -> int:
        return self.cudagraph_wrapper.num_eager_breaks

    def named_state_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor that exists before a step begins, with its human name:
        parameters and model buffers (``model.layers.0.attn.wq_a.weight``,
        ``model.topk_indices_buffer``, ``lm_head.weight``), runner buffers
        (``runner.input_ids``), metadata builder buffers (``metadata.swa.slot_mapping``)
        and KV caches (``kv_cache.layers.0.swa``)."""
        yield from self.model.named_parameters()
        yield from self.model.named_buffers()
        yield from self._named_runner_buffers()
        for builder in self.builders.values():
            yield from builder.named_buffers()
        yield from self.kv_cache.named_tensors()

    def _named_runner_buffers(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield "runner.input_ids", self.input_ids
        yield "runner.positions", self.positions


class ModelRunnerV1(ModelRunner):
    """The legacy runner: metadata are views of runner buffers refreshed in place;
    PIECEWISE capture runs without attention metadata."""

    version = Runner.V1

    piecewise_capture_builds_metadata: ClassVar[bool] = False
    """vLLM's V1 captures PIECEWISE graphs in a dummy run without attention metadata
    (only FULL capture forces it). Setting this to True makes the PIECEWISE capture build
    metadata like a FULL one, which is what makes the narrow eager region correct: the
    switch that pins the mechanism behind the V1 + narrow failure."""

    def __init__(self, config: EngineConfig, model: DeepseekV4ForCausalLM, kv_cache: KVCache, device: torch.device):
        super().__init__(config, model, kv_cache, device)
        self.metadata_buffers = MetadataBuffers.allocate(self.max_num_tokens, self.max_num_reqs, self.max_blocks, device)
        for kind in self.cache_kinds:
            if config.fresh_metadata:
                self.builders[kind] = FreshMetadataBuilder(kind, self.max_num_reqs, self.max_blocks, device)
            else:
                self.builders[kind] = ViewMetadataBuilder(kind, self.metadata_buffers)

    def _prepare_inputs(self, batch: StepBatch) -> None:
        self._write_inputs(batch)
        self.metadata_buffers.write(batch)

    def capture_builds_metadata(self, mode: CUDAGraphMode) -> bool:
        """Whether the capture run of a ``mode`` graph gets attention metadata."""
        return mode is CUDAGraphMode.FULL or self.piecewise_capture_builds_metadata

    def _capture(self, mode: CUDAGraphMode, descriptor: BatchDescriptor) -> None:
        batch = StepBatch.dummy(descriptor.num_tokens, descriptor.uniform_decode)
        build = self.capture_builds_metadata(mode)
        self._dummy_run(batch, CUDAGraphMode.NONE, None, build)  # warm-up
        self._dummy_run(batch, mode, descriptor, build)  # the wrapper captures it

    def _named_runner_buffers(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from super()._named_runner_buffers()
        b = self.metadata_buffers
        yield "runner.slot_mapping", b.slot_mapping
        yield "runner.req_idx", b.req_idx
        yield "runner.block_table", b.block_table
        yield "runner.seq_lens", b.seq_lens


class ModelRunnerV2(ModelRunner):
    """Persistent inputs and block table; builders write persistent buffers; capture
    always builds real metadata."""

    version = Runner.V2

    def __init__(self, config: EngineConfig, model: DeepseekV4ForCausalLM, kv_cache: KVCache, device: torch.device):
        super().__init__(config, model, kv_cache, device)
        self.block_table = torch.zeros(self.max_num_reqs, self.max_blocks, dtype=torch.int64, device=device)
        for kind in self.cache_kinds:
            self.builders[kind] = PersistentMetadataBuilder(kind, self.max_num_tokens, self.block_table)

    def _prepare_inputs(self, batch: StepBatch) -> None:
        self._write_inputs(batch)
        write_block_table(self.block_table, batch)

    def _capture(self, mode: CUDAGraphMode, descriptor: BatchDescriptor) -> None:
        batch = StepBatch.dummy(descriptor.num_tokens, descriptor.uniform_decode)
        self._prepare_inputs(batch)
        attn_metadata = self.build_attn_metadata(batch)
        self._forward(batch, attn_metadata, CUDAGraphMode.NONE, None)  # warm-up
        # Rebuild between warm-up and capture: the warm-up may have consumed state, and
        # the capture must record reads of exactly the buffers later steps refresh.
        attn_metadata = self.build_attn_metadata(batch)
        self._forward(batch, attn_metadata, mode, descriptor)  # the wrapper captures it

    def _named_runner_buffers(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from super()._named_runner_buffers()
        yield "runner.block_table", self.block_table


RUNNERS: dict[Runner, type[ModelRunner]] = {Runner.V1: ModelRunnerV1, Runner.V2: ModelRunnerV2}

__all__ = ["ModelRunner", "ModelRunnerV1", "ModelRunnerV2", "RUNNERS", "StepOutput", "make_step_batch"]
