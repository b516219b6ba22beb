"""The gated delta-net hybrid family: vLLM's ``Qwen3NextForCausalLM``
(``model_executor/models/qwen3_next.py``), whose layers alternate gated delta-net linear
attention (``QwenGatedDeltaNetAttention``, ``model_executor/layers/mamba/gdn/
qwen_gdn_linear_attn.py``: its eager break ``qwen_gdn_attention_core`` :2243) with full
attention (vLLM's generic ``Attention``, on the generic family's backend), run whole
through vLLM's own runners.

**The model** is vLLM's own class, built through its ``__init__`` from a tiny
configuration made in code with ``transformers``' ``Qwen3NextConfig`` (``TINY``: a
linear-attention layer then a full-attention layer, ``layer_types``; hidden 128; linear
attention 2 key heads and 4 value heads of 32, conv kernel 4; full attention 4 query
heads over 2 KV heads of 32 with its output gate; vocabulary 96), random weights from
the seed. The linear-attention layers' MLPs are dense (``mlp_only_layers``), the others
a tiny MoE (4 experts, top 2, a shared expert): vLLM's class needs one MoE layer
(``QwenNextMixtureOfExperts.set_moe_parameters`` raises without), and its block reads
the expert-parallel group (a world of one's here).

**What a CUDA platform picks**, the CPU platform would not: the GDN layer's
``forward_cuda`` (the CPU platform picks ``forward_cpu``, whose ops call ``vllm._C``),
and with it the FLA prefill (``ChunkGatedDeltaRule.forward_native``) and the packed
recurrent decode (``VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE``). Its kernels are
references of ours (``backend``): the FLA kernels (``kernels.gdn_fla``), the causal
convolution (``kernels.causal_conv1d``), the routed experts (``kernels.moe``); they run
captured in FULL graphs, where interpreted Triton cannot. V2's state bookkeeping kernels
(``v1/worker/gpu/model_states/mamba_hybrid.py``) run between graphs, as they are, in
Triton's interpreter (``INTERPRETED``). ``forward_cuda`` enters its break as on CUDA,
through the custom op ``torch.ops.vllm.qwen_gdn_attention_core``: Python around kernels,
whose kernels a GPU's capture records, so the emulated capture records the ops it runs
(``protocol.register_wrapper_op``) and the tracer follows the break into the op.

**The runners**: ``GdnRunnerLoop``, vLLM's own V1 or V2 ``GPUModelRunner``
(``runners.real``) over this model, with vLLM's hybrid KV cache plan
(``get_kv_cache_configs``: the GDN layers' conv and recurrent states, ``MambaSpec``, one
block per request, ``mamba_block_size = max_model_len`` as ``MambaModelConfig`` sets it
without prefix caching, in one group beside the full attention's paged KV group, their
pages unified by vLLM's planner) and vLLM's GDN metadata builder
(``v1/attention/backends/gdn_attn.py``). FULL is what vLLM makes of it for the GDN
backend (``UNIFORM_BATCH``): FULL_DECODE_ONLY, so the workload's decode-only steps
replay FULL graphs and the others run eagerly.
"""

from __future__ import annotations

import contextlib
import importlib
import types
from typing import Any, Iterator

import torch

from capturelint.adapters.vllm import generic
from capturelint.adapters.vllm.model import default_dtype, ensure_distributed, randomize, runner_env, use_cpu_gemm
from capturelint.adapters.vllm.runners import real
from capturelint.adapters.vllm.workload import RunSpec
from capturelint.options import Runner
from capturelint.runtime import frames, protocol

frames.register_runtime_file(__file__)

# forward_cuda enters its break through the custom op torch.ops.vllm.qwen_gdn_attention_core
# (qwen_gdn_linear_attn.py:1198), Python around kernels: a GPU's capture records the kernels
# it launches, so the emulated one records the ops it runs (protocol.register_wrapper_op)
protocol.register_wrapper_op("vllm::qwen_gdn_attention_core", True)

DEFAULT_LAYERS = 2
MAX_MODEL_LEN = generic.MAX_MODEL_LEN
TINY = dict(generic.TINY, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
            linear_value_head_dim=32, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=64, shared_expert_intermediate_size=64, decoder_sparse_step=1)
ARCHS = {a.name: a for a in (
    generic.GenericArch("Qwen3NextForCausalLM", "vllm.model_executor.models.qwen3_next", "Qwen3NextConfig"),
)}


