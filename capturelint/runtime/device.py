"""The CUDA device, emulated on the CPU, so that a program written for a GPU runs as it is.

``emulate_cuda()`` (``runtime.emulated``) installs this together with the emulated
graph primitive: ``.cuda()``, ``.to("cuda")``, ``device="cuda"`` / ``"cuda:0"`` /
``torch.device("cuda")`` / ``device=0`` in factory functions, ``nn.Module.cuda()`` and
the ``torch.cuda`` queries a GPU program makes (``is_available``, ``set_device``,
``memory_allocated``, ``manual_seed``...) all work, on CPU tensors.

**Mechanism: a ``TorchFunctionMode`` that rewrites device arguments, plus patched
``torch.cuda`` entry points.** Every torch function and ``Tensor`` method called from
Python passes through the mode (factories without a tensor argument too), so one hook
sees ``torch.zeros(..., device="cuda")``, ``x.to("cuda:0", non_blocking=True)``,
``x.cuda()`` and the ``t.cuda()`` that ``nn.Module.cuda()`` applies to each parameter,
and hands them on with the CPU as the device. It is the mechanism of torch's own
``with torch.device(...)`` (``torch.utils._device.DeviceContext``), which it also
honours: a default device of ``cuda`` (``torch.set_default_device("cuda")`` or
``with torch.device("cuda")``) makes factories allocate on the CPU. The alternatives
are worse: a PrivateUse1 backend cannot be named ``cuda`` (a built-in device type) and
needs kernels registered for every op; patching the factories one by one misses some
(there are hundreds, plus ``new_*``, ``*_like`` and ``Tensor.to``); a tensor subclass
that claims ``cuda`` wraps every op and breaks ``type(t) is torch.Tensor``.
``torch.cuda``'s functions are plain module attributes, replaced for the block.

**What a program sees: the truth about memory.** Tensors are CPU tensors:
``t.device`` is ``cpu``, ``t.is_cuda`` is False, ``t.get_device()`` is -1. The mode
could answer ``cuda`` for these properties (it sees ``Tensor.is_cuda.__get__``), but not
per tensor: every tensor, the host ones too, would claim the GPU, and code that picks a
kernel by device (``if x.is_cuda: triton_kernel(x) else: reference(x)``, in the
program, in torch, in vLLM) would take the path a CPU cannot run. Code that branches on
the device therefore takes its CPU path; code that asserts it (``assert x.is_cuda``)
fails, and should test ``torch.cuda.is_available()`` (True here) instead.
``torch.cuda.is_available()`` is True, ``device_count()`` 1: one device, ``cuda:0``
(``cuda:1`` is an invalid device ordinal, as on a machine with one GPU).

Consequences of one memory for host and device: moving a CPU tensor to ``cuda``
returns the tensor itself (``.to`` of a tensor already on the target device), so a host
tensor and its "device copy" share memory, where on a GPU the copy is independent;
``pin_memory()`` returns a copy (``is_pinned()`` stays False); ``non_blocking`` copies
complete at once. A device-to-host copy (``.cpu()``) is not a copy either, so it is not
seen as a host synchronisation inside a capture (``.item()``, ``.tolist()``, ``nonzero``
are). The emulated device's random numbers come from the CPU's default generator:
``torch.cuda.manual_seed`` seeds it and ``torch.cuda.get_rng_state`` reads it (so
``torch.random.fork_rng`` works), one generator for host and device.

``torch.autocast("cuda")`` and ``torch.cuda.amp.autocast`` become CPU autocast with the
same dtype (float16 unless given): CPU autocast's op list is close to CUDA's, not equal
to it, and ``torch.is_autocast_enabled("cuda")`` stays False. Memory queries answer 0
(``memory_allocated``, ``max_memory_reserved``...; the CPU allocator keeps no such
statistics), ``mem_get_info`` the host's free and total memory, and ``empty_cache``,
``reset_peak_memory_stats``, ``synchronize`` and NVTX ranges do nothing.

**Not emulated** (each still fails as on a CPU-only torch, "Torch not compiled with
CUDA enabled" or similar): ``torch.Generator(device="cuda")``, ``torch.load(...,
map_location="cuda")``, CUDA storages and legacy tensor types (``torch.cuda.FloatTensor``),
``torch.accelerator``, ``torch.cuda.MemPool``, multi-device programs, custom CUDA and
Triton kernels. ``capturable=True`` optimizers accept the emulated device's tensors
(``_capturable_devices``).

**Scope.** The patched attributes (``torch.cuda``'s, ``Tensor.record_stream``,
autocast's constructor) are process-wide; the mode is per thread (torch keeps function
modes in thread-local state), so a thread started inside the block sees
``torch.cuda.is_available()`` True but does not rewrite devices until it enters
``emulate_cuda()`` itself. Only code run inside the block is emulated: a target file
that allocates on ``cuda`` or binds ``from torch.cuda import CUDAGraph`` at import needs
its import inside the block too. Nesting is free: an inner block on a thread that already
emulates adds nothing. Everything is restored when the outermost block exits.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Iterator

import torch
import torch.utils._device as _device_context
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack, _pop_mode, _push_mode

CPU = torch.device("cpu")
DEVICE_NAME = "capturelint emulated CUDA device (CPU)"
CAPABILITY = (8, 0)  # what the CPU also runs: bfloat16 and float16 math, TF32 settings


# ------------------------------------------------------------------ device names


def _invalid_ordinal(index: int) -> RuntimeError:
    return RuntimeError(f"CUDA error: invalid device ordinal {index}: capturelint emulates one CUDA device, cuda:0, "
                        "on the CPU (torch.cuda.device_count() is 1)")


def _names_cuda(d: Any, ordinal: bool = False) -> bool:
    """Whether ``d`` names the CUDA device (``"cuda"``, ``"cuda:0"``, a ``torch.device``
    of type cuda, and with ``ordinal`` a bare index, which means a CUDA device where a
    device is expected); an index other than 0 is an error."""
    if isinstance(d, str):
        if d != "cuda" and not d.startswith("cuda:"):
            return False
        d = torch.device(d)
    if isinstance(d, torch.device):
        if d.type != "cuda":
            return False
        index = d.index
    elif ordinal and isinstance(d, int) and not isinstance(d, bool):
        index = d
    else:
        return False
    if index not in (None, 0):
        raise _invalid_ordinal(index)
    return True


def device_index(device: Any = None) -> int:
    """The index ``torch.cuda`` functions take a ``device`` argument for: 0 (the one
    device) for None, ``0``, ``"cuda"``, ``"cuda:0"``, ``torch.device("cuda", 0)``."""
    if device is None or _names_cuda(device, ordinal=True):
        return 0
    raise ValueError(f"expected a CUDA device, got {device!r}")


# ------------------------------------------------------------------- the mode


def _tensor_cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False,
                 memory_format: torch.memory_format = torch.preserve_format) -> torch.Tensor:
    device_index(device)
    return torch.Tensor.to(self, CPU, non_blocking=non_blocking, memory_format=memory_format)


def _tensor_to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    # Positional ints of Tensor.to are device indices (non_blocking and copy are bools).
    args = tuple(CPU if _names_cuda(a, ordinal=True) else a for a in args)
    if _names_cuda(kwargs.get("device"), ordinal=True):
        kwargs["device"] = CPU
    return torch.Tensor.to(self, *args, **kwargs)


def _pin_memory(self: torch.Tensor, device: Any = None) -> torch.Tensor:
    return self.clone()  # pinned memory is host memory: a copy, as pin_memory() makes


_METHODS: dict[Any, Callable[..., Any]] = {
    torch.Tensor.cuda: _tensor_cuda,
    torch.Tensor.to: _tensor_to,
    torch.Tensor.pin_memory: _pin_memory,
}


class CudaOnCpuMode(TorchFunctionMode):
    """Hands every torch call on with the CPU where it names the CUDA device."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        method = _METHODS.get(func)
        if method is not None:
            return method(*args, **(kwargs or {}))
        if func is torch.device:  # a name, not memory: torch.device("cuda") stays what it says
            return func(*args, **(kwargs or {}))
        if kwargs:
            if _names_cuda(kwargs.get("device"), ordinal=True):
                kwargs = {**kwargs, "device": CPU}
            if kwargs.get("pin_memory"):
                kwargs = {**kwargs, "pin_memory": False}
        default = _device_context.CURRENT_DEVICE
        if (default is not None and default.type == "cuda" and (not kwargs or kwargs.get("device") is None)
                and func in _device_context._device_constructors()):
            # torch.set_default_device("cuda") / with torch.device("cuda"): the
            # DeviceContext sits below this mode and would add device=cuda.
            kwargs = {**(kwargs or {}), "device": CPU}
        return func(*args, **(kwargs or {}))


