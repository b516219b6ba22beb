"""The generic attention family: a vLLM model whose attention layers are vLLM's
``Attention`` (``model_executor/layers/attention/attention.py``), whose eager break is
``unified_attention_with_output`` (:770), run whole through vLLM's own runners.

**The model** is vLLM's own class (``Qwen3ForCausalLM``, ``LlamaForCausalLM``: every
module, norm, rotary embedding, MLP, logits processor and sampler is vLLM's), built
through its ``__init__`` from a tiny configuration made in code with the architecture's
``transformers`` config class (``TINY``: 2 layers by default, hidden 128, 4 query heads
over 2 KV heads of 32, vocabulary 96; no download), with random weights drawn from the
seed (vLLM's dummy load format draws them too). Its layers are vLLM's CustomOps on
their ``forward_native`` path (``compilation_config.custom_ops = ["none"]``, the path
vLLM's torch.compile traces): their ``forward_cpu`` would call ``vllm._C``, which the
CUDA wheel does not ship.

**The attention backend** is vLLM's Triton backend (``TRITON_ATTN``,
``v1/attention/backends/triton_attn.py``): its metadata builder and
``TritonAttentionImpl`` run as they are; the CPU platform would pick ``CPU_ATTN``
(``vllm._C`` again), so the selector is answered with the Triton backend's path, as a
CUDA platform answers it when asked for it. ``Attention.forward`` goes through the
opaque custom ops a CUDA platform registers (``opaque_attention_op`` answers True, as
CUDA's and CPU's do): ``torch.ops.vllm.unified_kv_cache_update``, captured, then
``torch.ops.vllm.unified_attention_with_output``, whose implementation is the eager
break, entered inside the op's dispatch. Both are Python around kernels: a GPU's capture
records the kernels they launch, so the emulated capture records the ops they run
(``WRAPPER_OPS``, ``protocol.register_wrapper_op``), and the tracer follows the break into
the op's dispatch. Its two kernels are references of ours
(``kernels.paged_attention``: the cache write, captured, and the paged attention, in the
eager break; both captured in FULL graphs), not Triton's interpreter (why: that module).

**The runners**: ``GenericRunnerLoop``, vLLM's own V1 or V2 ``GPUModelRunner``
(``runners.real``) over this model, with vLLM's KV cache plan (one full-attention group,
block size 16, the Triton backend's kernel block size), the serving workload
(``workload.schedule``: prefill, mixed, padded decode, two capture sizes), PIECEWISE
and FULL graphs (FULL: vLLM's ``CUDAGraphWrapper`` / ``torch.cuda.graph``, bare graphs
the checker judges without a shadow: ``runners.real``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import types
from typing import Any, Iterator

import torch

from capturelint.adapters.vllm.model import compare, default_dtype, ensure_distributed, randomize, runner_env, use_cpu_gemm
from capturelint.adapters.vllm.runners import real
from capturelint.adapters.vllm.workload import RunSpec
from capturelint.options import CUDAGraphMode, Runner
from capturelint.runtime import frames, protocol

frames.register_runtime_file(__file__)

# vLLM's attention ops are Python around kernels: a GPU's capture records the kernels
# they launch, so the emulated one records the ops they run (protocol.register_wrapper_op);
# the second's implementation is the eager break.
WRAPPER_OPS = {"vllm::unified_kv_cache_update": False, "vllm::unified_attention_with_output": True}
for _name, _holds_break in WRAPPER_OPS.items():
    protocol.register_wrapper_op(_name, _holds_break)

DEFAULT_LAYERS = 2
BLOCK_SIZE = 16  # the Triton backend's kernel block size (get_supported_kernel_block_sizes: MultipleOf(16))
MAX_MODEL_LEN = 256
TINY = dict(vocab_size=96, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=False)


@dataclasses.dataclass(frozen=True)
class GenericArch:
    """One architecture of the family: vLLM's model class (module, name) and the
    ``transformers`` config class its tiny configuration is made with."""

    name: str
    module: str
    config_class: str


ARCHS = {a.name: a for a in (
    GenericArch("Qwen3ForCausalLM", "vllm.model_executor.models.qwen3", "Qwen3Config"),
    GenericArch("LlamaForCausalLM", "vllm.model_executor.models.llama", "LlamaConfig"),
)}


def hf_config(arch: GenericArch, layers: int) -> Any:
    """The tiny configuration, made with the architecture's ``transformers`` class."""
    import transformers

    return getattr(transformers, arch.config_class)(num_hidden_layers=layers, architectures=[arch.name], **TINY)


MODEL_FIELDS = {**real.MODEL_FIELDS, "use_mla": False, "model": "capturelint/tiny-generic-attention"}


def vllm_config(arch: GenericArch, layers: int, runner: Runner) -> Any:
    """A fresh ``VllmConfig`` (each build registers its layers by name) whose model
    configuration answers what vLLM's model classes, layers and runners read of it."""
    hf = hf_config(arch, layers)
    return whole_model_config(hf, runner, MODEL_FIELDS, kv_heads=hf.num_key_value_heads, head_size=hf.head_dim,
                              block_size=BLOCK_SIZE)