def layer_types(layers: int) -> list[str]:
    """Linear attention, then full attention, alternating (the checkpoint's own
    ``full_attention_interval`` is 4; 2 keeps both kinds in two layers)."""
    return ["linear_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]


def hf_config(arch: generic.GenericArch, layers: int) -> Any:
    import transformers

    dense = [i for i in range(layers) if i % 2 == 0] if layers > 1 else []
    return getattr(transformers, arch.config_class)(num_hidden_layers=layers, architectures=[arch.name],
                                                    layer_types=layer_types(layers), mlp_only_layers=dense, **TINY)


# vLLM's Triton kernels of the hybrid's state bookkeeping, between graphs: run as they
# are in Triton's interpreter (kernels.interpreter), as runners.real runs the runners' own
INTERPRETED = ("vllm.v1.worker.gpu.model_states.mamba_hybrid",)

MODEL_FIELDS = {**generic.MODEL_FIELDS, "model": "capturelint/tiny-gated-delta-net", "is_hybrid": True}


def vllm_config(arch: generic.GenericArch, layers: int, runner: Runner) -> Any:
    """The generic family's ``VllmConfig`` over this family's tiny configuration, an MoE
    model (its expert-parallel group) whose Mamba states take one block per request
    (``MambaModelConfig``: no prefix caching, ``mamba_block_size = max_model_len``)."""
    vc = generic.vllm_config(arch, layers, runner)
    # this family's configuration in place of the generic one made from the same class:
    # the heads, head size and layers its answers read are TINY's in both
    vc.model_config.hf_config = vc.model_config.hf_text_config = hf_config(arch, layers)
    vc.model_config.is_moe = True
    vc.model_config.architecture = arch.name
    vc.model_config.architectures = [arch.name]
    vc.cache_config.mamba_cache_mode = "none"
    vc.cache_config.enable_prefix_caching = False
    vc.cache_config.mamba_block_size = MAX_MODEL_LEN
    return vc


def _expert_parallel_group() -> None:
    """vLLM's MoE block reads the expert-parallel group, made only for an MoE model's
    first initialisation (``initialize_model_parallel``); a world of one's, here."""
    from vllm.distributed import parallel_state as ps

    if ps._EP is None:
        ps._EP = ps.init_model_parallel_group([[0]], ps.get_world_group().local_rank, "gloo", group_name="ep")


def build_model(arch: generic.GenericArch, runner: Runner, layers: int, seed: int) -> tuple[torch.nn.Module, Any]:
    """vLLM's model class for ``arch`` with the choices of a CUDA platform (module
    docstring), random weights from ``seed``."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention

    vc = vllm_config(arch, layers, runner)
    cls = getattr(importlib.import_module(arch.module), arch.name)
    with runner_env(runner), set_current_vllm_config(vc), default_dtype(torch.bfloat16):
        ensure_distributed(vc)
        _expert_parallel_group()
        model = cls(vllm_config=vc, prefix="")
    model.__class__ = type(f"{arch.name}ForCapturelint", (generic.Recording, cls), {})
    use_cpu_gemm(model)
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    for m in model.modules():
        if isinstance(m, ParallelLMHead):
            m.cpu_linear = torch.nn.functional.linear
        if isinstance(m, QwenGatedDeltaNetAttention):
            m._forward_method = m.forward_cuda  # what a CUDA platform picks (qwen_gdn_linear_attn.py:578-594)
            m.gdn_decode_kernel = "triton"
    randomize(model, seed)
    from capturelint.adapters.vllm.kernels import moe

    moe.install(model)
    model.requires_grad_(False)
    return model, vc


@contextlib.contextmanager
def backend() -> Iterator[None]:
    """The generic family's attention backend and kernels, and the GDN layers' kernels
    as our references (module docstring)."""
    from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as gdn_layer

    from capturelint.adapters.vllm.install import Patches
    from capturelint.adapters.vllm.kernels import causal_conv1d, gdn_fla
    from capturelint.adapters.vllm.kernels.interpreter import interpret_modules

    patches = Patches()
    try:
        for name, reference in (("causal_conv1d_fn", causal_conv1d.causal_conv1d_fn),
                                ("causal_conv1d_update", causal_conv1d.causal_conv1d_update),
                                ("fused_post_conv_prep", gdn_fla.fused_post_conv_prep),
                                ("fused_sigmoid_gating_delta_rule_update",
                                 gdn_fla.fused_sigmoid_gating_delta_rule_update),
                                ("fused_recurrent_gated_delta_rule_packed_decode",
                                 gdn_fla.fused_recurrent_gated_delta_rule_packed_decode),
                                ("fla_chunk_gated_delta_rule", gdn_fla.chunk_gated_delta_rule),
                                ("l2norm_fwd", gdn_fla.l2norm_fwd)):
            patches.set(gdn_layer, name, reference)
        with generic.backend(), interpret_modules(INTERPRETED):
            yield
    finally:
        patches.undo()


class GdnRunnerLoop(generic.GenericRunnerLoop):
    """vLLM's own runner (``runners.real``) over vLLM's gated delta-net hybrid."""

    ARCH = ARCHS["Qwen3NextForCausalLM"]
    MODEL_FIELDS = MODEL_FIELDS

    def _build(self, spec: RunSpec) -> tuple[Any, Any]:
        return build_model(self.ARCH, spec.runner, spec.layers, spec.seed)

    def _caches(self) -> list[tuple[str, Any]]:
        """Each attention layer's KV cache and each GDN layer's conv and recurrent
        states, by layer name."""
        from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention

        caches = super()._caches()
        for name, module in self.model.named_modules():
            if isinstance(module, QwenGatedDeltaNetAttention):
                caches += [(f"conv_state.{name}", module.kv_cache[0]), (f"ssm_state.{name}", module.kv_cache[1])]
        return caches


def loop_for(arch: str) -> type[GdnRunnerLoop]:
    """The step loop of ``arch``'s configurations."""
    return type(f"{arch}RunnerLoop", (GdnRunnerLoop,), {"ARCH": ARCHS[arch]})


__all__ = ["ARCHS", "DEFAULT_LAYERS", "GdnRunnerLoop", "MODEL_FIELDS", "TINY", "backend", "build_model", "hf_config",
           "layer_types", "loop_for", "vllm_config"]