def push_mode() -> CudaOnCpuMode | None:
    """Push the mode on this thread unless it is there already; returns what was pushed."""
    if any(isinstance(m, CudaOnCpuMode) for m in _get_current_function_mode_stack()):
        return None
    mode = CudaOnCpuMode()
    _push_mode(mode)
    return mode


def remove_mode(mode: CudaOnCpuMode) -> None:
    """Take ``mode`` off this thread's stack wherever it is: a mode pushed inside the
    block and left there (a capture that did not end) stays, in its order."""
    above = []
    while torch._C._len_torch_function_stack():
        m = _pop_mode()
        if m is mode:
            break
        above.append(m)
    for m in reversed(above):
        _push_mode(m)


# ------------------------------------------------------------ torch.cuda queries


def is_available() -> bool:
    return True


def device_count() -> int:
    return 1


def current_device() -> int:
    return 0


def set_device(device: Any) -> None:
    device_index(device)


class device:
    """``torch.cuda.device(i)``: selecting the one device is a no-op."""

    def __init__(self, device: Any):
        if device is not None and device != -1:
            device_index(device)

    def __enter__(self) -> None: ...

    def __exit__(self, *exc: object) -> None: ...


def device_of(obj: Any) -> device:
    return device(None)


def get_device_name(device: Any = None) -> str:
    device_index(device)
    return DEVICE_NAME


