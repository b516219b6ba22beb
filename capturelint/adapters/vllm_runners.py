"""A tiny DeepSeek V4 built from vLLM's real attention, and the two model runners'
capture conditions, reproduced.

**The model.** ``build_model`` makes ``TinyDeepseekV4``: an embedding, ``layers``
decoder layers and an LM head, each layer an RMSNorm and vLLM's own
``DeepseekV4FlashMLAAttention`` built through its real ``__init__`` (TP=1, a gloo world
of one), with random weights (seeded; no download). The norms, the embedding, the
residual stream and the head are plain torch of ours: what is checked is vLLM's
attention and its capture regions. The configuration is built in code (``hf_config``):
``sliding_window`` 8, 8 heads (FlashMLA pads them to 64), ``q_lora_rank`` 64,
``o_groups`` 2, head dim 512 (448 NoPE + 64 RoPE), fp8_ds_mla SWA cache.

Layer ``i`` has compress ratio 1, 4 or 128 in turn (``vllm_layers.layer_ratios``: the
default three layers are one sliding-window, one compressed-sparse layer with its
indexer, one heavily compressed layer); their caches, metadata and the stand-in
prefill of the context before the first step (decode starts at position 126, so the
steps cross each kind's boundaries) live in ``vllm_layers``, the kernels they reach in
``vllm_kernels_compressed``. The hooks here: ``build_model`` (the ratios and the
top-k buffer), ``_bind_caches`` and ``metadata``.

**The runners** (``Runner``), each a loop of uniform decode steps (every request adds
one token per step, prompt tokens first, then greedy tokens) over persistent input
buffers (``input_ids``, ``positions``, ``slot_mapping``, block table, SWA indices),
with the model wrapped by vLLM's ``BreakableCUDAGraphWrapper``:

- Model Runner V1 (``v1/worker/gpu_model_runner.py``): the model is wrapped with
  ``runtime_mode=PIECEWISE`` (:5130-5147). ``_warmup_and_capture`` (:6523) runs a
  warmup and then the capturing ``_dummy_run`` with ``force_attention = mode == FULL``
  (:6536): a PIECEWISE graph is captured **without attention metadata**
  (``attn_metadata=None``, :5637) and dummy slot mappings filled with -1 (:5628); a
  FULL graph is captured with metadata.
- Model Runner V2 (``v1/worker/gpu/cudagraph_utils.py``): ``capture`` (:424-486) runs
  a warmup (mode NONE) and then the capture, with metadata always built
  (``prepare_inputs_to_capture`` :827, ``prepare_attn`` :898) over the persistent
  buffers, whose slot mappings hold ``PAD_SLOT_ID`` (-1,
  ``block_table.py:262 get_dummy_slot_mappings``). The wrapper takes any non-NONE
  mode (``runtime_mode=None``, :570).

Both then run real steps under ``set_forward_context(attn_metadata, ...)`` with the
capture's batch descriptor, so each step replays. V1's FULL graphs are captured here
by the breakable wrapper under a FULL forward context (vLLM's FULL-mode bypass makes
the whole forward one captured segment), where vLLM's V1 uses ``CUDAGraphWrapper``:
the same ops in one graph.

The region: ``eager_region=None`` keeps vLLM's own choice (``_prepare_and_attn_eager``
under V1, ``_prepare_and_attn`` under V2, attention.py:323-328); ``narrow`` and
``wide`` force one on every layer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import types
from typing import Any, Iterator

import torch
from torch import nn

from capturelint.errors import CapturelintError
from capturelint.options import CUDAGraphMode, EagerRegion
from capturelint.options import Runner as RunnerName  # this module's Runner is the step loop
from capturelint.adapters import vllm_layers
from capturelint.runtime import frames

frames.register_runtime_file(__file__)

VOCAB = 96
HIDDEN = 256
HEADS = 8
WINDOW = 8
SWA_BLOCK = 64
PAD_SLOT_ID = -1
COMPRESS_TYPES = {1: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}


def hf_config(num_layers: int, ratios: tuple[int, ...] | None = None) -> types.SimpleNamespace:
    """The model's configuration, in the fields DeepSeek V4's ``__init__`` reads."""
    ratios = ratios or (1,) * num_layers
    return types.SimpleNamespace(
        hidden_size=HIDDEN, num_attention_heads=HEADS, q_lora_rank=64, o_lora_rank=64, head_dim=512,
        qk_rope_head_dim=64, o_groups=2, sliding_window=WINDOW, num_hidden_layers=num_layers,
        layer_types=[COMPRESS_TYPES[r] for r in ratios],
        compress_rates={"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
        rms_norm_eps=1e-6, max_position_embeddings=1024, rope_theta=10000.0, compress_rope_theta=160000.0,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
        index_topk=vllm_layers.INDEX_TOPK, index_n_heads=4, index_head_dim=128, model_type="deepseek_v4",
        architectures=["DeepseekV4ForCausalLM"], vocab_size=VOCAB,
    )


_distributed_ready = False


def vllm_config(num_layers: int, runner: RunnerName, ratios: tuple[int, ...] | None = None) -> Any:
    """A fresh ``VllmConfig`` (each build registers its layers by name in it)."""
    from vllm.config import VllmConfig

    vc = VllmConfig()
    mc = types.SimpleNamespace(hf_config=hf_config(num_layers, ratios), max_model_len=256, is_moe=False,
                               dtype=torch.bfloat16, runner=str(runner), sleep_mode_offload_cudagraph=False,
                               enable_sleep_mode=False)
    object.__setattr__(vc, "model_config", mc)
    # None trips an assert in the indexer's metadata builder (v1/attention/backends/mla/indexer.py:919).
    vc.attention_config.sparse_mla_prefill_workspace_factor = 5
    vc.scheduler_config.max_num_batched_tokens = vllm_layers.MAX_TOKENS
    vc.kernel_config.enable_jit_warmup = False  # Triton/CuTe JIT warmup registrations: no kernels to warm here
    return vc


def _ensure_distributed(vc: Any) -> None:
    """vLLM's layers need a model-parallel group: a gloo world of one, once per process."""
    global _distributed_ready
    if _distributed_ready:
        return
    from vllm.distributed import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        if not torch.distributed.is_initialized():
            # A world of one needs no rendezvous: an in-memory store, no file left behind
            # (vLLM's own init would make a FileStore of a ``file://`` method). vLLM
            # then takes the initialized world as it is.
            torch.distributed.init_process_group(backend="gloo", store=torch.distributed.HashStore(), world_size=1,
                                                 rank=0)
        ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, distributed_init_method="env://",
                                        backend="gloo")
        ps.initialize_model_parallel(1, 1)
    from vllm.v1.worker import workspace

    if workspace._manager is None:  # the runners make it in __init__ (gpu_model_runner.py)
        workspace.init_workspace_manager(torch.device("cpu"))
    _distributed_ready = True