def whole_model_config(hf: Any, runner: Runner, model_fields: dict[str, Any], *, kv_heads: int, head_size: int,
                       block_size: int, **fields: Any) -> Any:
    """A fresh ``VllmConfig`` (each build registers its layers by name) whose model
    configuration answers what vLLM's model classes, layers and runners read of it, for
    every family run whole: ``hf`` the tiny configuration, ``kv_heads`` and ``head_size``
    per KV head as ``ModelConfig`` answers them (an MLA layer's: one latent row),
    ``model_fields`` and ``fields`` more of its attributes; CustomOps on their
    ``forward_native`` path (``forward_cpu`` calls ``vllm._C``), the family's KV block
    size, the workload's scheduler limits. A family sets what else it needs on the result."""
    from vllm.config import VllmConfig

    from capturelint.adapters.vllm.options import MAX_REQS, MAX_TOKENS

    vc = VllmConfig()
    mc = types.SimpleNamespace(hf_config=hf, hf_text_config=hf, max_model_len=MAX_MODEL_LEN, is_moe=False,
                               dtype=torch.bfloat16, head_dtype=torch.bfloat16, runner=str(runner),
                               sleep_mode_offload_cudagraph=False, enable_sleep_mode=False, **model_fields, **fields)
    mc.get_num_attention_heads = lambda parallel_config=None: hf.num_attention_heads
    mc.get_num_kv_heads = lambda parallel_config=None: kv_heads
    mc.get_total_num_kv_heads = lambda: kv_heads
    mc.get_head_size = lambda: head_size
    mc.get_num_layers = lambda parallel_config=None: hf.num_hidden_layers
    object.__setattr__(vc, "model_config", mc)
    vc.compilation_config.custom_ops = ["none"]  # forward_native: forward_cpu calls vllm._C
    vc.cache_config.block_size = block_size
    vc.scheduler_config.max_num_batched_tokens = MAX_TOKENS
    vc.scheduler_config.max_num_seqs = MAX_REQS
    return vc


class Recording:
    """Keeps each step's logits (``compute_logits``) for the numerical oracle; mixed into
    vLLM's model class, so its modules and scopes stay as they are."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)  # type: ignore[misc]
        self.logits_seen.append(logits.detach().float().clone())
        return logits


def build_model(arch: GenericArch, runner: Runner, layers: int, seed: int) -> tuple[torch.nn.Module, Any]:
    """vLLM's model class for ``arch``, built through its ``__init__`` under ``runner``'s
    configuration, random weights from ``seed``."""
    from vllm.config import set_current_vllm_config

    vc = vllm_config(arch, layers, runner)
    cls = getattr(importlib.import_module(arch.module), arch.name)
    with runner_env(runner), set_current_vllm_config(vc), default_dtype(torch.bfloat16):
        ensure_distributed(vc)
        model = cls(vllm_config=vc, prefix="")
    model.__class__ = type(f"{arch.name}ForCapturelint", (Recording, cls), {})
    use_cpu_gemm(model)
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    for m in model.modules():  # the LM head's GEMM takes the CPU branch too (UnquantizedEmbeddingMethod.apply)
        if isinstance(m, ParallelLMHead):
            m.cpu_linear = torch.nn.functional.linear
    randomize(model, seed)
    model.requires_grad_(False)
    return model, vc


@contextlib.contextmanager
def backend() -> Iterator[None]:
    """vLLM's Triton attention backend for the block, its kernels our references (see
    the module docstring). Enter it inside ``install.cpu_shim`` (``families``: each family's ``backend``)."""
    from vllm.platforms import current_platform
    from vllm.v1.attention import selector
    from vllm.v1.attention.backends import triton_attn
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from capturelint.adapters.vllm.install import Patches
    from capturelint.adapters.vllm.kernels import paged_attention

    path = AttentionBackendEnum.TRITON_ATTN.get_path()
    patches = Patches()
    try:
        patches.set(type(current_platform), "get_attn_backend_cls", classmethod(lambda cls, *a, **k: path))
        patches.set(triton_attn, "triton_reshape_and_cache_flash", paged_attention.reshape_and_cache_flash)
        patches.set(triton_attn, "unified_attention", paged_attention.unified_attention)
        # Attention.forward goes through the opaque custom ops, as on CUDA (CUDA and CPU
        # platforms answer True): torch.ops.vllm.unified_kv_cache_update, then
        # torch.ops.vllm.unified_attention_with_output, whose implementation is the eager
        # break (attention.py:564-583). Captures record the ops they run (WRAPPER_OPS).
        patches.set(type(current_platform), "opaque_attention_op", classmethod(lambda cls: True))
        yield
    finally:
        patches.undo()
        selector._cached_get_attn_backend.cache_clear()


class GenericRunnerLoop(real.WholeModelLoop):
    """vLLM's own runner (``runners.real``) over vLLM's model of a generic-attention
    architecture (``ARCH``, set per architecture by ``loop_for``)."""

    ARCH: GenericArch = ARCHS["Qwen3ForCausalLM"]
    MODEL_FIELDS = MODEL_FIELDS
    BLOCK_SIZE = BLOCK_SIZE

    def _build(self, spec: RunSpec) -> tuple[Any, Any]:
        return build_model(self.ARCH, spec.runner, spec.layers, spec.seed)

    def _caches(self) -> list[tuple[str, Any]]:
        """Each attention layer's KV cache, by its layer name."""
        from vllm.model_executor.layers.attention.attention import Attention

        return [(f"kv_cache.{name}", module.kv_cache) for name, module in self.model.named_modules()
                if isinstance(module, Attention)]


def loop_for(arch: str) -> type[GenericRunnerLoop]:
    """The step loop of ``arch``'s configurations."""
    return type(f"{arch}RunnerLoop", (GenericRunnerLoop,), {"ARCH": ARCHS[arch]})


def region_of(model: Any) -> str:
    """The family has one region decision, vLLM's: the attention in its eager break."""
    return "per-runner"


__all__ = ["ARCHS", "BLOCK_SIZE", "DEFAULT_LAYERS", "GenericArch", "GenericRunnerLoop", "MODEL_FIELDS", "Recording",
           "TINY", "backend", "build_model", "compare", "hf_config", "loop_for", "region_of", "vllm_config",
           "whole_model_config"]
