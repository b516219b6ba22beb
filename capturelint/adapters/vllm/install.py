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
  metadata, which the runner shims build themselves (``vllm_runners``) into
  persistent buffers instead of running vLLM's Triton metadata builders.

The bridge (``observe_vllm_runtime``) keeps vLLM's runtime and only wraps its methods
to announce graphs, segments and breaks through ``capturelint.runtime.protocol``, and
to offer the tracer a shadow of each replay step. Nothing here edits vLLM's files.

**Versions.** Only the vLLM versions in ``SUPPORTED_VERSIONS`` are run; any other is a
one-line error naming them, as is a missing vLLM (with the install command) and a
``_C`` op the adapter has no reference for (that is how a new vLLM tells the user it
needs support).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import re
import threading
from typing import Any, Callable, Iterator

from capturelint.errors import CapturelintError
from capturelint.runtime import frames, protocol
from capturelint.runtime.protocol import BreakCall, BreakOutputs, GraphInfo, Phase, SegmentInfo, SegmentKind

SUPPORTED_VERSIONS = ("0.33.0",)
INSTALL_COMMAND = ("pip install -c constraints.txt -r requirements/vllm-deps.txt && "
                   "pip install --no-deps -r requirements/vllm.txt")

frames.register_runtime_file(__file__)
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


class _Patches:
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
    from capturelint.adapters.vllm.kernels import reference as kernels
    from capturelint.runtime.emulated import emulate_cuda, graph_pool_handle

    vllm = require_vllm()
    _hide_plumbing()
    with _shim_lock, emulate_cuda(force=True):
        kernels.install_flashmla_stub()
        kernels.register_reference_kernels()
        patches = _Patches()
        try:
            _install(patches, graph_pool_handle, kernels)
            with observe_vllm_runtime():
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


def _install(patches: _Patches, graph_pool_handle: Callable[[], Any], kernels: Any) -> None:
    import torch
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

    patches.set(attention, "fused_q_kv_rmsnorm", kernels.fused_q_kv_rmsnorm)
    patches.set(o_proj, "fused_inv_rope_fp8_quant", kernels.fused_inv_rope_fp8_quant)
    patches.set(flashmla, "flash_mla_with_kvcache", flash_mla_interface.flash_mla_with_kvcache)
    patches.set(flashmla, "flash_mla_sparse_fwd", flash_mla_interface.flash_mla_sparse_fwd)
    # The prefill path's Triton kernels: their launchers (the objects keep their warmup
    # registration); vLLM's Python wrappers around them run as they are.
    patches.set(cache_utils, "has_cutedsl", lambda: False)  # CuTe DSL kernels need CUDA
    patches.set(cache_utils.DequantizeAndGatherKCacheKernel, "__call__", kernels.DequantizeAndGatherKCache.__call__)
    patches.set(cache_utils.CombineTopkSwaIndicesKernel, "__call__", kernels.CombineTopkSwaIndices.__call__)
    patches.set(flashmla, "compute_fp8_einsum_recipe", _sm90_einsum_recipe)
    from capturelint.adapters.vllm.kernels import compressed

    compressed.install(patches)  # the compressed layers' kernels


def _no_accelerator(*args: Any, **kwargs: Any) -> None:
    return None


def _sm90_einsum_recipe(block_size: int = 128) -> tuple[tuple[int, int, int], bool]:
    """``compute_fp8_einsum_recipe`` asserts a CUDA device; SM90's answer. Our weights
    are bf16, so ``deep_gemm_fp8_o_proj`` takes its bmm branch and never reads it."""
    return (1, 128, 128), False


# ------------------------------------------------------------- the runtime bridge

_bridge = threading.local()
_graph_ids = iter(range(1 << 50, 1 << 62))


def _break_target(fn: Callable[[], Any]) -> tuple[str, tuple, dict, tuple[str, ...]]:
    """What vLLM's ``eager_break_during_capture`` wrapped in its replay lambda: the
    function, and the (weak-referenced) arguments it will be called with."""
    code = getattr(fn, "__code__", None)
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in fn.__closure__ or ()))) if code is not None else {}
    target = cells.get("fn")
    args = tuple(cells.get("weak_args", ()))
    kwargs = dict(cells.get("weak_kwargs", {}))
    if target is None:
        return getattr(fn, "__qualname__", "eager"), (), {}, ()
    from capturelint.runtime.breakable import _params

    return target.__qualname__, args, kwargs, _params(target)


