"""vLLM's own model runners (V1 and V2) driving the tiny DeepSeek V4, on the CPU.

Where ``reproduced.ReproducedLoop`` reproduces the runners' capture conditions, this runs the
code that makes them: a real ``GPUModelRunner`` of Model Runner V1
(``v1/worker/gpu_model_runner.py``) or V2 (``v1/worker/gpu/model_runner.py``), built
through its ``__init__`` on the emulated CUDA device, with the tiny model of
``model.build_model`` as its model. It captures with its own ``capture_model``
and runs each step with its own ``execute_model`` and ``sample_tokens`` over hand-built
``SchedulerOutput`` objects: what vLLM's scheduler hands a runner for ``reproduced``'
serving workload (``schedule``: ``batch_sizes`` cycled over ``steps``). A request that
joins is a new request with its prompt whole (``num_scheduled_tokens`` its length), the
running ones decode one token (cached requests, their greedy token the runner's own
sample), and one that leaves is finished (``finished_req_ids``). vLLM's runner pads each
step to the capture sizes (``capture_sizes``) and dispatches it, with its own decode and
prefill split (its prefill path: ``flash_mla_sparse_fwd``, ``dequantize_and_gather_k_cache``
and ``combine_topk_swa_indices`` as ``cpu_shim`` binds them).

**Layer kinds.** All three (``layers``: ratio 1, ratio 4 with compressor and
indexer, ratio 128) run with vLLM's own KV cache plan and metadata builders. The long
requests (``workload.schedule``'s ``long_context``) arrive with
``num_computed_tokens = 125``, as after a prefix-cache hit of their context, and
``layers``' stand-in prefill has written that context into the caches vLLM
allocated, at the blocks each request owns (``_prefill``); their prompts cross the
ratio-4 and ratio-128 compressions (127) and their decodes the indexer's switch to its
real top-k (131). Tokens, prompts and stand-in are those of ``reproduced``, whose
hand-built metadata gives the same logits on the rows vLLM samples from (tried: equal to
the bit, the default workload, V1 and V2).

**vLLM's code, run as it is** (line numbers of vLLM 0.33.0). V1:

- ``GPUModelRunner.__init__`` (:479): its persistent buffers, ``InputBatch``,
  ``CudagraphDispatcher``, ``Sampler``;
- ``load_model(model=...)`` (:4967, the pre-loaded model branch): it wraps the model
  in ``BreakableCUDAGraphWrapper(runtime_mode=PIECEWISE)`` (:5130-5147, with
  ``VLLM_USE_BREAKABLE_CUDAGRAPH=1``);
- the KV cache: ``get_kv_cache_spec`` (:7081) from the attention layers (the SWA
  caches, ``DeepseekV4Attention``'s compressed cache, ``DeepseekV4IndexerCache``,
  ``CompressorStateCache``), ``resolve_kv_cache_layout``, ``get_global_kv_cache_groups``
  and ``get_kv_cache_configs`` (``v1/core/kv_cache_planning.py``: six groups at three
  layers, one per SWA cache, the compressed and indexer caches, the ratio-4 and the
  ratio-128 compressor states), then ``initialize_kv_cache`` (:6990): attention groups,
  ``_check_and_update_cudagraph_mode`` (the dispatcher's keys), the metadata builders
  (``DeepseekSparseSWAFlashMLAMetadataBuilder``, ``DeepseekV4FlashMLAMetadataBuilder``
  ``models/deepseek_v4/sparse_mla.py``, ``DeepseekV32IndexerMetadataBuilder``
  ``v1/attention/backends/mla/indexer.py``, ``CompressorMetadataBuilder``
  ``models/deepseek_v4/compressor.py``), ``allocate_kv_cache`` and ``bind_kv_cache``;
- capture: ``capture_model`` (:6417, ``graph_capture``'s side stream, ``freeze_gc``,
  ``set_cudagraph_capturing_enabled``) → ``_capture_cudagraphs`` (:6571) →
  ``_warmup_and_capture`` (:6523, ``force_attention = mode == FULL``) → ``_dummy_run``
  (:5447: ``_determine_batch_execution_and_padding`` and the dispatcher, the slot
  mappings filled with -1 at :5628, metadata only ``if force_attention or FULL`` at
  :5637, ``set_forward_context``);
- steps: ``execute_model`` (:3906: ``_update_states``, ``_prepare_inputs`` and its
  padding, the dispatcher, ``_build_attention_metadata`` with the builders above (the
  compressed slot mappings, ``get_compressed_slot_mapping``; the C128A decode indices,
  ``_build_c128a_metadata``; ``_get_c128_boundary``; the indexer's decode metadata),
  ``set_forward_context``, ``_model_forward``) and ``sample_tokens`` (:4270: the
  sampler, ``_bookkeeping_sync``).

V2 (``v1/worker/gpu/``):

- ``GPUModelRunner.__init__`` (``model_runner.py:200``: ``InputBuffers``, request
  states in ``StagedWriteTensor``/``UvaBuffer``), ``load_model(model=...)`` (:385: the
  model state, ``init_model_state``), ``initialize_kv_cache`` (:623: ``BlockTables``,
  attention groups and builders, the ``ModelCudaGraphManager``);
- capture: ``capture_model`` (:1086) → ``ModelCudaGraphManager.capture``
  (``cudagraph_utils.py:613``/:424: a warmup forward, then a fresh forward that
  captures, each with ``prepare_inputs_to_capture`` :827 → ``prepare_attn(...,
  for_capture=full_cudagraph)`` :898, ``model_states/default.py:167``, over dummy slot
  mappings ``block_table.py:262``), the breakable wrapper (``init_breakable_cg_runner``
  :570, ``run_pw_graph`` :578);
- steps: ``execute_model`` (:1764: ``add_requests``/``update_requests``,
  ``prepare_inputs`` :1388 with its Triton input kernels, ``prepare_attn`` :1595, the
  dispatcher :523, ``set_forward_context``) and ``sample_tokens`` (:2149: the Gumbel
  sampler, ``postprocess_sampled``).

**Stood in** (each because a CPU cannot run it as it is):

- nothing of vLLM's Triton kernels: vLLM disables Triton without a GPU driver, and
  they run **as they are** in Triton's interpreter (``kernels.interpreter``; ``INTERPRETED``).
  The metadata builders': ``_token_request_mapping_kernel``
  (``v1/attention/ops/metadata.py:43``), ``_compute_swa_indices_and_lens_kernel``
  (``sparse_swa.py:669``), ``CompressedSlotMappingKernel``
  (``v1/attention/backends/mla/compressor_utils.py``) and ``BuildC128ATopkMetadataKernel``
  (``sparse_mla.py``; under ``cpu_shim`` these two are ``kernels.compressed``'s
  references, which ``runner_context`` puts back to vLLM's own). V1's: ``_COMPUTE_SLOT_MAPPING_KERNEL``
  (``v1/worker/block_table.py:166``). V2's (what "Model Runner V2 requires Triton"
  means here): ``_apply_write_kernel`` (``gpu/buffer_utils.py``),
  ``_prepare_prefill_inputs_kernel``, ``_prepare_pos_seq_lens_kernel``,
  ``_combine_sampled_and_draft_tokens_kernel``, ``_get_num_sampled_and_rejected_kernel``,
  ``_post_update_kernel`` (``gpu/input_batch.py``), ``_gather_block_tables_kernel``,
  ``_compute_slot_mappings_kernel`` (``gpu/block_table.py``) and
  ``_gumbel_sample_kernel`` (``gpu/sample/gumbel.py``). They all run between graphs;
- V2's ``get_accelerator_view_from_cpu_tensor`` (``utils/torch_utils.py:905``, the UVA
  view of pinned host memory, ``_C.get_cuda_view_from_cpu_tensor``): raises on a CPU
  platform; on the emulated device, one memory, the view is the tensor itself;
- ``get_mla_metadata`` (``sparse_swa.py:944``): vLLM binds it to a function that
  raises when ``vllm._flashmla_C`` cannot load (``v1/attention/ops/flashmla.py:102``);
  the vendored interface's own ``get_mla_metadata`` (a fresh ``FlashMLASchedMeta``) is
  what it binds on a GPU;
- ``Sampler.greedy_sample`` (``v1/sample/sampler.py:303``): on ``CpuPlatform`` it calls
  ``_C.greedy_argmax``; the GPU branch (``argmax``) is taken;
- ``DeviceMemoryProfiler`` around ``load_model``'s load (:4989; V2's
  ``gpu/model_runner.py`` load_model too): it measures the
  device memory the weights took, for a log line, with two ``gc.collect()`` at each end
  (seconds in a process holding vLLM); it answers 0 here without collecting;
- ``torch.Event`` (the runner's ``transfer_event``, :889, recorded in ``_to_list``):
  CPU torch has no events; the emulated CUDA event is used;
  ``torch.accelerator.get_memory_info`` (``capture_model`` :6477): answers 0;
- configuration a CPU platform resets: the ``VllmConfig`` is built on ``CpuPlatform``,
  which turns CUDA graphs off; the runner's graph mode, capture sizes and one
  warmup (``config/vllm.py:2011``) are set on it, as a CUDA platform would, and the
  model configuration is ``model.hf_config``'s namespace with the fields the runner reads;
- the prefill of a long request's context (before 125) is ``layers``' stand-in, for its cost:
  vLLM's own chunked prefill of it does run here eagerly (tried, V1 and V2, chunks of
  30 tokens, with ``common/ops/cache_utils.py``'s ``dequantize_and_gather_k_cache`` and
  ``combine_topk_swa_indices`` interpreted and ``nvidia/flashmla.py``'s
  ``flash_mla_sparse_fwd`` bound to the vendored interface, whose
  ``_flashmla_C.sparse_prefill_fwd`` has a reference; below 129 tokens the indexer takes
  its short-context path and does not reach the CUDA-only ``cp_gather_indexer_k_quant_cache``,
  ``fp8_fp4_mqa_logits``, ``top_k_per_row_prefill``), but takes about 35 s a run, where
  a whole check takes 3-6 s; the block size, 256, is what a CUDA platform takes from
  the DeepSeek V4 backend (CpuPlatform leaves 16); the scheduler's KV cache manager:
  the blocks are handed out here, each request its own in every group; V2's
  ``profile_run`` (the worker's memory profiling) runs before its capture, as in an
  engine: it sizes the workspace the capture locks and a later prefill needs;
- the model's kernels: the compressed layers' compressor, indexer and attention kernels
  are ``kernels.compressed``' references, as under ``reproduced``;
- the model's vLLM interface: the tiny model answers ``forward(input_ids, positions,
  intermediate_tensors, inputs_embeds)`` with hidden states and ``compute_logits``.

FULL graphs are left to ``reproduced``. Both runners do capture and replay them here
(tried; replays equal eager), but each as a bare ``torch.cuda.CUDAGraph`` that keeps no
Python (V1: ``CUDAGraphWrapper``, ``compilation/cuda_graph.py``, around the breakable
wrapper; V2: ``torch.cuda.graph`` at ``cudagraph_utils.py:496``), which the checker
sees without a shadow step: CL101-CL103, CL105, CL107 and the invariants go unchecked.
Under V1, ``_dummy_run`` (:5863) indexes the capture run's output
(``hidden_states[logit_indices_device]``), a value the capture loop discards: CL110 does
not report it where the eager twin agrees (the poisoned value never reached the
result). DeepSeek V4 keeps the reproduction for FULL, which would lose those rules here;
the families run whole on these runners (``WholeModelLoop``, ``DRIVES_FULL``), which have
no reproduction, run their FULL graphs on these runners, checked by the bare-graph rules
(CL104, CL106, CL108-CL112) and the eager twin.

The model family's hooks (``MODEL_FIELDS``, ``BLOCK_SIZE``, ``DRIVES_FULL``, ``_workload``,
``_build``, ``_prefill``, ``_buffers``, ``_caches``) are DeepSeek V4's here;
``WholeModelLoop`` and each family's loop (``families``) override them for vLLM's own
model classes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import types
from typing import Any, Iterator

import torch

from capturelint.adapters.vllm import layers as vllm_layers
from capturelint.adapters.vllm.model import SWA_BLOCK, WINDOW, build_model
from capturelint.adapters.vllm.workload import RunSpec, prompts, schedule, workload
from capturelint.errors import CapturelintError
from capturelint.options import CUDAGraphMode, Runner
from capturelint.runtime import frames

frames.register_runtime_file(__file__)

# The vLLM modules whose Triton kernels run in Triton's interpreter (all run between
# graphs): the attention metadata builder's, and each runner's input preparation and sampler.
_BUILDERS = ("vllm.v1.attention.ops.metadata", "vllm.v1.attention.backends.mla.sparse_swa",
             # the compressed layers' builders: DeepseekV4FlashMLAMetadataBuilder (its C128A
             # kernel), the compressed slot mapping (its and the indexer builder's), the
             # indexer builder's
             "vllm.models.deepseek_v4.sparse_mla", "vllm.v1.attention.backends.mla.compressor_utils",
             "vllm.v1.attention.backends.mla.indexer")
INTERPRETED = {
    Runner.V1: ("vllm.v1.worker.block_table", *_BUILDERS),
    Runner.V2: ("vllm.v1.worker.gpu.buffer_utils", "vllm.v1.worker.gpu.input_batch",
                    "vllm.v1.worker.gpu.block_table", "vllm.v1.worker.gpu.sample.gumbel", *_BUILDERS),
}
RUNNERS = {Runner.V1: "vllm.v1.worker.gpu_model_runner", Runner.V2: "vllm.v1.worker.gpu.model_runner"}


# The RunSpec fields this runner honours; a field added to RunSpec (a new workload) is
# refused until the scheduler outputs here express it (``_unhonoured``). The workload is
# ``workload``'s serving workload (``capture_sizes``, ``batch_sizes``, ``steps``);
# ``batch`` is the speculative-decoding loops' (``runners.spec``), which this runner does not run.
HONOURED = frozenset({"runner", "mode", "eager_region", "layers", "steps", "seed", "capture_sizes", "batch_sizes"})


def _unhonoured(spec: RunSpec) -> list[str]:
    """The fields of ``spec`` set away from their defaults that this runner does not drive."""
    return [f.name for f in dataclasses.fields(spec)
            if f.name not in HONOURED and getattr(spec, f.name) != getattr(RunSpec(), f.name)]


def supports(runner: Runner, mode: CUDAGraphMode) -> bool:
    """Whether vLLM's own runner drives this configuration (PIECEWISE; see the module
    docstring for FULL)."""
    return mode is CUDAGraphMode.PIECEWISE


MODEL_FIELDS = dict(
    runner_type="generate", enable_prompt_embeds=False, is_multimodal_raw_input_only_model=False,
    is_mm_prefix_lm=False, uses_mrope=False, mrope_num_dims=0, supports_multimodal_inputs=False,
    is_encoder_decoder=False, logprobs_mode="raw_logprobs", use_fp64_gumbel=False, logits_processors=None,
    multimodal_config=None, uses_xdrope_dim=0, supports_kv_cache_grouping=False, rswa_window=None,
    model="capturelint/tiny-deepseek-v4", is_hybrid=False, is_attention_free=False, enable_trace_replay=False,
    return_sampling_mask=False, use_mla=True,
)


def _configure(vc: Any, spec: RunSpec, graphs: bool, fields: dict[str, Any] = MODEL_FIELDS,
               block_size: int = vllm_layers.COMPRESSED_BLOCK) -> None:
    """What a CUDA platform would have left in the configuration (see the module
    docstring); ``fields`` and ``block_size`` are the model family's."""
    from vllm.config import CompilationMode
    from vllm.config import CUDAGraphMode as VllmMode

    mc = vc.model_config
    for name, value in fields.items():
        setattr(mc, name, value)
    mc.original_max_model_len = mc.max_model_len
    hidden, vocab = mc.hf_config.hidden_size, mc.hf_config.vocab_size
    mc.get_inputs_embeds_size = lambda: hidden
    mc.get_vocab_size = lambda: vocab
    mc.get_sliding_window = lambda: None  # the model's windows are its layers' own (V2's model state reads it)
    mc.hf_text_config = mc.hf_config
    mc.hf_config.num_nextn_predict_layers = 0  # read by the SWA builder (transformers_utils/deepseek_v4_utils.py:18)
    # the block size a CUDA platform takes from the DeepSeek V4 backend's kernel block
    # sizes (sparse_mla.py get_supported_kernel_block_sizes: 256; platforms/interface.py);
    # CpuPlatform leaves 16, which gives the ratio-128 cache pages of zero entries
    vc.cache_config.block_size = block_size
    cc = vc.compilation_config
    cc.mode = CompilationMode.NONE
    cc.cudagraph_mode = VllmMode[spec.mode.value] if graphs else VllmMode.NONE
    cc.cudagraph_capture_sizes = sorted(spec.capture_sizes) if graphs else []
    cc.max_cudagraph_capture_size = max(spec.capture_sizes) if graphs else 0
    cc.cudagraph_num_of_warmups = 1
    vc.load_config.use_tqdm_on_load = False  # V1's capture progress bar (capturelint's stderr is its own)


