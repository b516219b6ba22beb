"""The MLA family: a vLLM model whose attention layers are vLLM's multi-head latent
attention (``MultiHeadLatentAttentionWrapper``, ``model_executor/layers/mla.py``, over
``MLAAttention``, ``model_executor/layers/attention/mla_attention.py``), whose eager break
is ``unified_mla_attention_with_output`` (:1484), run whole through vLLM's own runners.

**The model** is vLLM's own class (``DeepseekV2ForCausalLM``, ``DeepseekV3ForCausalLM``,
both in ``model_executor/models/deepseek_v2.py``: every module, norm, rotary embedding,
MLP, logits processor and sampler is vLLM's), built through its ``__init__`` from a tiny
configuration made in code with the architecture's ``transformers`` config class
(``TINY``: 1 layer by default, hidden 128, 4 heads, ``kv_lora_rank`` 256, rope 64, nope
32, value 32; vocabulary 96; no download), with random weights drawn from the seed, then
vLLM's ``process_weights_after_loading`` of each MLA layer (what vLLM's loader runs: it
splits ``kv_b_proj`` into the absorbed ``W_UK_T`` and ``W_UV`` the decode uses). The MLP
is dense (``first_k_dense_replace`` past the last layer): a MoE layer would run vLLM's
fused-MoE Triton kernels in captured code, which have no reference here. DeepSeek V2 is
built without a query LoRA (V2-Lite: ``q_proj``, ``kv_a_proj_with_mqa``), DeepSeek V3
with one (``fused_qkv_a_proj``, ``q_a_layernorm``, ``q_b_proj``): the wrapper's two
branches. Layers are vLLM's CustomOps on their ``forward_native`` path, as in ``generic``.

**The attention backend** is vLLM's Triton MLA backend (``TRITON_MLA``,
``v1/attention/backends/mla/triton_mla.py``): its metadata builder (vLLM's
``MLACommonMetadataBuilder``: the decode/prefill split, the uniform-decode graphs it
supports) and ``TritonMLAImpl`` run as they are; the CPU platform would pick ``CPU_MLA``
(``vllm._C``), so the selector is answered with the Triton MLA backend's path, as a
CUDA platform answers it when asked for it. Its kernels:

- the latent cache write ``concat_and_cache_mla`` (``_C_cache_ops``, CUDA; captured):
  ``kernels.mla_decode``'s reference, registered under vLLM's op name;
- the decode attention over the paged latent cache, ``decode_attention_fwd`` (Triton,
  in the eager break, captured in FULL graphs): ``kernels.mla_decode``'s reference
  (tested against vLLM's kernel in Triton's interpreter);
- the prefill (new tokens, no context: every request arrives fresh) is vLLM's own MLA
  prefill backend for the platform, ``CPU_SDPA_MLA``
  (``v1/attention/backends/mla/prefill/cpu_sdpa.py``, dense torch attention per request),
  run as it is; a CUDA platform would pick flash-attn's varlen kernel, which computes the
  same causal attention. It runs in the eager break only (the backend captures uniform
  decode batches alone).

``MLAAttention.forward`` goes through the two custom ops ``unified_mla_kv_cache_update``
and ``unified_mla_attention_with_output`` (``opaque_attention_op`` is True on CUDA and
CPU); its ``use_direct_call`` branch would call ``forward_impl`` without the eager break.
So the ops stay, but ``torch.ops.vllm.<op>`` answers vLLM's own Python functions for the
block (the same decorated functions the ops dispatch to), as ``generic`` calls
``unified_attention_with_output`` directly: through the dispatcher, the emulated FULL
graph records each op as one call and its replay re-runs the op's Python, where a GPU's
graph holds the kernels it launched (``generic``'s docstring).

**The runners**: ``MlaRunnerLoop``, vLLM's own V1 or V2 ``GPUModelRunner``
(``runners.real``) over this model, with vLLM's KV cache plan (one MLA group, block size
16, the Triton MLA backend's kernel block size), the serving workload
(``workload.schedule``), PIECEWISE and FULL graphs (FULL: the backend captures uniform
decode batches only, ``AttentionCGSupport.UNIFORM_BATCH``, so vLLM's
``resolve_cudagraph_mode_and_sizes``, ``config/compilation.py:1376``, turns FULL into
FULL_DECODE_ONLY, as on a GPU: the decode steps replay bare FULL graphs, the prefill and
mixed steps run eager).

**Its one finding is vLLM's**: under V1 PIECEWISE, CL103 at ``_custom_ops.py:2927``
(``concat_and_cache_mla``). The MLA backends keep ``forward_includes_kv_cache_update =
True`` (``v1/attention/backend.py:70``) although ``MLAAttention`` writes the latent cache
in captured code, so V1 hands that write the unpadded slot mapping
(``gpu_model_runner.py:4036-4041``, whose comment says it must then be padded) and a
replay runs it over the capture's extent; harmless today only because V1's slot-mapping
kernel fills the persistent buffer's tail with ``PAD_SLOT_ID`` (``block_table.py:336``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from typing import Any, Iterator

import torch

from capturelint.adapters.vllm import generic
from capturelint.adapters.vllm.generic import MAX_MODEL_LEN, whole_model_config
from capturelint.adapters.vllm.model import compare, default_dtype, ensure_distributed, randomize, runner_env, use_cpu_gemm
from capturelint.adapters.vllm.runners import real
from capturelint.adapters.vllm.workload import RunSpec
from capturelint.options import Runner
from capturelint.runtime import frames

frames.register_runtime_file(__file__)

DEFAULT_LAYERS = 1
BLOCK_SIZE = 16  # the Triton MLA backend's kernel block size (get_supported_kernel_block_sizes: MultipleOf(16))
TINY = dict(vocab_size=96, hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_attention_heads=4,
            num_key_value_heads=4, kv_lora_rank=256, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32,
            n_routed_experts=4, first_k_dense_replace=1 << 10, max_position_embeddings=1024, rms_norm_eps=1e-6,
            tie_word_embeddings=False)


@dataclasses.dataclass(frozen=True)
class MlaArch:
    """One architecture of the family: vLLM's model class (module, name), the
    ``transformers`` config class of its tiny configuration and its query LoRA rank
    (None: the query projected directly)."""

    name: str
    module: str
    config_class: str
    q_lora_rank: int | None


ARCHS = {a.name: a for a in (
    MlaArch("DeepseekV2ForCausalLM", "vllm.model_executor.models.deepseek_v2", "DeepseekV2Config", None),
    MlaArch("DeepseekV3ForCausalLM", "vllm.model_executor.models.deepseek_v2", "DeepseekV3Config", 48),
)}


def hf_config(arch: MlaArch, layers: int) -> Any:
    """The tiny configuration, made with the architecture's ``transformers`` class."""
    import transformers

    return getattr(transformers, arch.config_class)(num_hidden_layers=layers, architectures=[arch.name],
                                                    q_lora_rank=arch.q_lora_rank, **TINY)


