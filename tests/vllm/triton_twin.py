"""vLLM's own Triton launchers and kernels, as a GPU platform loads them, run in Triton's
interpreter for the kernel tests (imported by name: tests/vllm is on sys.path).

On a CPU platform the Mamba ops modules (``ops/causal_conv1d.py``, ``ops/mamba_ssm.py``)
end by rebinding their launchers to the CPU versions (``ops/cpu``, over ``vllm._C``), so
``fresh`` executes a copy of the module with ``is_cpu`` answering False, under its own
name. ``run`` calls a launcher of that copy with its kernels interpreted
(``kernels.interpreter``), with three things the interpreter does differently from a
compiled launch put right: a mask made of an int64 comparison (``(line < num_cache_lines)
& ...``) is refused by its numpy load and store (compiled, a mask is i1; read as truth
values here); a grid function that stores tensors into its argument dict (the prefill
conv launcher's bookkeeping) changes the kernel's own arguments there (compiled, a
scratch copy; handed a copy here); and ``@triton.heuristics`` flags, which vLLM's
placeholder decorator drops, are put back (``heuristics``: kernel name -> flags).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from typing import Any, Callable, Iterator

from vllm_required import require_vllm


def fresh(module: str) -> tuple[str, Any]:
    """A copy of vLLM's ``module`` executed as on a GPU platform, and its name."""
    require_vllm()
    from vllm.platforms import current_platform

    name = "capturelint_tests_triton_" + module.rsplit(".", 1)[-1]
    if name not in sys.modules:
        spec = importlib.util.find_spec(module)
        copy = importlib.util.module_from_spec(spec)
        is_cpu = current_platform.is_cpu
        current_platform.is_cpu = lambda: False
        try:
            spec.loader.exec_module(copy)
        finally:
            current_platform.is_cpu = is_cpu
        sys.modules[name] = copy
    return name, sys.modules[name]


@contextlib.contextmanager
def _interpreter_as_compiled() -> Iterator[None]:
    import triton.runtime.interpreter as interpreter

    load, store = interpreter._interpreter.load, interpreter._interpreter.store
    init = interpreter.GridExecutor.__init__

    def truthy_load(ptrs, mask, other, dtype):
        return load(ptrs, mask.astype(bool), other, dtype)

    def truthy_store(ptrs, value, mask):
        return store(ptrs, value, mask.astype(bool))

    def copying_init(self, fn, arg_names, grid, *rest):
        init(self, fn, arg_names, (lambda meta: grid(dict(meta))) if callable(grid) else grid, *rest)

    interpreter._interpreter.load, interpreter._interpreter.store = truthy_load, truthy_store
    interpreter.GridExecutor.__init__ = copying_init
    try:
        yield
    finally:
        interpreter._interpreter.load, interpreter._interpreter.store = load, store
        interpreter.GridExecutor.__init__ = init


def run(module: str, launcher: str, *args: Any, heuristics: dict[str, dict[str, Callable[..., Any]]] | None = None,
        patch: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    """``launcher(*args, **kwargs)`` of the GPU-platform copy of ``module``, its kernels
    interpreted; ``patch``: attributes of the copy to replace for the call (a device query)."""
    import triton

    from capturelint.adapters.vllm.kernels.interpreter import interpret_modules

    name, copy = fresh(module)
    saved = {attr: getattr(copy, attr) for attr in (patch or {})}
    with _interpreter_as_compiled(), interpret_modules((name,)):
        kernels = {k: getattr(copy, k) for k in (heuristics or {})}
        try:
            for attr, value in (patch or {}).items():
                setattr(copy, attr, value)
            for kernel, flags in (heuristics or {}).items():
                setattr(copy, kernel, triton.heuristics(flags)(kernels[kernel]))
            return getattr(copy, launcher)(*args, **kwargs)
        finally:
            for kernel, value in kernels.items():
                setattr(copy, kernel, value)
            for attr, value in saved.items():
                setattr(copy, attr, value)