def _forward_mode() -> tuple[str, Any]:
    """The runtime mode and batch descriptor of vLLM's forward context."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return "NONE", None
    ctx = get_forward_context()
    return str(ctx.cudagraph_runtime_mode.name), ctx.batch_descriptor


def _run_break(name: str, args: tuple, kwargs: dict, params: tuple[str, ...], frame: Any, phase: Phase, inline: bool,
               fn: Callable[[], Any]) -> Any:
    """Run an eager break outside the (would-be) stream capture, announced."""
    call = BreakCall(name, args, kwargs, phase, inline, 0, params, frame)
    protocol.announce("on_break_enter", call)
    with protocol.suspended_capture():
        result = protocol.run_or_reuse(call, lambda *a, **k: fn(), args, kwargs) if phase is Phase.REPLAY else fn()
    protocol.announce("on_break_exit", call, result)
    return result


@contextlib.contextmanager
def observe_vllm_runtime() -> Iterator[None]:
    """Wrap vLLM's breakable runtime so that it announces what it does.

    vLLM's own methods still do all the work; the wrappers only announce graphs,
    segments and breaks (``capturelint.runtime.protocol``), make each segment's
    emulated primitive an owned segment, and hand the tracer a shadow of each replay
    step: the wrapper's runnable, run eagerly with vLLM's ``eager_break_during_capture``
    seeing a stand-in capture whose ``add_eager`` runs the break inline and announces it.
    On replay, vLLM's recorded break call reuses the shadow's call of it
    (``protocol.run_or_reuse``), so each break's Python runs once per step. A wrapper
    an adapter named (``_capturelint_name``: ``target``, ``mtp draft``) starts the label
    of the graphs it captures.
    """
    from vllm.compilation import breakable_cudagraph as bc

    from capturelint.runtime.emulated import owned_by

    frames.register_runtime_file(bc.__file__)
    Capture, Wrapper = bc.BreakableCUDAGraphCapture, bc.BreakableCUDAGraphWrapper
    original = {name: getattr(Capture, name) for name in ("__enter__", "_begin_segment", "_end_segment", "add_eager", "current")}
    original_capture, original_replay = Wrapper._capture, Wrapper._replay

    def enter(self: Any) -> Any:
        mode, descriptor = _forward_mode()
        label = f"{mode}:{getattr(descriptor, 'num_tokens', '?')} tokens"
        owner = getattr(_bridge, "owner", None)  # the capturing wrapper's name, where an adapter gave one
        label = f"{owner} {label}" if owner else label
        self._capturelint_info = GraphInfo(next(_graph_ids), label, mode, mode != "FULL", BreakOutputs.DISCARD)
        self._capturelint_index = 0
        _bridge.phase = Phase.CAPTURE
        protocol.announce("on_graph_begin", self._capturelint_info, Phase.CAPTURE)
        return original["__enter__"](self)

    def begin_segment(self: Any) -> None:
        info = getattr(self, "_capturelint_info", None)
        if info is None:
            return original["_begin_segment"](self)
        index = self._capturelint_index
        protocol.announce("on_segment_begin", SegmentInfo(info.id, index, SegmentKind.CAPTURED, None, Phase.CAPTURE))
        with owned_by(info, index):
            original["_begin_segment"](self)

    def end_segment(self: Any) -> None:
        info = getattr(self, "_capturelint_info", None)
        was = self._capturing
        original["_end_segment"](self)
        if info is not None and was:
            index = self._capturelint_index
            self._capturelint_index += 1
            protocol.announce("on_segment_end", SegmentInfo(info.id, index, SegmentKind.CAPTURED, None, Phase.CAPTURE))

    def add_eager(self: Any, fn: Callable[[], Any]) -> Any:
        info = getattr(self, "_capturelint_info", None)
        if info is None:
            return original["add_eager"](self, fn)
        name, args, kwargs, params = _break_target(fn)
        frame = frames.user_frame(2)

        def run() -> Any:  # what vLLM records and replays for the break
            phase = getattr(_bridge, "phase", Phase.EAGER)
            if phase is not Phase.CAPTURE:
                return _run_break(name, args, kwargs, params, frame, phase, False, fn)
            segment = SegmentInfo(info.id, self._capturelint_index, SegmentKind.EAGER, name, phase)
            protocol.announce("on_segment_begin", segment)
            result = _run_break(name, args, kwargs, params, frame, phase, False, fn)
            protocol.announce("on_segment_end", segment)
            self._capturelint_index += 1
            return result

        return original["add_eager"](self, run)

    def current(cls: Any) -> Any:
        shadow = getattr(_bridge, "shadow", None)
        return shadow if shadow is not None else original["current"].__func__(cls)

    def capture(self: Any, entry: Any, args: tuple, kwargs: dict) -> Any:
        _bridge.owner = getattr(self, "_capturelint_name", None)
        try:
            output = original_capture(self, entry, args, kwargs)
        finally:
            _bridge.phase = Phase.EAGER
            _bridge.owner = None
        info = getattr(entry.capture, "_capturelint_info", None)
        if info is not None:
            entry._capturelint_info = info
            protocol.announce("on_graph_end", info, Phase.CAPTURE, output)
        return output

    def replay(self: Any, entry: Any, args: tuple, kwargs: dict) -> Any:
        info = getattr(entry, "_capturelint_info", None)
        if info is None:
            return original_replay(self, entry, args, kwargs)
        if protocol.has_observers():
            protocol.announce("before_replay", info, functools.partial(_shadow, info, self.runnable, args, kwargs))
        protocol.announce("on_graph_begin", info, Phase.REPLAY)
        _bridge.phase = Phase.REPLAY
        try:
            output = original_replay(self, entry, args, kwargs)
        finally:
            _bridge.phase = Phase.EAGER
        protocol.announce("on_graph_end", info, Phase.REPLAY, _real_rows(output))
        return output

    Capture.__enter__ = enter
    Capture._begin_segment = begin_segment
    Capture._end_segment = end_segment
    Capture.add_eager = add_eager
    Capture.current = classmethod(current)
    Wrapper._capture = capture
    Wrapper._replay = replay
    try:
        yield
    finally:
        for name, value in original.items():
            setattr(Capture, name, value)
        Wrapper._capture, Wrapper._replay = original_capture, original_replay


class _ShadowCapture:
    """What vLLM's ``eager_break_during_capture`` sees during a shadow step: an active
    capture whose ``add_eager`` runs the break at once, outside the (would-be) stream
    capture, announced as the eager segment it is on replay. Nested breaks run inline,
    as in vLLM (``_capturing`` is False while a break runs)."""

    def __init__(self, info: GraphInfo):
        self.info = info
        self._capturing = True

    def add_eager(self, fn: Callable[[], Any]) -> Any:
        name, args, kwargs, params = _break_target(fn)
        self._capturing = False
        try:
            return _run_break(name, args, kwargs, params, frames.user_frame(2), Phase.EAGER, True, fn)
        finally:
            self._capturing = True


def _shadow(info: GraphInfo, runnable: Callable, args: tuple, kwargs: dict) -> Any:
    """Run one replay step eagerly: ``is_current_stream_capturing()`` answers True in
    captured code (as it did at capture), False in eager breaks; in a FULL graph the
    breaks pass through (vLLM's FULL-mode bypass), as they did at capture."""
    previous = getattr(_bridge, "shadow", None)
    _bridge.shadow = _ShadowCapture(info) if info.breaks_eager else None
    try:
        with protocol.capturing_as_on_gpu(True):
            return _real_rows(runnable(*args, **kwargs))
    finally:
        _bridge.shadow = previous


@contextlib.contextmanager
def real_rows(n: int) -> Iterator[None]:
    """The step in the block has ``n`` real tokens: the first ``n`` rows of the model's
    output. A batch padded to its capture size computes its padded rows from whatever
    the padding leaves (rows of ``torch.empty`` the attention does not write), and the
    runner discards them (vLLM keeps ``[:num_tokens]``); so a replay is compared with
    its shadow on the real rows only."""
    previous = getattr(_bridge, "rows", None)
    _bridge.rows = n
    try:
        yield
    finally:
        _bridge.rows = previous


def _real_rows(output: Any) -> Any:
    """``output[:n]`` for ``real_rows(n)``, taken outside any dispatch mode: the view is
    the comparison's, not an op of the step the tracer records."""
    from torch.utils._python_dispatch import _disable_current_modes

    n = getattr(_bridge, "rows", None)
    if n is None or not hasattr(output, "shape"):
        return output
    with _disable_current_modes():
        return output[:n]


__all__ = [
    "INSTALL_COMMAND", "SUPPORTED_VERSIONS", "cpu_shim", "observe_vllm_runtime", "real_rows", "require_vllm",
]