MODEL_FIELDS = {**real.MODEL_FIELDS, "use_mla": True, "model": "capturelint/tiny-mla"}


def vllm_config(arch: MlaArch, layers: int, runner: Runner) -> Any:
    """A fresh ``VllmConfig`` whose model configuration answers what vLLM's model
    classes, MLA layers and runners read of it (an MLA model's KV "head" is the latent
    row: one head of ``kv_lora_rank + qk_rope_head_dim``, as ``ModelConfig`` answers)."""
    hf = hf_config(arch, layers)
    return whole_model_config(hf, runner, MODEL_FIELDS, kv_heads=1, head_size=hf.kv_lora_rank + hf.qk_rope_head_dim,
                              block_size=BLOCK_SIZE, quantization=None)


def build_model(arch: MlaArch, runner: Runner, layers: int, seed: int) -> tuple[torch.nn.Module, Any]:
    """vLLM's model class for ``arch``, built through its ``__init__`` under ``runner``'s
    configuration, random weights from ``seed``, then each MLA layer's weight processing."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    vc = vllm_config(arch, layers, runner)
    cls = getattr(importlib.import_module(arch.module), arch.name)
    with runner_env(runner), set_current_vllm_config(vc), default_dtype(torch.bfloat16):
        ensure_distributed(vc)
        model = cls(vllm_config=vc, prefix="")
    model.__class__ = type(f"{arch.name}ForCapturelint", (generic.Recording, cls), {})
    use_cpu_gemm(model)
    for m in model.modules():  # the LM head's GEMM takes the CPU branch too (UnquantizedEmbeddingMethod.apply)
        if isinstance(m, ParallelLMHead):
            m.cpu_linear = torch.nn.functional.linear
    randomize(model, seed)
    model.requires_grad_(False)
    with set_current_vllm_config(vc):
        for m in model.modules():  # what vLLM's loader runs after the weights (W_UK_T, W_UV from kv_b_proj)
            if isinstance(m, MLAAttention):
                m.process_weights_after_loading(torch.bfloat16)
    return model, vc


_OPS = ("unified_mla_kv_cache_update", "unified_mla_attention_with_output")


@contextlib.contextmanager
def mla_kernels() -> Iterator[None]:
    """What vLLM's dense MLA layers need on a CPU beside the backend choice, for the
    block: the Triton MLA backend's decode kernel and the latent cache write as our
    references (``kernels.mla_decode``), its host helper ``triton.next_power_of_2``, and
    ``torch.ops.vllm``'s two MLA ops answering vLLM's own Python functions (module
    docstring). ``backend`` enters it; a family with MLA layers beside others (Kimi
    linear) enters it with its own selector."""
    import triton as real_triton
    from vllm.model_executor.layers.attention import mla_attention
    from vllm.v1.attention.backends.mla import triton_mla

    from capturelint.adapters.vllm.install import Patches
    from capturelint.adapters.vllm.kernels import mla_decode

    mla_decode.register_cache_op()
    namespace = torch.ops.vllm
    patches = Patches()
    try:
        patches.set(triton_mla, "decode_attention_fwd", mla_decode.decode_attention_fwd)
        # the split count's power of two (_compute_num_kv_splits): vLLM's Triton placeholder
        # (no GPU driver) lacks triton.next_power_of_2, a plain host function of the package
        patches.set(triton_mla, "triton", real_triton)
        for name in _OPS:
            getattr(namespace, name)  # resolved first, so the patch's undo puts the packet back
            patches.set(namespace, name, getattr(mla_attention, name))
        yield
    finally:
        patches.undo()


def triton_mla_path() -> str:
    """The import path of vLLM's Triton MLA backend (what the selector answers for a
    dense MLA layer)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return AttentionBackendEnum.TRITON_MLA.get_path()