def get_device_capability(device: Any = None) -> tuple[int, int]:
    device_index(device)
    return CAPABILITY


def _host_memory() -> tuple[int, int]:
    """(free, total) bytes of host memory."""
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """What ``torch.cuda.get_device_properties`` returns, for the emulated device."""

    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int
    is_integrated: bool = True


def get_device_properties(device: Any = None) -> DeviceProperties:
    device_index(device)
    return DeviceProperties(DEVICE_NAME, *CAPABILITY, _host_memory()[1], os.cpu_count() or 1)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def mem_get_info(device: Any = None) -> tuple[int, int]:
    device_index(device)
    return _host_memory()


def _zero(device: Any = None) -> int:
    return 0


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def memory_stats(device: Any = None) -> dict[str, Any]:
    return {}


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    return f"{DEVICE_NAME}: tensors live in host memory; no device memory statistics\n"


def manual_seed(seed: int) -> None:
    torch.random.default_generator.manual_seed(int(seed))


def seed() -> None:
    torch.random.default_generator.seed()


def initial_seed() -> int:
    return torch.random.default_generator.initial_seed()


def get_rng_state(device: Any = "cuda") -> torch.Tensor:
    device_index(device)
    return torch.random.default_generator.get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
    device_index(device)
    torch.random.default_generator.set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state()]


def set_rng_state_all(new_states: Any) -> None:
    for state in new_states:
        set_rng_state(state)


