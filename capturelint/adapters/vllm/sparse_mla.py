"""The sparse MLA family: DeepSeek V3.2's attention (MLA with the lightning indexer,
DSA), the class vLLM serves ``DeepseekV32ForCausalLM`` and ``GlmMoeDsaForCausalLM``
with on a CUDA platform (``vllm/models/deepseek_v32/nvidia/model.py``), run whole
through vLLM's own runners.

**The model** is vLLM's own class, built through its ``__init__`` from a tiny
configuration made in code with the architecture's ``transformers`` config class
(``TINY``: hidden 128, 4 heads, ``q_lora_rank`` 64, ``kv_lora_rank`` 512 and RoPE 64
(FlashMLA sparse's head 576), indexer 4 heads of 128, ``index_topk`` 128 (the index
remap kernel's tile), dense MLPs (``first_k_dense_replace`` = the layers); no
download), random weights drawn from the seed, then each ``MLAAttention``'s
``process_weights_after_loading`` (``W_UK_T``/``W_UV`` from ``kv_b_proj``, the
loader's last step). vLLM's ``models/deepseek_v32/__init__.py`` would give a CPU
platform DeepSeek V3's generic class; the CUDA module is what is checked.

**The attention backend** is vLLM's FlashMLA sparse (``FLASHMLA_SPARSE``,
``v1/attention/backends/mla/flashmla_sparse.py``, bf16 cache ``auto``): its metadata
builder, ``FlashMLASparseImpl`` and the sparse index group run as they are, and the
indexer's builder (``v1/attention/backends/mla/indexer.py``). The eager breaks are
vLLM's: ``_sparse_indexer_and_attn`` (``deepseek_v32/attention.py``) around
``sparse_attn_indexer`` (``sparse_attn_indexer.py:437``) and ``forward_mqa``.
``backend()`` stands in (see there): the fused Triton kernels of the captured code
(``kernels.sparse_mla_fused``), the FlashMLA entry points bound to the vendored
interface (whose ``_flashmla_C`` ops have references, ``kernels.flashmla``), the index
group's streams and events on the emulated device. The indexer's logits and top-k are
DeepSeek V4's references (``kernels.compressed``, bound by ``cpu_shim``).

**The runners**: ``SparseMlaRunnerLoop``, vLLM's own V1 or V2 ``GPUModelRunner``
(``runners.real``), block size 64 (FlashMLA sparse's), the serving workload, every
request prefilled by the runner itself. What it finds: ``archs`` (the NOT_YET reason).
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from typing import Any, Iterator

import torch

from capturelint.adapters.vllm import generic
from capturelint.adapters.vllm.generic import whole_model_config
from capturelint.adapters.vllm.model import default_dtype, ensure_distributed, randomize, runner_env, use_cpu_gemm
from capturelint.adapters.vllm.runners import real
from capturelint.adapters.vllm.workload import RunSpec
from capturelint.options import Runner
from capturelint.runtime import frames

frames.register_runtime_file(__file__)

DEFAULT_LAYERS = 2
BLOCK_SIZE = 64  # FlashMLA sparse's kernel block size (get_supported_kernel_block_sizes: MultipleOf(64))
MAX_MODEL_LEN = generic.MAX_MODEL_LEN
INDEX_TOPK = 128  # the index remap kernel's tile (NUM_TOPK_TOKENS % BLOCK_N == 0, BLOCK_N 128)
TINY = dict(vocab_size=96, hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=4,
            q_lora_rank=64, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32,
            index_topk=INDEX_TOPK, index_n_heads=4, index_head_dim=128, n_routed_experts=4, moe_intermediate_size=64,
            max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=False,
            rope_parameters={"rope_theta": 10000.0, "rope_type": "default"})


@dataclasses.dataclass(frozen=True)
class SparseMlaArch:
    """One architecture of the family: its name and the ``transformers`` config class."""

    name: str
    config_class: str


ARCHS = {a.name: a for a in (
    SparseMlaArch("DeepseekV32ForCausalLM", "DeepseekV32Config"),
    SparseMlaArch("GlmMoeDsaForCausalLM", "GlmMoeDsaConfig"),
)}


def hf_config(arch: SparseMlaArch, layers: int) -> Any:
    """The tiny configuration, made with the architecture's ``transformers`` class."""
    import transformers

    return getattr(transformers, arch.config_class)(num_hidden_layers=layers, first_k_dense_replace=layers,
                                                    architectures=[arch.name], **TINY)


MODEL_FIELDS = {**real.MODEL_FIELDS, "use_mla": True, "model": "capturelint/tiny-sparse-mla"}


def vllm_config(arch: SparseMlaArch, layers: int, runner: Runner) -> Any:
    """A fresh ``VllmConfig`` whose model configuration answers what vLLM's model class,
    MLA layers, builders and runners read of it."""
    hf = hf_config(arch, layers)
    vc = whole_model_config(hf, runner, MODEL_FIELDS, kv_heads=1, head_size=hf.kv_lora_rank + hf.qk_rope_head_dim,
                            block_size=BLOCK_SIZE, quantization=None,
                            model_arch_config=types.SimpleNamespace(total_num_attention_heads=hf.num_attention_heads))
    vc.attention_config.sparse_mla_prefill_workspace_factor = 5
    vc.kernel_config.enable_jit_warmup = False
    return vc