@contextlib.contextmanager
def backend() -> Iterator[None]:
    """vLLM's Triton MLA backend for the block's dense MLA layers (any other layer gets
    what the platform answered before), with ``mla_kernels``. Enter it inside
    ``install.cpu_shim`` (``families``: each family's ``backend``)."""
    from vllm.platforms import current_platform
    from vllm.v1.attention import selector

    from capturelint.adapters.vllm.install import Patches

    path = triton_mla_path()
    platform = type(current_platform)
    before = platform.get_attn_backend_cls  # bound to the class: the answer for other layers

    def get_attn_backend_cls(cls: Any, selected_backend: Any, attn_selector_config: Any, *args: Any,
                             **kwargs: Any) -> str:
        if attn_selector_config.use_mla and not attn_selector_config.use_sparse:
            return path
        return before(selected_backend, attn_selector_config, *args, **kwargs)

    patches = Patches()
    try:
        patches.set(platform, "get_attn_backend_cls", classmethod(get_attn_backend_cls))
        with mla_kernels():
            yield
    finally:
        patches.undo()
        selector._cached_get_attn_backend.cache_clear()


class MlaRunnerLoop(real.WholeModelLoop):
    """vLLM's own runner (``runners.real``) over vLLM's model of an MLA architecture
    (``ARCH``, set per architecture by ``loop_for``)."""

    ARCH: MlaArch = ARCHS["DeepseekV3ForCausalLM"]
    MODEL_FIELDS = MODEL_FIELDS
    BLOCK_SIZE = BLOCK_SIZE

    def _build(self, spec: RunSpec) -> tuple[Any, Any]:
        return build_model(self.ARCH, spec.runner, spec.layers, spec.seed)

    def _caches(self) -> list[tuple[str, Any]]:
        """Each MLA layer's latent KV cache, by its layer name."""
        from vllm.model_executor.layers.attention.mla_attention import MLAAttention

        return [(f"kv_cache.{name}", module.kv_cache) for name, module in self.model.named_modules()
                if isinstance(module, MLAAttention)]


def loop_for(arch: str) -> type[MlaRunnerLoop]:
    """The step loop of ``arch``'s configurations."""
    return type(f"{arch}RunnerLoop", (MlaRunnerLoop,), {"ARCH": ARCHS[arch]})


__all__ = ["ARCHS", "BLOCK_SIZE", "DEFAULT_LAYERS", "MODEL_FIELDS", "MlaArch", "MlaRunnerLoop", "TINY", "backend",
           "build_model", "compare", "hf_config", "loop_for", "mla_kernels", "triton_mla_path", "vllm_config"]