@contextlib.contextmanager
def _runner_env(runner: RunnerName) -> Iterator[None]:
    """``VLLM_USE_V2_MODEL_RUNNER`` for the block: what selects the runner in
    ``VllmConfig.use_v2_model_runner`` (config/vllm.py:731-750); without Triton vLLM
    would otherwise choose V1."""
    saved = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner is RunnerName.V2 else "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
        else:
            os.environ["VLLM_USE_V2_MODEL_RUNNER"] = saved


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Parameters made in the block have ``dtype`` (vLLM's loader builds models so)."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(saved)


def build_attention(vc: Any, index: int, topk_buffer: torch.Tensor) -> nn.Module:
    """One ``DeepseekV4FlashMLAAttention``, through vLLM's real ``__init__``."""
    from vllm.models.deepseek_v4.nvidia.flashmla import DeepseekV4FlashMLAAttention

    return DeepseekV4FlashMLAAttention(vc, prefix=f"model.layers.{index}.attn", topk_indices_buffer=topk_buffer)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=torch.bfloat16))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x / sqrt(mean(x^2) + eps) * weight``, in float32 (the norms are ours, not vLLM's)."""
        xf = x.to(torch.float32)
        y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (y * self.weight.to(torch.float32)).to(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, attn: nn.Module):
        super().__init__()
        self.norm = RMSNorm(HIDDEN)
        self.attn = attn

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + self.attn(positions, self.norm(hidden))


class DecoderStack(nn.Module):
    def __init__(self, layers: list[nn.Module]):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN, dtype=torch.bfloat16)
        self.layers = nn.ModuleList(DecoderLayer(a) for a in layers)
        self.norm = RMSNorm(HIDDEN)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(input_ids)
        for layer in self.layers:
            hidden = layer(positions, hidden)
        return self.norm(hidden)


