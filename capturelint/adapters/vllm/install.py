"""The adapter for real vLLM: DeepSeek V4 attention of vLLM 0.33.0, on a CPU.

``capturelint check --engine vllm`` runs vLLM's own attention code (the vLLM that
Python imports: the installed wheel, or a source checkout first on ``PYTHONPATH``)
under each model runner's capture conditions, and checks every replay step like the
bundled engine's.

**What is vLLM's own code, run as it is**

- ``DeepseekV4FlashMLAAttention`` (``models/deepseek_v4/nvidia/flashmla.py``) and its
  base ``DeepseekV4Attention`` (``models/deepseek_v4/attention.py``): ``__init__``,
  ``forward``, the per-runner region choice (``_prepare_and_attn_fn``, attention.py
  :323-328), ``_prepare_and_attn``/``_prepare_and_attn_eager``,
  ``_fused_qnorm_rope_kv_insert`` (with its profile-run ``F.pad`` branch),
  ``_sparse_indexer_and_attn``, ``forward_mqa``/``_forward_decode``/``_forward_prefill``, ``_o_proj``
  (``deep_gemm_fp8_o_proj``'s bf16 branch), the linear layers, RoPE caches, the
  workspace manager and ``execute_in_parallel``; in the compressed layers
  ``DeepseekCompressor.forward`` and ``_compress_norm_rope_store``,
  ``DeepseekV4Indexer.forward``, ``SparseAttnIndexer.forward_cuda`` and the
  ``sparse_attn_indexer`` op (its decode and prefill paths), the top-k dispatcher
  (``SparseIndexerTopk``), ``as_fp32_logits``, the indexer metadata builder's chunk
  split and ``build_prefill_chunk_metadata``, the SWA metadata's prefill chunk plan,
  and the Python wrappers around the kernels replaced below
  (``compute_global_topk_indices_and_lens``, ``compress_norm_rope_store_triton``,
  ``get_compressed_slot_mapping``, ``build_c128a_topk_metadata``,
  ``dequantize_and_gather_k_cache``, ``combine_topk_swa_indices``);
- the breakable runtime (``compilation/breakable_cudagraph.py``):
  ``BreakableCUDAGraphWrapper``'s keying, capture and replay, ``BreakableCUDAGraphCapture``
  with ``add_eager`` (which discards break return values) and
  ``eager_break_during_capture`` with its FULL-mode bypass and weak-referenced arguments;
- the forward context (``vllm.forward_context``) and FlashMLA's vendored Python
  interface (``third_party/flashmla/flash_mla_interface.py``, incl. the lazily planned
  ``FlashMLASchedMeta``).

**What is emulated or replaced** (``cpu_shim``)

- the CUDA-graph primitive and the ``torch.cuda`` surface (``EmulatedCUDAGraph`` with
  GPU capture semantics, streams, events: ``capturelint.runtime.emulated``);
- the platform's graph pool (``CpuPlatform`` has no ``graph_pool_handle``);
- kernels, by CPU references written from their semantics
  (``capturelint.adapters.vllm.kernels.reference``): the ``_C`` ops the attention calls
  (``fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert`` and its bf16 variant,
  ``weak_ref_tensor``), FlashMLA's ``_flashmla_C.sparse_decode_fwd`` and
  ``sparse_prefill_fwd``, and the Triton kernels ``fused_q_kv_rmsnorm``,
  ``fused_inv_rope_fp8_quant`` and, for prefills, the kernel objects behind
  ``dequantize_and_gather_k_cache`` and ``combine_topk_swa_indices`` (vLLM disables
  Triton without a GPU driver), whose module-level names are rebound for the run; for the
  compressed layers (``capturelint.adapters.vllm.kernels.compressed``) the compressor's
  ``save_partial_states`` and compress/norm/RoPE/store kernels (Triton, CuTe DSL), the
  indexer's q quantization, DeepGEMM's paged MQA logits, ``_C.top_k_per_row_decode``,
  the short-context fill, the global top-k slots, the indexer's prefill
  (``cp_gather_indexer_k_quant_cache``, DeepGEMM's ``fp8_fp4_mqa_logits``,
  ``_C.top_k_per_row_prefill``) and the metadata kernels (C128A, compressed slot
  mapping, the indexer's prefill chunks), and a CPU kernel for ``aten::mm.dtype``; the compressor
  module sees a CUDA platform (``is_cuda()``, for its CUDA branches) and the indexer op
  dispatches to ``forward_cuda``;
- ``compute_fp8_einsum_recipe`` (asserts a CUDA device; answers SM90's recipe), the
  linear layers' CPU GEMM choice (``F.linear``, vLLM's own fallback), and the attention
  metadata, which the runner shims build themselves (``reproduced``) into
  persistent buffers instead of running vLLM's Triton metadata builders.

The bridge (``bridge.RuntimeBridge``, installed by ``cpu_shim``) keeps vLLM's runtime
and only wraps its methods to announce graphs, segments and breaks through
``capturelint.runtime.protocol``, and to offer the tracer a shadow of each replay step.
Nothing here edits vLLM's files.

**Versions.** Only the vLLM versions in ``SUPPORTED_VERSIONS`` are run; any other is a
one-line error naming them, as is a missing vLLM (with the install command) and a
``_C`` op the adapter has no reference for (that is how a new vLLM tells the user it
needs support).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import threading
from typing import Any, Callable, Iterator

from capturelint.errors import CapturelintError
from capturelint.runtime import frames, protocol

SUPPORTED_VERSIONS = ("0.33.0",)
INSTALL_COMMAND = ("pip install -c constraints.txt -r requirements/vllm-deps.txt && "
                   "pip install --no-deps -r requirements/vllm.txt")

frames.register_runtime_file(__file__)
# A finding inside a kernel's CPU reference points at vLLM's line that called the kernel,
# the nearest frame a vLLM developer owns, not into capturelint's stand-in for it.
frames.register_runtime_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels"))
protocol.register_transparent_op("_C::weak_ref_tensor")  # vLLM's runtime aliases break arguments while capturing


# ------------------------------------------------------------------ the version gate


def _base_release(version: str) -> str:
    m = re.match(r"\d+\.\d+\.\d+", version)
    return m.group(0) if m else version


def require_vllm() -> Any:
    """Import vLLM for the CPU (``VLLM_TARGET_DEVICE=cpu``) and check its version.

    A source checkout first on ``PYTHONPATH`` is what gets imported and checked; its
    ``vllm/_version.py`` must say a supported release (local and dev suffixes of it are
    accepted: a pull request against that release). vLLM's logging is kept off stderr
    (``_quiet_vllm_logging``)."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    _quiet_vllm_logging()
    try:
        vllm = importlib.import_module("vllm")
    except ModuleNotFoundError as e:
        if e.name is not None and e.name.split(".")[0] != "vllm":
            raise CapturelintError(
                f"vLLM is installed but cannot be imported: module {e.name!r} is missing; install vLLM's package set "
                f"with `{INSTALL_COMMAND}`"
            ) from None
        raise CapturelintError(f"--engine vllm needs vLLM {', '.join(SUPPORTED_VERSIONS)}; install it with `{INSTALL_COMMAND}`") from None
    except Exception as e:  # noqa: BLE001 - an import error of a third-party package, reported in one line
        raise CapturelintError(f"importing vLLM failed: {type(e).__name__}: {e}; reinstall it with `{INSTALL_COMMAND}`") from None
    version = str(getattr(vllm, "__version__", "unknown"))
    if _base_release(version) not in SUPPORTED_VERSIONS:
        where = os.path.dirname(getattr(vllm, "__file__", "") or "?")
        raise CapturelintError(
            f"vLLM {version} (imported from {where}) is not supported; capturelint checks vLLM "
            f"{', '.join(SUPPORTED_VERSIONS)}: install it with `{INSTALL_COMMAND}`"
        )
    return vllm