class _VllmModel:
    """The vLLM model interface of the tiny model (``GPUModelRunner._model_forward`` and
    ``compute_logits``); mixed into its class, so modules and scopes stay as they are.
    Each step's logits are kept for the checker's numerical oracle."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, intermediate_tensors: Any = None,
                inputs_embeds: Any = None) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()
        self.logits_seen.append(logits.detach().clone())
        return logits


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


@contextlib.contextmanager
def runner_context(runner: Runner) -> Iterator[None]:
    """What vLLM's ``runner`` needs on a CPU beyond ``cpu_shim``, for the block (see the
    module docstring, "Stood in"). Enter it inside ``cpu_shim``."""
    from vllm.compilation import monitor
    from vllm.models.deepseek_v4 import sparse_mla
    from vllm.third_party.flashmla import flash_mla_interface
    from vllm.v1.attention.backends.mla import compressor_utils, sparse_swa
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker import gpu_model_runner, workspace

    from capturelint.adapters.vllm.install import Patches
    from capturelint.adapters.vllm.kernels.interpreter import interpret_modules

    patches = Patches()
    # capture_model leaves process-wide state behind: capturing disabled (monitor.py:98)
    # and the workspace locked (lock_workspace, :6508); other configurations capture after.
    patches.set(monitor, "cudagraph_capturing_enabled", monitor.cudagraph_capturing_enabled)
    was_locked = workspace._manager is not None and workspace._manager.is_locked()
    try:
        patches.set(torch, "Event", _event)
        patches.set(torch.accelerator, "get_memory_info", lambda *a, **k: (0, 0))
        patches.set(sparse_swa, "get_mla_metadata", flash_mla_interface.get_mla_metadata)
        patches.set(Sampler, "greedy_sample", staticmethod(_greedy_sample))
        patches.set(gpu_model_runner, "DeviceMemoryProfiler", _NoMemoryProfiler)
        # the builders' own kernels, interpreted, instead of cpu_shim's references
        # (kernels.compressed: what reproduced's hand-built metadata launches)
        patches.set(sparse_mla, "_BUILD_C128A_TOPK_METADATA_KERNEL", sparse_mla.BuildC128ATopkMetadataKernel())
        patches.set(compressor_utils, "_COMPRESSED_SLOT_MAPPING_KERNEL", compressor_utils.CompressedSlotMappingKernel())
        if runner is Runner.V2:
            from vllm.v1.worker.gpu import buffer_utils, cudagraph_utils, model_runner

            patches.set(model_runner, "DeviceMemoryProfiler", _NoMemoryProfiler)
            patches.set(buffer_utils, "get_accelerator_view_from_cpu_tensor", _uva_view)
            # V2's capture progress bar, which no setting turns off (capturelint's stderr is its own)
            patches.set(cudagraph_utils, "tqdm", functools.partial(cudagraph_utils.tqdm, disable=True))
        with _env("VLLM_USE_BREAKABLE_CUDAGRAPH", "1"), interpret_modules(INTERPRETED[runner]):
            yield
    finally:
        patches.undo()
        manager = workspace._manager
        if not was_locked and manager is not None and manager.is_locked():
            workspace.unlock_workspace()


class _NoMemoryProfiler:
    """``DeviceMemoryProfiler`` without its measurement: no memory consumed."""

    consumed_memory = 0

    def __init__(self, device: Any = None):
        pass

    def __enter__(self) -> "_NoMemoryProfiler":
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _uva_view(cpu: torch.Tensor) -> torch.Tensor:
    """The device's view of pinned host memory (``_C.get_cuda_view_from_cpu_tensor``):
    on the emulated device, one memory, the tensor itself."""
    return cpu


def _event(device: Any = None, **kwargs: Any) -> Any:
    return torch.cuda.Event(**kwargs)


def _greedy_sample(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(dim=-1).view(-1)  # sampler.py:306, the branch a GPU takes


class VllmRunnerLoop:
    """A real ``GPUModelRunner`` over the tiny model: ``capture`` and ``generate`` as
    ``reproduced.ReproducedLoop``'s, made by vLLM's code (see the module docstring)."""

    def __init__(self, spec: RunSpec, graphs: bool = True):
        import importlib

        from vllm.config import set_current_vllm_config

        if not (self.DRIVES_FULL or supports(spec.runner, spec.mode)):
            raise CapturelintError(f"vLLM's own runner is driven for PIECEWISE graphs only, not {spec.mode}")
        unhonoured = _unhonoured(spec)
        if unhonoured:
            raise CapturelintError(f"vLLM's own runner does not drive {', '.join(unhonoured)} yet; check with "
                                   "--vllm-runner-impl reproduced")
        GPUModelRunner = importlib.import_module(RUNNERS[spec.runner]).GPUModelRunner
        self.spec = spec
        self.steps = self._workload(spec)
        self.requests = 1 + max(s.req for step in self.steps for s in step)
        self.starts: dict[int, int] = {}  # each request's position when it joins
        for step in self.steps:
            for s in step:
                self.starts.setdefault(s.req, s.start)
        self.model, self.vc = self._build(spec)
        self.model.logits_seen = []
        _configure(self.vc, spec, graphs, self.MODEL_FIELDS, self.BLOCK_SIZE)
        with set_current_vllm_config(self.vc):
            self.runner = GPUModelRunner(self.vc, torch.device("cuda"))
            self.runner.load_model(model=self.model)
            self.runner.initialize_kv_cache(self._kv_cache_config())
        self._prefill()
        self.prompts = prompts(self.steps, spec.seed)  # ReproducedLoop's
        self.captured = False

    # The model family's hooks (``WholeModelLoop`` and the families' loops override them): the fields
    # of the model configuration the runner reads, the KV block size a CUDA platform takes
    # from the family's attention backend, the workload, the model, the stand-in prefill.
    MODEL_FIELDS = MODEL_FIELDS
    DRIVES_FULL = False  # FULL graphs: the reproduction's for DeepSeek V4 (module docstring), vLLM's for generic
    BLOCK_SIZE = vllm_layers.COMPRESSED_BLOCK

    def _workload(self, spec: RunSpec) -> list[Any]:
        return workload(spec)

    def _build(self, spec: RunSpec) -> tuple[Any, Any]:
        """The tiny DeepSeek V4 with the vLLM model interface (``_VllmModel``)."""
        model, vc = build_model(spec.runner, spec.layers, spec.seed, spec.eager_region)
        model.__class__ = type("TinyDeepseekV4ForVllm", (_VllmModel, type(model)), {})
        return model, vc

    def _kv_cache_config(self) -> Any:
        """vLLM's KV cache plan for the layers' specs: the engine core's steps
        (``v1/engine/core.py``), with memory for every request's full length (what the
        planner checks) and the null block."""
        from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
        from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
        from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs

        specs = self.runner.get_kv_cache_spec()
        layouts = [layout.name for layout in get_supported_kv_cache_layouts(get_current_attn_backends(self.vc))]
        resolve_kv_cache_layout(self.vc, [layouts], list(specs.values()))
        groups = get_global_kv_cache_groups(self.vc, [specs])
        max_len = self.vc.model_config.max_model_len
        end = max(s.start + s.query_len for step in self.steps for s in step)
        if end > max_len:
            raise CapturelintError(f"--steps {self.spec.steps} reach position {end}, past max_model_len {max_len}")
        # What the scheduler's KV cache manager would hand out: every request its own
        # blocks for its full length in every group, disjoint (the groups share one block
        # pool, and a tensor is shared by layers of different groups), block 0 the null block.
        self.block_ids: list[list[list[int]]] = [[] for _ in range(self.requests)]
        self.tables: dict[str, torch.Tensor] = {}  # layer name -> [requests, blocks]
        first = 1
        for group in groups:
            per_request = math.ceil(max_len / group.kv_cache_spec.block_size)
            for ids in self.block_ids:
                ids.append(list(range(first, first + per_request)))
                first += per_request
            table = torch.tensor([ids[-1] for ids in self.block_ids])
            self.tables.update(dict.fromkeys(group.layer_names, table))
        self.vc.cache_config.num_gpu_blocks_override = first
        memory = first * sum(spec.page_size_bytes for spec in specs.values())
        return get_kv_cache_configs(self.vc, [specs], [memory], groups)[0]

    def _prefill(self) -> None:
        """``layers``' stand-in prefill of each request's positions before it joins
        (a long request's context), into the caches vLLM allocated and bound, at the
        blocks each request owns: what a prefix cache hit of that context would leave
        there (the requests arrive with ``num_computed_tokens = start``)."""
        swa = []
        for layer in self.model.layers:
            cache = layer.attn.swa_cache_layer
            swa.append((cache.kv_cache.flatten(1), self.tables[cache.prefix]))
        # vllm_layers' stand-in takes one block table for the compressed caches (main and
        # indexer) and one for the state caches of each ratio: vLLM's plan puts each in one group
        compressed: list[torch.Tensor] = []
        states: dict[int, list[torch.Tensor]] = {}
        for attn in (layer.attn for layer in self.model.layers if layer.attn.compress_ratio > 1):
            compressed.append(self.tables[attn.prefix])
            compressors = [attn.compressor]
            if attn.indexer is not None:
                compressed.append(self.tables[attn.indexer.k_cache.prefix])
                compressors.append(attn.indexer.compressor)
            for compressor in compressors:
                states.setdefault(compressor.compress_ratio, []).append(self.tables[compressor.state_cache.prefix])
        shared = {"compressed": compressed, **{f"ratio-{r} compressor state": t for r, t in states.items()}}
        for name, tables in shared.items():
            if any(t is not tables[0] for t in tables):
                raise CapturelintError(f"vLLM's KV cache plan put the {name} caches of {self.spec.layers} layers in "
                                       "several groups; the stand-in prefill takes one block table for them: check "
                                       "fewer --layers")
        caches = vllm_layers.LayerCaches.bound(self.model, self.requests, compressed[0] if compressed else None,
                                               {ratio: tables[0] for ratio, tables in states.items()})
        caches.prefill([self.starts[r] for r in range(self.requests)], swa, SWA_BLOCK, WINDOW,
                       self.spec.seed)

    def capture(self) -> None:
        """vLLM's ``capture_model``: the dispatcher's capture descriptors, each warmed up
        and captured by ``_dummy_run``."""
        from vllm.config import set_current_vllm_config

        if self.captured:
            return
        self.captured = True
        with set_current_vllm_config(self.vc):
            if self.spec.runner is Runner.V2:
                # the worker's memory profiling before the capture (gpu_worker.py
                # determine_available_memory): its forward of max_num_batched_tokens without
                # metadata sizes the workspace the capture locks, which a later prefill
                # needs (flashmla.py _forward_prefill). V2's capture builds metadata for
                # its dummy batches, so it sizes nothing; V1's capture warms up without
                # metadata and sizes it itself, and V1's profile_run also runs a dummy
                # sampler that samples randomly (_C.fused_gumbel_argmax, no reference here)
                self.runner.profile_run()
            self.runner.capture_model()

    def _scheduled(self, step: int) -> Any:
        """The scheduler's output for ``step`` of the workload: the requests that join,
        their prompt whole (``num_computed_tokens`` their start: 0, or a long request's
        context, ``_prefill``); the running ones, one token each; those that left, finished."""
        from vllm.sampling_params import SamplingParams
        from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

        scheduled = self.steps[step]
        before = {s.req: s for s in self.steps[step - 1]} if step else {}
        ran = {r: sum(r in {s.req for s in st} for st in self.steps[:step]) for r in before}  # steps run so far
        new, decoding = [s for s in scheduled if s.req not in before], [s for s in scheduled if s.req in before]
        new_reqs = []
        for s in new:
            tokens = [0] * s.start + self.prompts[s.req].tolist()
            new_reqs.append(NewRequestData(
                req_id=_rid(s.req), prompt_token_ids=tokens, mm_features=[],
                sampling_params=SamplingParams(temperature=0.0, max_tokens=self.spec.steps), pooling_params=None,
                block_ids=tuple(self.block_ids[s.req]), num_computed_tokens=s.start, lora_request=None,
                prefill_token_ids=tokens))  # V2 reads these
        cached = CachedRequestData(req_ids=[_rid(s.req) for s in decoding], resumed_req_ids=set(), new_token_ids=[],
                                   all_token_ids={}, new_block_ids=[None] * len(decoding),
                                   num_computed_tokens=[s.start for s in decoding],
                                   num_output_tokens=[ran[s.req] for s in decoding])
        finished = {_rid(r) for r in before} - {_rid(s.req) for s in scheduled}
        return SchedulerOutput(scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached,
                               num_scheduled_tokens={_rid(s.req): s.query_len for s in scheduled},
                               total_num_scheduled_tokens=sum(s.query_len for s in scheduled),
                               scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
                               finished_req_ids=finished, free_encoder_mm_hashes=[])

    def generate(self) -> torch.Tensor:
        """Capture, then the workload's steps, each ``execute_model`` + ``sample_tokens``;
        the logits of each request's last token of every step (what vLLM samples from),
        concatenated, in the workload's order (decodes, then the requests that join)."""
        from vllm.config import set_current_vllm_config

        from capturelint.adapters.vllm.bridge import real_rows

        self.capture()
        self.model.logits_seen.clear()
        rows = []
        with set_current_vllm_config(self.vc):
            for step, scheduled in enumerate(self.steps):
                # a padded batch's padded rows are compared with nothing (vLLM discards them)
                with real_rows(sum(s.query_len for s in scheduled)):
                    output = self.runner.execute_model(self._scheduled(step))
                if output is None:
                    output = self.runner.sample_tokens(None)
                if hasattr(output, "get_output"):
                    output = output.get_output()
                logits = self.model.logits_seen[-1]
                rows.append(logits[[output.req_id_to_index[_rid(s.req)] for s in scheduled]])
        return torch.cat(rows)

    def roots(self) -> dict[str, Any]:
        """The model, the runner's persistent input buffers, the KV caches."""
        return {"model": self.model, "runner": self._buffers(), "caches": self._caches()}

    def _buffers(self) -> Any:
        """The runner's persistent input buffers."""
        r = self.runner
        if self.spec.runner is Runner.V1:
            buffers = types.SimpleNamespace(input_ids=r.input_ids.gpu, positions=r.positions, seq_lens=r.seq_lens,
                                            query_start_loc=r.query_start_loc.gpu,
                                            block_table=r.input_batch.block_table[0].block_table.gpu,
                                            slot_mapping=r.input_batch.block_table[0].slot_mapping.gpu)
        else:
            ib = r.input_buffers
            buffers = types.SimpleNamespace(input_ids=ib.input_ids, positions=ib.positions, seq_lens=ib.seq_lens,
                                            query_start_loc=ib.query_start_loc, slot_mappings=r.block_tables.slot_mappings)
        return buffers

    def _caches(self) -> list[tuple[str, Any]]:
        """The KV caches, by name."""
        caches = [(f"kv_cache.layers.{i}.swa", layer.attn.swa_cache_layer.kv_cache)
                  for i, layer in enumerate(self.model.layers)]
        for i, attn in enumerate(layer.attn for layer in self.model.layers):  # named as vllm_layers names them
            if attn.compress_ratio == 1:
                continue
            caches.append((f"kv_cache.layers.{i}.compressed", attn.kv_cache))
            caches.append((f"kv_cache.layers.{i}.compressor_state", attn.compressor.state_cache.kv_cache))
            if attn.indexer is not None:
                caches.append((f"kv_cache.layers.{i}.indexer", attn.indexer.k_cache.kv_cache))
                caches.append((f"kv_cache.layers.{i}.indexer_compressor_state",
                               attn.indexer.compressor.state_cache.kv_cache))
        return caches


class WholeModelLoop(VllmRunnerLoop):
    """vLLM's own runner over vLLM's own model class, run whole (the families of
    ``families``): FULL graphs on vLLM's runner too (``DRIVES_FULL``), the serving
    workload with every request fresh and prefilled by the runner itself (no stand-in
    prefill). A family gives ``_build`` (its model) and ``_caches`` (its layers' caches)."""

    DRIVES_FULL = True

    def _workload(self, spec: RunSpec) -> list[Any]:
        return schedule(spec.batch_sizes, spec.steps)  # every request fresh: no stand-in prefill

    def _prefill(self) -> None:
        """Every request is prefilled by the runner itself: nothing stands in."""


def _rid(req: int) -> str:
    return f"req{req}"


__all__ = ["INTERPRETED", "VllmRunnerLoop", "WholeModelLoop", "runner_context", "supports"]