def build_model(arch: SparseMlaArch, runner: Runner, layers: int, seed: int) -> tuple[torch.nn.Module, Any]:
    """vLLM's class under ``runner``'s configuration, random weights from ``seed``."""
    from vllm.config import set_current_vllm_config
    from vllm.models.deepseek_v32.nvidia.model import DeepseekV32ForCausalLM

    vc = vllm_config(arch, layers, runner)
    with runner_env(runner), set_current_vllm_config(vc), default_dtype(torch.bfloat16):
        ensure_distributed(vc)
        model = DeepseekV32ForCausalLM(vllm_config=vc, prefix="")
    model.__class__ = type(f"{arch.name}ForCapturelint", (generic.Recording, DeepseekV32ForCausalLM), {})
    use_cpu_gemm(model)
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    for m in model.modules():
        if isinstance(m, ParallelLMHead):
            m.cpu_linear = torch.nn.functional.linear
    randomize(model, seed)
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention

    with set_current_vllm_config(vc):  # W_UK_T / W_UV from kv_b_proj, the loader's last step (model_loader/utils.py:206)
        for m in model.modules():
            if isinstance(m, MLAAttention):
                m.process_weights_after_loading(torch.bfloat16)
    model.requires_grad_(False)
    return model, vc


@contextlib.contextmanager
def backend() -> Iterator[None]:
    """vLLM's FlashMLA sparse backend for the block, what a CPU cannot run stood in (the
    module docstring). Enter it inside ``install.cpu_shim`` (``families``)."""
    from vllm.platforms import current_platform
    from vllm.v1.attention import selector
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from capturelint.adapters.vllm.install import Patches
    from capturelint.adapters.vllm.kernels import sparse_mla_fused

    path = AttentionBackendEnum.FLASHMLA_SPARSE.get_path()
    patches = Patches()
    try:
        patches.set(type(current_platform), "get_attn_backend_cls", classmethod(lambda cls, *a, **k: path))
        sparse_mla_fused.install(patches)
        from vllm.utils import torch_utils
        from vllm.v1.attention.backends.mla import index_group

        # vllm.utils.torch_utils.current_stream answers a CPU platform with a placeholder
        # stream (no events), which the index group waits on and the runners capture on;
        # a CUDA platform answers a dedicated stream made once per process (torch_utils.py:824):
        # an emulated one, for the block
        from capturelint.runtime.streams import EmulatedEvent, EmulatedStream

        patches.set(torch_utils._current_stream_tls, "value", EmulatedStream())
        patches.set(index_group, "_create_side_stream", lambda device: EmulatedStream())
        patches.set(index_group, "_create_event", lambda: EmulatedEvent())
        from vllm.third_party.flashmla import flash_mla_interface
        from vllm.v1.attention.backends.mla import flashmla_sparse

        # vLLM binds these to functions that raise when vllm._flashmla_C cannot load
        # (v1/attention/ops/flashmla.py); on a GPU they are the vendored interface's,
        # whose _flashmla_C ops have references (kernels.flashmla)
        patches.set(flashmla_sparse, "flash_mla_sparse_fwd", flash_mla_interface.flash_mla_sparse_fwd)
        patches.set(flashmla_sparse, "flash_mla_with_kvcache", flash_mla_interface.flash_mla_with_kvcache)
        yield
    finally:
        patches.undo()
        selector._cached_get_attn_backend.cache_clear()


class SparseMlaRunnerLoop(real.WholeModelLoop):
    """vLLM's own runner (``runners.real``) over vLLM's DeepSeek V3.2 class (``ARCH``, set
    per architecture by ``loop_for``)."""

    ARCH: SparseMlaArch = ARCHS["DeepseekV32ForCausalLM"]
    MODEL_FIELDS = MODEL_FIELDS
    BLOCK_SIZE = BLOCK_SIZE

    def _build(self, spec: RunSpec) -> tuple[Any, Any]:
        return build_model(self.ARCH, spec.runner, spec.layers, spec.seed)

    def _caches(self) -> list[tuple[str, Any]]:
        from vllm.model_executor.layers.attention.mla_attention import MLAAttention

        found = []
        for name, module in self.model.named_modules():
            if isinstance(module, MLAAttention):
                found.append((f"kv_cache.{name}", module.kv_cache))
                if module.indexer is not None:
                    found.append((f"kv_cache.{name}.indexer", module.indexer.k_cache.kv_cache))
        return found


def loop_for(arch: str) -> type[SparseMlaRunnerLoop]:
    """The step loop of ``arch``'s configurations."""
    return type(f"{arch}RunnerLoop", (SparseMlaRunnerLoop,), {"ARCH": ARCHS[arch]})


__all__ = ["ARCHS", "BLOCK_SIZE", "DEFAULT_LAYERS", "INDEX_TOPK", "SparseMlaArch", "SparseMlaRunnerLoop", "TINY",
           "backend", "build_model", "hf_config", "loop_for", "vllm_config"]