def _quiet_vllm_logging() -> None:
    """Keep vLLM's logging off stderr: the report says what matters.

    Imported as a library, vLLM 0.33.0 installs no handler (its ``configure_logging``
    runs in its own entry points, so ``VLLM_LOGGING_LEVEL`` does nothing here), and
    its warnings about what a CPU lacks (``vllm._C``, Triton, Model Runner V2) reach
    Python's last-resort handler on stderr. A null handler on the ``vllm`` logger is a
    handler found, so the last resort is not used; the records still propagate to the
    root logger's handlers, where a program that configured logging wants them. Only
    vLLM's logger is touched."""
    logger = logging.getLogger("vllm")
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())


# ------------------------------------------------------------------ the CPU shim


class Patches:
    """Attribute patches, undone in reverse order."""

    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any, bool]] = []

    def set(self, owner: Any, name: str, value: Any) -> None:
        had = name in vars(owner) if isinstance(owner, type) else hasattr(owner, name)
        self._undo.append((owner, name, getattr(owner, name, None), had))
        setattr(owner, name, value)

    def undo(self) -> None:
        while self._undo:
            owner, name, value, had = self._undo.pop()
            if had:
                setattr(owner, name, value)
            else:
                with contextlib.suppress(AttributeError):
                    delattr(owner, name)


