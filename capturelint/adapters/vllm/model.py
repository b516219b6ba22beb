"""The tiny DeepSeek V4 every vLLM check runs: vLLM's real attention in a model of ours,
built under a ``VllmConfig`` made in code.

**The model.** ``build_model`` makes ``TinyDeepseekV4``: an embedding, ``layers``
decoder layers and an LM head, each layer an RMSNorm and vLLM's own
``DeepseekV4FlashMLAAttention`` built through its real ``__init__`` (TP=1, a gloo world
of one), with random weights (seeded; no download). The norms, the embedding, the
residual stream and the head are plain torch of ours: what is checked is vLLM's
attention and its capture regions. The configuration is built in code (``hf_config``):
``sliding_window`` 8, 8 heads (FlashMLA pads them to 64), ``q_lora_rank`` 64,
``o_groups`` 2, head dim 512 (448 NoPE + 64 RoPE), fp8_ds_mla SWA cache.

Layer ``i`` has compress ratio 1, 4 or 128 in turn (``layers.layer_ratios``: the
default three layers are one sliding-window, one compressed-sparse layer with its
indexer, one heavily compressed layer); their caches, metadata and the stand-in
prefill of the context before each request's first step live in ``layers``, the
kernels they reach in ``kernels.compressed``. The hooks: ``build_model`` here (the
ratios and the top-k buffer), and the step loops' cache binding and metadata.

The region: ``per-runner`` keeps vLLM's own choice (``_prepare_and_attn_eager``
under V1, ``_prepare_and_attn`` under V2, attention.py:323-328); ``narrow`` and
``wide`` force one on every layer (``force_region``).
"""

from __future__ import annotations

import contextlib
import os
import types
from typing import Any, Iterator

import torch
from torch import nn

from capturelint.adapters.vllm import layers as vllm_layers
from capturelint.options import EagerRegion, Runner
from capturelint.runtime import frames

frames.register_runtime_file(__file__)

VOCAB = 96
HIDDEN = 256
HEADS = 8
WINDOW = 8
SWA_BLOCK = 64
PAD_SLOT_ID = -1
MAX_TOKENS = vllm_layers.MAX_TOKENS  # scheduler_config.max_num_batched_tokens (vllm_config): the largest capture size
MAX_REQS = vllm_layers.MAX_REQS  # scheduler_config.max_num_seqs: the largest batch
MAX_BLOCKS = 4  # block-table columns per request: max_model_len (256) tokens
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

def vllm_config(num_layers: int, runner: Runner, ratios: tuple[int, ...] | None = None) -> Any:
    """A fresh ``VllmConfig`` (each build registers its layers by name in it)."""
    from vllm.config import VllmConfig

    vc = VllmConfig()
    mc = types.SimpleNamespace(hf_config=hf_config(num_layers, ratios), max_model_len=256, is_moe=False,
                               dtype=torch.bfloat16, runner=str(runner), sleep_mode_offload_cudagraph=False,
                               enable_sleep_mode=False)
    object.__setattr__(vc, "model_config", mc)
    # None trips an assert in the indexer's metadata builder (v1/attention/backends/mla/indexer.py:919).
    vc.attention_config.sparse_mla_prefill_workspace_factor = 5
    vc.scheduler_config.max_num_batched_tokens = MAX_TOKENS
    vc.scheduler_config.max_num_seqs = MAX_REQS
    vc.kernel_config.enable_jit_warmup = False  # Triton/CuTe JIT warmup registrations: no kernels to warm here
    return vc

def ensure_distributed(vc: Any) -> None:
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
def runner_env(runner: Runner) -> Iterator[None]:
    """``VLLM_USE_V2_MODEL_RUNNER`` for the block: what selects the runner in
    ``VllmConfig.use_v2_model_runner`` (config/vllm.py:731-750); without Triton vLLM
    would otherwise choose V1. ``VLLM_USE_BREAKABLE_CUDAGRAPH=1``: the breakable
    graphs this adapter runs (V1 wraps with them only then, gpu_model_runner.py
    :5130-5147, and its ``CudagraphDispatcher`` accepts PIECEWISE without a compiled
    model only then, cudagraph_dispatcher.py:48-60)."""
    wanted = {"VLLM_USE_V2_MODEL_RUNNER": "1" if runner is Runner.V2 else "0", "VLLM_USE_BREAKABLE_CUDAGRAPH": "1"}
    saved = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
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

def use_cpu_gemm(model: nn.Module) -> None:
    """vLLM's linear layers on a CPU call ``layer.cpu_linear``, which weight loading
    sets (``dispatch_cpu_unquantized_gemm``); give them its fallback, ``F.linear``."""
    from vllm.model_executor.layers.linear import LinearBase

    for m in model.modules():
        if isinstance(m, LinearBase):
            m.cpu_linear = torch.nn.functional.linear

def randomize(model: nn.Module, seed: int) -> None:
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

def build_model(runner: Runner, layers: int, seed: int, region: EagerRegion) -> tuple[TinyDeepseekV4, Any]:
    """The tiny model of ``layers`` layers under ``runner``'s ``VllmConfig``, its
    weights drawn from ``seed``, ``region`` forced on every layer (``force_region``)."""
    from vllm.config import set_current_vllm_config

    vc = vllm_config(layers, runner, vllm_layers.layer_ratios(layers))
    with runner_env(runner), set_current_vllm_config(vc), default_dtype(torch.bfloat16):
        ensure_distributed(vc)
        # the model-level top-k buffer (nvidia/model.py:848): [max tokens, index_topk]
        topk = torch.zeros(MAX_TOKENS, vllm_layers.INDEX_TOPK, dtype=torch.int32)
        attns = [build_attention(vc, i, topk) for i in range(layers)]
        model = TinyDeepseekV4(attns)
    use_cpu_gemm(model)
    randomize(model, seed)
    model.requires_grad_(False)  # vLLM serves under inference mode
    for attn in attns:
        force_region(attn, region)
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

def compare(graphs: torch.Tensor, eager: torch.Tensor) -> tuple[float, float]:
    """Greedy-token agreement and max logit error of a graph run against an eager one."""
    agree = float((graphs.argmax(-1) == eager.argmax(-1)).float().mean())
    diff = (graphs.double() - eager.double()).abs().max()
    return agree, float("inf") if diff.isnan() else float(diff)


__all__ = ["HIDDEN", "MAX_BLOCKS", "MAX_REQS", "MAX_TOKENS", "PAD_SLOT_ID", "SWA_BLOCK", "VOCAB", "WINDOW", "DecoderLayer",
           "RMSNorm", "TinyDeepseekV4", "build_attention", "build_model", "compare", "default_dtype", "ensure_distributed",
           "force_region", "hf_config", "randomize", "region_of", "runner_env", "use_cpu_gemm", "vllm_config"]
