"""The Mamba2 hybrid family: a vLLM model whose layers are vLLM's ``MambaMixer2``
(``model_executor/layers/mamba/mamba_mixer2.py``, eager break ``mamba_mixer2`` at :1229)
beside vLLM's ``Attention`` layers, run whole through vLLM's own runners.

**The architecture** is ``NemotronHForCausalLM`` (``models/nemotron_h.py``): its layer
kinds are spelled by one string of its configuration (``hybrid_override_pattern``: ``M``
a Mamba2 mixer, ``*`` an attention layer), so the tiny model is exactly "one mixer,
one attention layer" (``M*``, repeated for more layers) with no MLP or MoE layer, from
``transformers``' own ``NemotronHConfig``; Zamba2 shares attention blocks across layers
and adapters, FalconH1 runs attention and mixer in parallel in every layer with muP
multipliers, GraniteMoeHybrid brings a MoE: each more to make tiny, none more of
``MambaMixer2``.

**The model** is vLLM's own class, built through its ``__init__`` from the tiny
configuration (hidden 128, 8 Mamba heads of 16 in 2 groups, state 16, convolution
width 4; 4 query heads over 2 KV heads of 32; vocabulary 96), random weights from the
seed, CustomOps on ``forward_native`` (vLLM's gated RMS norm ``Mixer2RMSNormGated``
included) as in ``generic``.

**The KV cache plan** is vLLM's hybrid one: ``get_kv_cache_spec`` gives a ``MambaSpec``
per mixer (the conv and SSM states, float32 SSM state as vLLM sets for NemotronH) and a
full-attention spec per attention layer; vLLM's ``_align_hybrid_block_size``
(``platforms/interface.py``) raises the attention block size until an attention page
holds a mixer's state, and pads the Mamba page to it; ``runners.real``'s plan puts each
in its own group (one state block a request in the Mamba group: its block size is the
model length), as the engine core does.

**Kernels.** The attention is ``generic``'s backend (vLLM's Triton attention backend,
``kernels.paged_attention``). The mixer's kernels, which vLLM binds on a CPU platform to
its ``ops/cpu`` versions over ``vllm._C`` (not in the CUDA wheel), are references of
ours: the convolutions ``kernels.causal_conv1d`` (prefill ``causal_conv1d_fn``, decode
``causal_conv1d_update``), the SSD chunked scan and the decode
``selective_state_update`` (``kernels.mamba_ssm``). The decode kernels are captured
whole in FULL graphs (vLLM's Mamba2 backend supports uniform-batch graphs); the prefill
ones run in the break. vLLM's Mamba2 metadata builder (``v1/attention/backends/
mamba2_attn.py``) runs as it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from typing import Any, Iterator

import torch

from capturelint.adapters.vllm import generic
from capturelint.adapters.vllm.model import default_dtype, ensure_distributed, randomize, runner_env, use_cpu_gemm
from capturelint.adapters.vllm.runners import real
from capturelint.options import Runner
from capturelint.runtime import frames

frames.register_runtime_file(__file__)

DEFAULT_LAYERS = 2
MAX_MODEL_LEN = generic.MAX_MODEL_LEN
TINY = dict(vocab_size=96, hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            max_position_embeddings=1024, layer_norm_epsilon=1e-6, tie_word_embeddings=False,
            mamba_num_heads=8, mamba_head_dim=16, n_groups=2, ssm_state_size=16, conv_kernel=4, chunk_size=16,
            intermediate_size=256, mamba_ssm_cache_dtype="float32")


@dataclasses.dataclass(frozen=True)
class Mamba2Arch:
    """One architecture of the family: vLLM's model class (module, name) and the
    ``transformers`` config class its tiny configuration is made with."""

    name: str
    module: str
    config_class: str


ARCHS = {a.name: a for a in (
    Mamba2Arch("NemotronHForCausalLM", "vllm.model_executor.models.nemotron_h", "NemotronHConfig"),
)}


def pattern(layers: int) -> str:
    """The layer kinds of ``layers`` layers: a Mamba2 mixer, then an attention layer, again."""
    return ("M*" * layers)[:layers]


def hf_config(arch: Mamba2Arch, layers: int) -> Any:
    import transformers

    return getattr(transformers, arch.config_class)(num_hidden_layers=layers, hybrid_override_pattern=pattern(layers),
                                                    architectures=[arch.name], **TINY)


MODEL_FIELDS = {**generic.MODEL_FIELDS, "is_hybrid": True, "model": "capturelint/tiny-mamba2-hybrid"}


def vllm_config(arch: Mamba2Arch, layers: int, runner: Runner) -> Any:
    """``generic``'s configuration over the hybrid model: the Mamba cache settings vLLM's
    ``MambaModelConfig``/``NemotronHForCausalLMConfig`` set (no prefix caching: state
    mode ``none``, one state block the model's length; float32 SSM state)."""
    hf = hf_config(arch, layers)
    vc = generic.whole_model_config(hf, runner, MODEL_FIELDS, kv_heads=hf.num_key_value_heads, head_size=hf.head_dim,
                                    block_size=generic.BLOCK_SIZE, architecture=arch.name,
                                    architectures=[arch.name], model_impl="auto",
                                    get_mamba_chunk_size=lambda: hf.chunk_size)
    vc.cache_config.enable_prefix_caching = False
    vc.cache_config.mamba_cache_mode = "none"
    vc.cache_config.mamba_block_size = MAX_MODEL_LEN
    vc.cache_config.mamba_ssm_cache_dtype = hf.mamba_ssm_cache_dtype
    return vc


def build_model(arch: Mamba2Arch, runner: Runner, layers: int, seed: int) -> tuple[torch.nn.Module, Any]:
    """vLLM's model class for ``arch`` under ``runner``'s configuration, random weights
    from ``seed``; then vLLM's hybrid block-size alignment (it reads the built layers)."""
    from vllm.config import set_current_vllm_config
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    vc = vllm_config(arch, layers, runner)
    cls = getattr(importlib.import_module(arch.module), arch.name)
    with runner_env(runner), set_current_vllm_config(vc), default_dtype(torch.bfloat16):
        ensure_distributed(vc)
        model = cls(vllm_config=vc, prefix="")
    model.__class__ = type(f"{arch.name}ForCapturelint", (generic.Recording, cls), {})
    use_cpu_gemm(model)
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    for m in model.modules():
        if isinstance(m, ParallelLMHead):
            m.cpu_linear = torch.nn.functional.linear
    randomize(model, seed)
    model.requires_grad_(False)
    type(current_platform)._align_hybrid_block_size(vc, TritonAttentionBackend)
    return model, vc


# The runners' Mamba state bookkeeping, whose Triton kernels run between graphs in
# Triton's interpreter (``kernels.interpreter``): V1's state copies, V2's hybrid model state.
INTERPRETED = ("vllm.v1.worker.mamba_utils", "vllm.v1.worker.gpu.model_states.mamba_hybrid")


@contextlib.contextmanager
def backend() -> Iterator[None]:
    """``generic``'s attention backend, and the mixer's kernels our references (module
    docstring), for the block. Enter it inside ``install.cpu_shim``."""
    from vllm.model_executor.layers.mamba import mamba_mixer2

    from capturelint.adapters.vllm.install import Patches
    from capturelint.adapters.vllm.kernels import causal_conv1d, mamba_ssm
    from capturelint.adapters.vllm.kernels.interpreter import interpret_modules

    patches = Patches()
    try:
        patches.set(mamba_mixer2, "causal_conv1d_fn", causal_conv1d.causal_conv1d_fn)
        patches.set(mamba_mixer2, "causal_conv1d_update", causal_conv1d.causal_conv1d_update)
        patches.set(mamba_mixer2, "selective_state_update", mamba_ssm.selective_state_update)
        patches.set(mamba_mixer2, "mamba_chunk_scan_combined_varlen", mamba_ssm.mamba_chunk_scan_combined_varlen)
        # MambaMixer2.forward calls its break through the custom op torch.ops.vllm.mamba_mixer2
        # (:598); the op's name answers the decorated function itself here, as generic's
        # Attention calls its break directly. Through the op (a break entered inside a
        # dispatched op), tried: PIECEWISE checks clean, but a FULL graph's emulated replay
        # runs the op's Python again, outside any forward context (AssertionError in
        # get_forward_context, forward_context.py:210)
        patches.set(torch.ops.vllm, "mamba_mixer2", mamba_mixer2.mamba_mixer2)
        with generic.backend(), interpret_modules(INTERPRETED):
            yield
    finally:
        patches.undo()


class Mamba2RunnerLoop(generic.GenericRunnerLoop):
    """vLLM's own runner over vLLM's model of a Mamba2 hybrid architecture."""

    ARCH: Any = ARCHS["NemotronHForCausalLM"]
    MODEL_FIELDS = MODEL_FIELDS

    def _build(self, spec: Any) -> tuple[Any, Any]:
        model, vc = build_model(self.ARCH, spec.runner, spec.layers, spec.seed)
        self.BLOCK_SIZE = vc.cache_config.block_size  # vLLM's aligned attention block size
        return model, vc

    def _caches(self) -> list[tuple[str, Any]]:
        """Each attention layer's KV cache and each mixer's conv and SSM states, by layer name."""
        from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2

        caches = super()._caches()
        for name, module in self.model.named_modules():
            if isinstance(module, MambaMixer2):
                caches.append((f"conv_state.{name}", module.kv_cache[0]))
                caches.append((f"ssm_state.{name}", module.kv_cache[1]))
        return caches


def loop_for(arch: str) -> type[Mamba2RunnerLoop]:
    """The step loop of ``arch``'s configurations."""
    return type(f"{arch}RunnerLoop", (Mamba2RunnerLoop,), {"ARCH": ARCHS[arch]})


__all__ = ["ARCHS", "DEFAULT_LAYERS", "Mamba2Arch", "Mamba2RunnerLoop", "TINY", "backend", "build_model",
           "hf_config", "loop_for", "pattern", "vllm_config"]
