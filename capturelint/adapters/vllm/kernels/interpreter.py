"""vLLM's own Triton kernels, run on the CPU by Triton's interpreter.

Without a GPU driver vLLM disables Triton (``triton_utils/importing.py``): ``triton.jit``
becomes a placeholder decorator that returns the undecorated Python function, and
``tl`` a placeholder module, so a launch (``kernel[grid](...)``) fails with
"'function' object is not subscriptable" (or, for a ``VllmTritonJitKernel``, "Cannot
inspect kernel parameters"). The kernel's Python source is intact, though, and the
installed ``triton`` package ships an interpreter (``triton.runtime.interpreter``,
what ``TRITON_INTERPRET=1`` selects) that runs a kernel's source with numpy on CPU
tensors. ``interpret_modules`` rebinds, for the block, every function of the given vLLM
modules that uses ``tl`` to an ``InterpretedFunction`` of the same code whose globals
see the real ``triton`` and ``triton.language`` (helpers it calls, in its module or
imported from another, are interpreted the same way), and every
``VllmTritonJitKernel``'s ``kernel``. What runs is vLLM's kernel, not a reference of
ours. Triton's own jitted library functions (``tl.sum``, ``tl.cdiv``) are decorated
when Triton is imported, as interpreted functions only under ``TRITON_INTERPRET=1``;
otherwise they are rebound to interpreted twins for the block too, so the setting at
import does not matter.

Only kernels that run **outside** captured code may be interpreted: the interpreter
reads its arguments into numpy and copies the results back, so a capture would record
those copies (capture-time values) instead of the kernel. The runner's input
preparation and the attention metadata builders run between graphs; the model's own
kernels keep their CPU references (``kernels.fp8_ds_mla``).

**The interpreter's dead overflow checks.** Triton's integer ``+``, ``-`` and ``*`` each
call ``binary_op_sanitize_overflow_impl`` when the builder's ``sanitize_overflow`` option
is on (the interpreter's default): the operands are widened to int64, the operation
redone, and both bounds compared, all in numpy, for a ``device_assert`` that then
returns without checking anything, since ``device_assert`` checks only under
``debug`` and the interpreter's options have ``debug=False`` (as a compiled kernel
without ``debug`` drops the assert too). That is a third of the interpreter's time
in the runner's input preparation, computing values nobody reads, so for the block
``sanitize_overflow`` is off: the same kernels compute the same numbers
(``_overflow_checks_off``).
"""

from __future__ import annotations

import contextlib
import importlib
import types
from typing import Any, Iterator

_cache: dict[int, dict[str, Any]] = {}  # id(original module globals) -> interpreted globals


def _placeholder(globals_: dict[str, Any]) -> bool:
    from vllm.triton_utils.importing import TritonLanguagePlaceholder

    return isinstance(globals_.get("tl"), TritonLanguagePlaceholder)


def _uses_tl(code: types.CodeType) -> bool:
    return "tl" in code.co_names or any(isinstance(c, types.CodeType) and _uses_tl(c) for c in code.co_consts)


def _is_kernel(fn: Any) -> bool:
    """A function written for Triton: it reads ``tl`` from a module that has vLLM's
    placeholder for it."""
    return isinstance(fn, types.FunctionType) and _placeholder(fn.__globals__) and _uses_tl(fn.__code__)


def _interpreted_globals(original: dict[str, Any]) -> dict[str, Any]:
    """A copy of a module's globals with the real Triton, and its kernels interpreted."""
    found = _cache.get(id(original))
    if found is not None:
        return found
    import triton
    import triton.language as tl

    g = dict(original)
    g["tl"], g["triton"] = tl, triton
    _cache[id(original)] = g
    for name, value in original.items():
        if _is_kernel(value):
            g[name] = _interpreted(value)
    return g


def _interpreted(fn: types.FunctionType) -> Any:
    from triton.runtime.interpreter import InterpretedFunction

    twin = types.FunctionType(fn.__code__, _interpreted_globals(fn.__globals__), fn.__name__, fn.__defaults__,
                              fn.__closure__)
    twin.__qualname__, twin.__module__ = fn.__qualname__, fn.__module__
    twin.__annotations__ = dict(fn.__annotations__)
    return InterpretedFunction(twin)


def _targets(module: types.ModuleType) -> Iterator[tuple[Any, str, Any]]:
    """(owner, name, interpreted) for a module's kernels, its kernel classes' ``kernel``,
    and its ``triton`` and ``tl`` (the real ones, for the code that launches kernels)."""
    g = _interpreted_globals(vars(module))
    if _placeholder(vars(module)):  # the launch code's own uses (triton.next_power_of_2, tl.int64)
        yield module, "tl", g["tl"]
        yield module, "triton", g["triton"]
    for name, value in list(vars(module).items()):
        if _is_kernel(value):
            yield module, name, g[name]
        elif isinstance(value, type) and value.__module__ == module.__name__:
            kernel = vars(value).get("kernel")
            fn = kernel.__func__ if isinstance(kernel, staticmethod) else None
            if fn is not None and _is_kernel(fn):
                yield value, "kernel", staticmethod(_interpreted(fn))


def _language() -> Iterator[tuple[Any, str, Any]]:
    """(module, name, interpreted) for Triton's jitted library functions that were
    compiled-mode ``JITFunction`` objects (Triton imported without ``TRITON_INTERPRET``)."""
    import sys

    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    for name, module in list(sys.modules.items()):
        if module is None or not (name == "triton.language" or name.startswith("triton.language.")):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, JITFunction) and not isinstance(value, InterpretedFunction):
                yield module, attr, InterpretedFunction(value.fn)


@contextlib.contextmanager
def _overflow_checks_off() -> Iterator[None]:
    """The interpreter's ``sanitize_overflow`` off for the block, when its asserts are
    dropped anyway (``debug`` off; see the module docstring); restored on exit."""
    import dataclasses

    from triton.runtime import interpreter

    options = interpreter.interpreter_builder.options
    if options.debug or not options.sanitize_overflow:
        yield
        return
    interpreter.interpreter_builder.options = dataclasses.replace(options, sanitize_overflow=False)
    try:
        yield
    finally:
        interpreter.interpreter_builder.options = options


@contextlib.contextmanager
def interpret_modules(names: tuple[str, ...]) -> Iterator[None]:
    """Run the Triton kernels of the named vLLM modules in Triton's interpreter, for the
    block (see the module docstring); everything is rebound back on exit."""
    import triton.experimental.gluon  # noqa: F401  (the interpreter imports it; its import wants the compiled library)
    import triton.language  # noqa: F401  (its modules, for _language)

    undo: list[tuple[Any, str, Any]] = []
    with _overflow_checks_off():
        try:
            targets = list(_language())
            for name in names:
                targets.extend(_targets(importlib.import_module(name)))
            for owner, attr, value in targets:
                undo.append((owner, attr, vars(owner)[attr]))
                setattr(owner, attr, value)
            yield
        finally:
            for owner, attr, value in reversed(undo):
                setattr(owner, attr, value)


__all__ = ["interpret_modules"]