SURFACE: dict[str, Any] = {
    "is_available": is_available,
    "device_count": device_count,
    "current_device": current_device,
    "set_device": set_device,
    "device": device,
    "device_of": device_of,
    "get_device_name": get_device_name,
    "get_device_capability": get_device_capability,
    "get_device_properties": get_device_properties,
    "is_bf16_supported": is_bf16_supported,
    "mem_get_info": mem_get_info,
    "memory_allocated": _zero,
    "max_memory_allocated": _zero,
    "memory_reserved": _zero,
    "max_memory_reserved": _zero,
    "memory_stats": memory_stats,
    "memory_summary": memory_summary,
    "empty_cache": _nothing,
    "reset_peak_memory_stats": _nothing,
    "reset_max_memory_allocated": _nothing,
    "reset_accumulated_memory_stats": _nothing,
    "ipc_collect": _nothing,
    "manual_seed": manual_seed,
    "manual_seed_all": manual_seed,
    "seed": seed,
    "seed_all": seed,
    "initial_seed": initial_seed,
    "get_rng_state": get_rng_state,
    "set_rng_state": set_rng_state,
    "get_rng_state_all": get_rng_state_all,
    "set_rng_state_all": set_rng_state_all,
}
"""``torch.cuda`` functions replaced under emulation (the graph primitive's are in
``runtime.emulated``)."""


class _Nvtx:
    """``torch.cuda.nvtx``'s backend: ranges and marks do nothing."""

    @staticmethod
    def rangePushA(msg: str) -> int:
        return 0

    @staticmethod
    def rangePop() -> int:
        return 0

    @staticmethod
    def rangeStartA(msg: str) -> int:
        return 0

    rangeEnd = staticmethod(_nothing)
    markA = staticmethod(_nothing)


_autocast_init = torch.amp.autocast_mode.autocast.__init__


def _autocast_on_cpu(self: Any, device_type: str, dtype: torch.dtype | None = None, enabled: bool = True,
                     cache_enabled: bool | None = None) -> None:
    """``autocast.__init__`` with ``cuda`` read as CPU autocast in CUDA's dtype."""
    if device_type == "cuda":
        device_type, dtype = "cpu", dtype if dtype is not None else torch.get_autocast_dtype("cuda")
    _autocast_init(self, device_type, dtype, enabled, cache_enabled)


def _capturable_devices(supports_xla: bool = True) -> list[str]:
    """The devices a ``capturable=True`` optimizer accepts, with the emulated device's
    tensors (CPU tensors) among them: Adam, AdamW and the others check each parameter's
    device against this list before a step, and a program written for a GPU sets
    ``capturable=True`` to capture its step."""
    import torch.optim.optimizer as optimizer

    return [*optimizer._get_capturable_supported_devices(supports_xla), "cpu"]


def patches() -> Iterator[tuple[Any, str, Any]]:
    """(owner, attribute, value) for everything the emulated device replaces."""
    import torch.cuda.nvtx as nvtx

    for name, value in SURFACE.items():
        yield torch.cuda, name, value
    yield nvtx, "_nvtx", _Nvtx()
    yield torch.amp.autocast_mode.autocast, "__init__", _autocast_on_cpu
    for module in _optimizer_modules():  # each imported the function by name
        yield module, "_get_capturable_supported_devices", _capturable_devices


def _optimizer_modules() -> list[Any]:
    import sys

    import torch.optim.optimizer as optimizer
    from torch.optim import Adadelta, Adam, Adamax, AdamW, ASGD, NAdam, RAdam, RMSprop, Rprop  # noqa: F401  (their modules)

    original = optimizer._get_capturable_supported_devices
    return [m for name, m in list(sys.modules.items())
            if name.startswith("torch.optim.") and m is not optimizer
            and getattr(m, "_get_capturable_supported_devices", None) is original]


__all__ = ["CAPABILITY", "CPU", "DEVICE_NAME", "CudaOnCpuMode", "DeviceProperties", "SURFACE", "device_index",
           "patches", "push_mode", "remove_mode"]
