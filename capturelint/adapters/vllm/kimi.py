"""The Kimi linear + MLA family: vLLM's ``KimiLinearForCausalLM`` (registered from
``vllm/models/kimi_k3``; on a CUDA platform its NVIDIA implementation,
``models/kimi_k3/nvidia/model.py``), whose layers are Kimi delta attention
(``KimiGatedDeltaNetAttention``, ``model_executor/layers/mamba/gdn/kimi_gdn_linear_attn.py``:
its eager break ``_forward``) and Kimi's own multi-head latent attention
(``MultiHeadLatentAttention``, ``models/kimi_k3/nvidia/mla.py``: its eager break
``_attention``), run whole through vLLM's own runners.

**The model** is vLLM's own class, built through its ``__init__`` from a tiny
configuration made in code with vLLM's ``KimiLinearConfig``
(``transformers_utils/configs/kimi_linear.py``; ``TINY``: a KDA layer then an MLA layer,
``linear_attn_config``; hidden 128; KDA 2 heads of 32, short conv 4; MLA 4 heads, no
query LoRA (Kimi-Linear's full-rank ``q_proj``), ``kv_lora_rank`` 256 and a rope width of
64 (a latent row of 320, a size vLLM's MLA accepts), NoPE, no output gate; dense MLPs;
vocabulary 96), random weights from the seed,
then the MLA layer's ``process_weights_after_loading`` (``W_UK_T``/``W_UV``, what vLLM's
loader runs). ``VLLM_KIMI_K3_GEMM_AR=0`` for the build: the fused GEMM + all-reduce
needs CUTLASS's DSL and an NVLink world, and a world of one has no all-reduce.

**Its kernels**: the KDA layer's FLA kernels are references of ours (``kernels.kda``:
the chunked prefill, the packed decode, ``gather_initial_states``) beside the causal
convolution's (``kernels.causal_conv1d``); its output norm (``FusedRMSNormGated``) is
vLLM's CustomOp on ``forward_native``. The MLA layer runs vLLM's Triton MLA backend
(``mla.backend``: ``TritonMLAImpl.forward_mqa`` over ``kernels.mla_decode``'s decode
attention; the prefill is vLLM's MLA prefill backend for the platform, ``CPU_SDPA_MLA``)
and Kimi's two fused epilogues as references (``kernels.kimi_mla``). All of them run in
the eager breaks, which FULL graphs capture whole, where interpreted Triton cannot run.

**The runners**: ``KimiRunnerLoop``, vLLM's own V1 or V2 ``GPUModelRunner``
(``runners.real``) over this model, with vLLM's hybrid KV cache plan: the KDA layer's
conv and recurrent states (``MambaSpec``, one block per request, the GDN attention
backend's metadata) in a group beside the MLA latent cache's group, page sizes unified
as vLLM unifies them.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from typing import Any, Iterator

import torch

from capturelint.adapters.vllm import generic
from capturelint.adapters.vllm.model import default_dtype, ensure_distributed, randomize, runner_env, use_cpu_gemm
from capturelint.adapters.vllm.runners import real
from capturelint.adapters.vllm.workload import RunSpec
from capturelint.options import Runner
from capturelint.runtime import frames

frames.register_runtime_file(__file__)

ARCH = "KimiLinearForCausalLM"
DEFAULT_LAYERS = 2
MAX_MODEL_LEN = generic.MAX_MODEL_LEN
BLOCK_SIZE = 16  # the Triton MLA backend's kernel block size; _build aligns it for the hybrid (128)
KDA = dict(num_heads=2, head_dim=32, short_conv_kernel_size=4)
TINY = dict(vocab_size=96, hidden_size=128, intermediate_size=256, num_attention_heads=4, q_lora_rank=None,
            kv_lora_rank=256, qk_nope_head_dim=32, qk_rope_head_dim=64, v_head_dim=32, mla_use_nope=True,
            mla_use_output_gate=False, max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=False)


def kda_layers(layers: int) -> list[int]:
    """The KDA layers, 1-based as ``linear_attn_config`` counts them: every other layer
    from the first (the checkpoint's ratio is 3:1; 1:1 keeps both kinds in two layers)."""
    return [i + 1 for i in range(layers) if i % 2 == 0]


def hf_config(layers: int) -> Any:
    """The tiny configuration, made with vLLM's ``KimiLinearConfig``."""
    from vllm.transformers_utils.configs.kimi_linear import KimiLinearConfig

    kda = kda_layers(layers)
    linear = dict(KDA, kda_layers=kda, full_attn_layers=[i + 1 for i in range(layers) if i + 1 not in kda])
    return KimiLinearConfig(num_hidden_layers=layers, architectures=[ARCH], linear_attn_config=linear, **TINY)


# vLLM's Triton kernels of the hybrid's state bookkeeping (V2's model state, which Kimi's
# extends), between graphs: run as they are in Triton's interpreter (kernels.interpreter)
INTERPRETED = ("vllm.v1.worker.gpu.model_states.mamba_hybrid",)
MODEL_FIELDS = {**real.MODEL_FIELDS, "use_mla": True, "is_hybrid": True, "model": "capturelint/tiny-kimi-linear"}


def vllm_config(layers: int, runner: Runner) -> Any:
    """A fresh ``VllmConfig`` whose model configuration answers what vLLM's Kimi model,
    layers and runners read of it (the MLA KV "head" is the latent row), Mamba states of
    one block per request (no prefix caching)."""
    hf = hf_config(layers)
    vc = generic.whole_model_config(hf, runner, MODEL_FIELDS, kv_heads=1,
                                    head_size=hf.kv_lora_rank + hf.qk_rope_head_dim, block_size=BLOCK_SIZE,
                                    quantization=None, architecture=ARCH, architectures=[ARCH], model_impl="auto",
                                    convert_type="none")
    vc.cache_config.mamba_cache_mode = "none"
    vc.cache_config.enable_prefix_caching = False
    vc.cache_config.mamba_block_size = MAX_MODEL_LEN
    return vc


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


def mla_layers(model: torch.nn.Module) -> list[tuple[str, Any]]:
    from vllm.models.kimi_k3.nvidia.mla import MultiHeadLatentAttention

    return [(n, m) for n, m in model.named_modules() if isinstance(m, MultiHeadLatentAttention)]


def kda_modules(model: torch.nn.Module) -> list[tuple[str, Any]]:
    from vllm.model_executor.layers.mamba.gdn.kimi_gdn_linear_attn import KimiGatedDeltaNetAttention

    return [(n, m) for n, m in model.named_modules() if isinstance(m, KimiGatedDeltaNetAttention)]


def build_model(runner: Runner, layers: int, seed: int) -> tuple[torch.nn.Module, Any]:
    """vLLM's ``KimiLinearForCausalLM`` built through its ``__init__`` under ``runner``'s
    configuration, random weights from ``seed``, then the MLA layers' weight processing."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    vc = vllm_config(layers, runner)
    with runner_env(runner), _env("VLLM_KIMI_K3_GEMM_AR", "0"), set_current_vllm_config(vc), \
            default_dtype(torch.bfloat16):
        ensure_distributed(vc)
        cls = importlib.import_module("vllm.models.kimi_k3").KimiLinearForCausalLM
        model = cls(vllm_config=vc, prefix="")
    model.__class__ = type(f"{ARCH}ForCapturelint", (generic.Recording, cls), {})
    use_cpu_gemm(model)
    for m in model.modules():  # the LM head's GEMM takes the CPU branch too (UnquantizedEmbeddingMethod.apply)
        if isinstance(m, ParallelLMHead):
            m.cpu_linear = torch.nn.functional.linear
    randomize(model, seed)
    model.requires_grad_(False)
    with set_current_vllm_config(vc):
        for _, m in mla_layers(model):  # what vLLM's loader runs after the weights (W_UK_T, W_UV from kv_b_proj)
            m.process_weights_after_loading(torch.bfloat16)
    return model, vc


@contextlib.contextmanager
def backend() -> Iterator[None]:
    """The MLA family's Triton MLA backend and kernels (``mla.backend``), Kimi's MLA
    epilogues and the KDA layer's kernels as our references (module docstring). Enter it
    inside ``install.cpu_shim``."""
    from vllm.model_executor.layers.mamba.gdn import kimi_gdn_linear_attn as kda_layer

    import vllm.models.kimi_k3.nvidia.ops.third_party.kda as fla_kda
    from capturelint.adapters.vllm import mla
    from capturelint.adapters.vllm.install import Patches
    from capturelint.adapters.vllm.kernels import causal_conv1d, kda, kimi_mla
    from capturelint.adapters.vllm.kernels.interpreter import interpret_modules

    kimi_mla.register()
    patches = Patches()
    try:
        for name, reference in (("causal_conv1d_fn", causal_conv1d.causal_conv1d_fn),
                                ("causal_conv1d_update", causal_conv1d.causal_conv1d_update),
                                ("gather_initial_states", kda.gather_initial_states)):
            patches.set(kda_layer, name, reference)
        # _forward imports these from the package at each call
        for name in ("chunk_kda_with_fused_gate", "fused_recurrent_kda_packed_decode", "fused_recurrent_kda"):
            patches.set(fla_kda, name, getattr(kda, name))
        with mla.backend(), interpret_modules(INTERPRETED):
            yield
    finally:
        patches.undo()


class KimiRunnerLoop(real.WholeModelLoop):
    """vLLM's own runner (``runners.real``) over vLLM's Kimi-Linear."""

    MODEL_FIELDS = MODEL_FIELDS
    BLOCK_SIZE = BLOCK_SIZE

    def _build(self, spec: RunSpec) -> tuple[Any, Any]:
        """The model, and the block size a CUDA platform aligns for it
        (``Platform.update_block_size_for_backend``, run once the layers are built: the MLA
        page grown to hold a KDA layer's states, the states' page padded to it)."""
        from vllm.config import set_current_vllm_config
        from vllm.platforms.interface import Platform

        model, vc = build_model(spec.runner, spec.layers, spec.seed)
        with set_current_vllm_config(vc):
            Platform.update_block_size_for_backend(vc)  # the base's (CUDA's); the CPU platform's differs
        self.BLOCK_SIZE = vc.cache_config.block_size
        return model, vc

    def _kv_cache_config(self) -> Any:
        """``runners.real``'s plan, with at least one block per sequence the runner may
        hold (``max_num_seqs``): a FULL decode graph gives each sequence a Mamba state
        block, and vLLM refuses to capture with fewer (``resolve_cudagraph_mode_and_sizes``);
        a GPU's memory holds them, the blocks past the workload's stay unused."""
        from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs

        config = super()._kv_cache_config()
        need = self.vc.scheduler_config.max_num_seqs + 1  # and the null block
        if config.num_blocks >= need:
            return config
        specs = self.runner.get_kv_cache_spec()
        self.vc.cache_config.num_gpu_blocks_override = need
        memory = need * sum(spec.page_size_bytes for spec in specs.values())
        return get_kv_cache_configs(self.vc, [specs], [memory], get_global_kv_cache_groups(self.vc, [specs]))[0]

    def _caches(self) -> list[tuple[str, Any]]:
        """Each MLA layer's latent cache and each KDA layer's conv and recurrent states,
        by layer name."""
        caches = [(f"kv_cache.{name}", module.kv_cache) for name, module in mla_layers(self.model)]
        for name, module in kda_modules(self.model):
            caches += [(f"conv_state.{name}", module.kv_cache[0]), (f"ssm_state.{name}", module.kv_cache[1])]
        return caches


def loop_for(arch: str) -> type[KimiRunnerLoop]:
    """The step loop of ``arch``'s configurations."""
    if arch != ARCH:
        raise KeyError(arch)
    return KimiRunnerLoop


__all__ = ["ARCH", "BLOCK_SIZE", "DEFAULT_LAYERS", "KDA", "KimiRunnerLoop", "MODEL_FIELDS", "TINY", "backend",
           "build_model", "hf_config", "kda_layers", "loop_for", "vllm_config"]