_shim_lock = threading.RLock()


@contextlib.contextmanager
def cpu_shim() -> Iterator[Any]:
    """Everything vLLM's DeepSeek V4 attention needs to run on a CPU, for the block.

    Installs the emulated ``torch.cuda`` surface, the CPU platform's graph pool, the
    reference kernels, and rebinds the names of the Triton kernels and GPU-only helpers
    the attention module imported (see the module docstring); all of it is undone on
    exit. Yields the imported ``vllm`` package."""
    from capturelint.adapters.vllm.bridge import RuntimeBridge
    from capturelint.adapters.vllm.kernels import flashmla, reference
    from capturelint.runtime.emulated import emulate_cuda, graph_pool_handle

    vllm = require_vllm()
    _hide_plumbing()
    with _shim_lock, emulate_cuda(force=True):
        flashmla.install_flashmla_stub()
        reference.register_reference_kernels()
        patches = Patches()
        try:
            _install(patches, graph_pool_handle)
            with RuntimeBridge().installed():
                yield vllm
        finally:
            patches.undo()


_PLUMBING = ("vllm.model_executor.parameter", "vllm.model_executor.layers.linear", "vllm.model_executor.layers.utils",
             "vllm.model_executor.custom_op")


def _hide_plumbing() -> None:
    """Findings point at the model's lines (``self.wq_b(qr)`` in attention.py), not at
    vLLM's parameter and linear-layer plumbing every GEMM passes through."""
    for name in _PLUMBING:
        module = importlib.import_module(name)
        frames.register_runtime_file(module.__file__)


def _install(patches: Patches, graph_pool_handle: Callable[[], Any]) -> None:
    import torch

    from capturelint.adapters.vllm.kernels import triton_ops
    from vllm.platforms import current_platform

    # The caching allocator's entry points; a CPU has no accelerator to ask.
    patches.set(torch.accelerator, "empty_cache", _no_accelerator)
    patches.set(torch.accelerator, "synchronize", _no_accelerator)
    platform_cls = type(current_platform)
    patches.set(platform_cls, "graph_pool_handle", classmethod(lambda cls: graph_pool_handle()))
    patches.set(platform_cls, "_global_graph_pool", None)

    import vllm.models.deepseek_v4.attention as attention
    import vllm.models.deepseek_v4.common.ops.cache_utils as cache_utils
    import vllm.models.deepseek_v4.nvidia.flashmla as flashmla
    import vllm.models.deepseek_v4.nvidia.ops.o_proj as o_proj
    from vllm.third_party.flashmla import flash_mla_interface

    patches.set(attention, "fused_q_kv_rmsnorm", triton_ops.fused_q_kv_rmsnorm)
    patches.set(o_proj, "fused_inv_rope_fp8_quant", triton_ops.fused_inv_rope_fp8_quant)
    patches.set(flashmla, "flash_mla_with_kvcache", flash_mla_interface.flash_mla_with_kvcache)
    patches.set(flashmla, "flash_mla_sparse_fwd", flash_mla_interface.flash_mla_sparse_fwd)
    # The prefill path's Triton kernels: their launchers (the objects keep their warmup
    # registration); vLLM's Python wrappers around them run as they are.
    patches.set(cache_utils, "has_cutedsl", lambda: False)  # CuTe DSL kernels need CUDA
    patches.set(cache_utils.DequantizeAndGatherKCacheKernel, "__call__", triton_ops.DequantizeAndGatherKCache.__call__)
    patches.set(cache_utils.CombineTopkSwaIndicesKernel, "__call__", triton_ops.CombineTopkSwaIndices.__call__)
    patches.set(flashmla, "compute_fp8_einsum_recipe", _sm90_einsum_recipe)
    from capturelint.adapters.vllm.kernels import compressed

    compressed.install(patches)  # the compressed layers' kernels


def _no_accelerator(*args: Any, **kwargs: Any) -> None:
    return None


def _sm90_einsum_recipe(block_size: int = 128) -> tuple[tuple[int, int, int], bool]:
    """``compute_fp8_einsum_recipe`` asserts a CUDA device; SM90's answer. Our weights
    are bf16, so ``deep_gemm_fp8_o_proj`` takes its bmm branch and never reads it."""
    return (1, 128, 128), False


__all__ = ["INSTALL_COMMAND", "Patches", "SUPPORTED_VERSIONS", "cpu_shim", "require_vllm"]