class TinyDeepseekV4(nn.Module):
    """Embedding, decoder layers around vLLM's attention, final norm, LM head. The
    decoder is ``model``, so module scopes are vLLM's layer prefixes
    (``model.layers.0.attn``)."""

    def __init__(self, layers: list[nn.Module]):
        super().__init__()
        self.model = DecoderStack(layers)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False, dtype=torch.bfloat16)

    @property
    def layers(self) -> nn.ModuleList:
        return self.model.layers

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model(input_ids, positions)).float()


def _use_cpu_gemm(model: nn.Module) -> None:
    """vLLM's linear layers on a CPU call ``layer.cpu_linear``, which weight loading
    sets (``dispatch_cpu_unquantized_gemm``); give them its fallback, ``F.linear``."""
    from vllm.model_executor.layers.linear import LinearBase

    for m in model.modules():
        if isinstance(m, LinearBase):
            m.cpu_linear = torch.nn.functional.linear


def _randomize(model: nn.Module, seed: int) -> None:
    """Random weights: vLLM allocates parameters uninitialised (the loader fills them)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight") or name.endswith("_norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("attn_sink"):
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                fan_in = p.shape[-1] if p.dim() > 1 else 1
                p.copy_(torch.randn(p.shape, generator=gen) / max(fan_in, 1) ** 0.5)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One configuration: runner, CUDA-graph mode, region (``per-runner``: vLLM's own
    choice), size, seed."""

    runner: RunnerName = RunnerName.V1
    mode: CUDAGraphMode = CUDAGraphMode.PIECEWISE
    eager_region: EagerRegion = EagerRegion.PER_RUNNER
    layers: int = 3
    steps: int = 6
    batch: int = 2
    prompt: int = 3
    seed: int = 0
    start: int = vllm_layers.START_POSITION  # the first decode step's position (vllm_layers)


def build_model(spec: RunSpec) -> tuple[TinyDeepseekV4, Any]:
    """The tiny model under the runner's ``VllmConfig``; caches allocated and bound."""
    from vllm.config import set_current_vllm_config

    vc = vllm_config(spec.layers, spec.runner, vllm_layers.layer_ratios(spec.layers))
    with _runner_env(spec.runner), set_current_vllm_config(vc), _default_dtype(torch.bfloat16):
        _ensure_distributed(vc)
        # the model-level top-k buffer (nvidia/model.py:848): [max tokens, index_topk]
        topk = torch.zeros(vllm_layers.MAX_TOKENS, vllm_layers.INDEX_TOPK, dtype=torch.int32)
        attns = [build_attention(vc, i, topk) for i in range(spec.layers)]
        model = TinyDeepseekV4(attns)
    _use_cpu_gemm(model)
    _randomize(model, spec.seed)
    model.requires_grad_(False)  # vLLM serves under inference mode
    for attn in attns:
        force_region(attn, spec.eager_region)
    return model, vc


def force_region(attn: nn.Module, region: EagerRegion) -> None:
    """``narrow``/``wide``: that region on ``attn``; ``per-runner`` keeps vLLM's choice."""
    if region is EagerRegion.NARROW:
        attn._prepare_and_attn_fn = attn._prepare_and_attn
    elif region is EagerRegion.WIDE:
        attn._prepare_and_attn_fn = attn._prepare_and_attn_eager


def region_of(model: TinyDeepseekV4) -> str:
    """The region the layers run with: ``wide`` or ``narrow`` (or ``mixed``)."""
    names = {layer.attn._prepare_and_attn_fn.__name__ for layer in model.layers}
    kinds = {str(EagerRegion.WIDE if n == "_prepare_and_attn_eager" else EagerRegion.NARROW) for n in names}
    return kinds.pop() if len(kinds) == 1 else "mixed"


class Buffers:
    """The runner's persistent buffers: what captured graphs read, refilled per step."""

    def __init__(self, batch: int, max_blocks: int = 4):
        n = batch
        self.input_ids = torch.zeros(n, dtype=torch.long)
        self.positions = torch.zeros(n, dtype=torch.long)
        self.slot_mapping = torch.full((n,), PAD_SLOT_ID, dtype=torch.long)
        self.block_table = torch.arange(batch * max_blocks, dtype=torch.int32).view(batch, max_blocks)
        self.seq_lens = torch.zeros(batch, dtype=torch.int32)
        self.query_start_loc = torch.arange(batch + 1, dtype=torch.int32)
        self.is_valid_token = torch.ones(n, dtype=torch.bool)
        self.token_to_req_indices = torch.arange(n, dtype=torch.int32)
        self.swa_indices = torch.full((n, 1, WINDOW), -1, dtype=torch.int32)  # as sparse_swa.py:509 allocates it
        self.swa_lens = torch.zeros(n, dtype=torch.int32)

    def fill(self, tokens: torch.Tensor, position: int | None) -> None:
        """Step inputs in place. ``position=None``: a dummy batch (slots -1, one token)."""
        with torch.no_grad():
            self.input_ids.copy_(tokens)
            pos = 0 if position is None else position
            self.positions.fill_(pos)
            self.seq_lens.fill_(pos + 1)
            blocks = self.block_table[:, pos // SWA_BLOCK].long()
            if position is None:
                self.slot_mapping.fill_(PAD_SLOT_ID)
            else:
                self.slot_mapping.copy_(blocks * SWA_BLOCK + pos % SWA_BLOCK)
            # The SWA indices vLLM's _compute_swa_indices_and_lens_kernel writes
            # (v1/attention/backends/mla/sparse_swa.py:1052): the window's slots, -1 after.
            start = max(pos - (WINDOW - 1), 0)
            window = torch.arange(start, pos + 1)
            slots = self.block_table.long()[:, window // SWA_BLOCK] * SWA_BLOCK + window % SWA_BLOCK
            self.swa_indices.fill_(-1)
            self.swa_indices[:, 0, : len(window)] = slots.to(torch.int32)
            self.swa_lens.fill_(len(window))


class Runner:
    """A model runner's capture and step loop; see the module docstring."""

    def __init__(self, spec: RunSpec, graphs: bool = True):
        from vllm.compilation.breakable_cudagraph import BreakableCUDAGraphWrapper
        from vllm.config import CUDAGraphMode as VllmMode
        from vllm.forward_context import BatchDescriptor

        self.spec = spec
        self.model, self.vc = build_model(spec)
        self.buffers = Buffers(spec.batch)
        self.caches = self._bind_caches()
        self.mode = VllmMode[spec.mode.value] if graphs else VllmMode.NONE
        # V1 wraps for PIECEWISE dispatch only (gpu_model_runner.py:5139); V2 for any
        # non-NONE mode (cudagraph_utils.py:570). FULL: see the module docstring.
        runtime_mode = VllmMode.PIECEWISE if spec.runner is RunnerName.V1 and self.mode is VllmMode.PIECEWISE else None
        self.wrapper = BreakableCUDAGraphWrapper(self.model, self.vc, runtime_mode=runtime_mode)
        self.descriptor = BatchDescriptor(num_tokens=spec.batch, num_reqs=spec.batch if self.mode is VllmMode.FULL else None,
                                          uniform=True)
        self.gen = torch.Generator().manual_seed(spec.seed + 1)
        self.prompts = torch.randint(0, VOCAB, (spec.prompt, spec.batch), generator=self.gen)

    def _bind_caches(self) -> list[tuple[str, torch.Tensor]]:
        caches = []
        blocks = int(self.buffers.block_table.numel())
        for i, layer in enumerate(self.model.layers):
            cache = torch.zeros(blocks, 1, SWA_BLOCK, 584, dtype=torch.uint8)
            layer.attn.swa_cache_layer.bind_kv_cache(cache)
            caches.append((f"kv_cache.layers.{i}.swa", layer.attn.swa_cache_layer.kv_cache))
        # the compressed layers' caches and metadata, and the stand-in prefill (vllm_layers)
        max_len = self.vc.model_config.max_model_len
        if self.spec.start + self.spec.steps > max_len:
            raise CapturelintError(f"--steps {self.spec.steps} from position {self.spec.start} passes max_model_len {max_len}")
        layer_caches = vllm_layers.LayerCaches(self.model, self.spec.batch, max_len)
        swa = [(c.view(c.shape[0], -1), self.buffers.block_table) for _, c in caches]
        layer_caches.prefill(self.spec.start, swa, SWA_BLOCK, WINDOW, self.spec.seed)
        self.layer_metadata = vllm_layers.LayerMetadata(layer_caches, self.spec.batch)
        return caches + layer_caches.named

    # -- attention metadata, built by the runner (vLLM's builders are Triton kernels)
    def metadata(self) -> dict[str, Any]:
        """One step's ``attn_metadata``: per layer, the SWA cache's metadata over the
        persistent buffers, and a fresh ``FlashMLASchedMeta`` (vLLM makes one per build)."""
        from vllm.third_party.flashmla.flash_mla_interface import FlashMLASchedMeta
        from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadata

        b = self.buffers
        n = self.spec.batch
        swa = DeepseekSparseSWAMetadata(
            block_table=b.block_table, slot_mapping=b.slot_mapping, block_size=SWA_BLOCK, seq_lens=b.seq_lens,
            query_start_loc=b.query_start_loc, query_start_loc_cpu=b.query_start_loc.clone(),
            is_valid_token=b.is_valid_token, token_to_req_indices=b.token_to_req_indices,
            decode_swa_indices=b.swa_indices, decode_swa_lens=b.swa_lens, decode_swa_width=WINDOW,
            num_decodes=n, num_prefills=0, num_decode_tokens=n, num_prefill_tokens=0,
            tile_sched_swaonly=FlashMLASchedMeta(), tile_sched_c4a=FlashMLASchedMeta(),
            tile_sched_c128a=FlashMLASchedMeta(),
        )
        md = {layer.attn.swa_cache_layer.prefix: swa for layer in self.model.layers}
        md.update(self.layer_metadata.build(b, n))  # the compressed layers' (vllm_layers)
        return md

    def _forward(self, attn_metadata: Any, mode: Any) -> torch.Tensor:
        from vllm.config import set_current_vllm_config
        from vllm.forward_context import set_forward_context

        descriptor = None if mode.name == "NONE" else self.descriptor
        with set_current_vllm_config(self.vc), set_forward_context(attn_metadata, self.vc, num_tokens=self.spec.batch,
                                                                    cudagraph_runtime_mode=mode,
                                                                    batch_descriptor=descriptor):
            return self.wrapper(input_ids=self.buffers.input_ids, positions=self.buffers.positions)

    def capture(self) -> None:
        """Warm up, then capture the decode batch the steps will replay."""
        from vllm.config import CUDAGraphMode as VllmMode

        if self.mode is VllmMode.NONE:
            return
        self.buffers.fill(torch.zeros(self.spec.batch, dtype=torch.long), None)
        with_metadata = self.spec.runner is RunnerName.V2 or self.mode is VllmMode.FULL
        self._forward(self.metadata() if with_metadata else None, VllmMode.NONE)  # warmup
        self._forward(self.metadata() if with_metadata else None, self.mode)  # capture

    def generate(self) -> torch.Tensor:
        """Capture, then ``steps`` decode steps; the logits of every step."""
        self.capture()
        logits = []
        tokens = self.prompts[0]
        for step in range(self.spec.steps):
            self.buffers.fill(tokens, self.spec.start + step)
            out = self._forward(self.metadata(), self.mode)
            out = out.detach().clone()
            logits.append(out)
            tokens = self.prompts[step + 1] if step + 1 < self.spec.prompt else out.argmax(-1)
        return torch.stack(logits)

    def roots(self) -> dict[str, Any]:
        return {"model": self.model, "runner": self.buffers, "caches": self.caches}


def compare(graphs: torch.Tensor, eager: torch.Tensor) -> tuple[float, float]:
    """Greedy-token agreement and max logit error of a graph run against an eager one."""
    agree = float((graphs.argmax(-1) == eager.argmax(-1)).float().mean())
    diff = (graphs.double() - eager.double()).abs().max()
    return agree, float("inf") if diff.isnan() else float(diff)


__all__ = ["Buffers", "RunSpec", "Runner", "TinyDeepseekV4", "build_attention", "build_model", "compare",
           "force_region", "hf_config", "region_of", "vllm_config"]
