"""Runtimes that capture CUDA graphs on their own, which capturelint does not check.

``torch.compile(mode="reduce-overhead")`` (and ``"max-autotune"``,
``options={"triton.cudagraphs": True}``, ``backend="cudagraphs"``) records CUDA graphs
inside the compiled code (CUDA-graph trees), with their own static inputs and memory
pool, and replays them without announcing anything capturelint observes: their hazards
are out of reach. A program that uses one is not silently called clean: for the block,
``emulate_cuda`` wraps ``torch.compile`` (``patches``) so that each such call announces
``on_unchecked_graphs`` with what it is and its line, once per line, and the report
says which graphs were not checked. The call itself is torch's, unchanged.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterator

import torch

from capturelint.runtime import frames, protocol

_CAPTURING_MODES = ("reduce-overhead", "max-autotune")


def describe(mode: Any, options: Any, backend: Any) -> str | None:
    """How a ``torch.compile`` call captures CUDA graphs on its own, or None."""
    if isinstance(mode, str) and mode in _CAPTURING_MODES:
        return f"torch.compile(mode={mode!r})"
    if isinstance(options, dict) and options.get("triton.cudagraphs"):
        return "torch.compile(options={'triton.cudagraphs': True})"
    if backend == "cudagraphs":
        return "torch.compile(backend='cudagraphs')"
    return None


def _wrap_compile(original: Callable[..., Any]) -> Callable[..., Any]:
    seen: set[tuple[str, int]] = set()

    @functools.wraps(original)
    def compile(*args: Any, **kwargs: Any) -> Any:
        what = describe(kwargs.get("mode"), kwargs.get("options"), kwargs.get("backend", "inductor"))
        if what is not None:
            at = frames.user_frame(2)
            if (at.file, at.line) not in seen:
                seen.add((at.file, at.line))
                protocol.announce("on_unchecked_graphs", what, at)
        return original(*args, **kwargs)

    return compile


def patches() -> Iterator[tuple[Any, str, Any]]:
    """(owner, attribute, value): ``torch.compile``, announcing self-capturing calls."""
    yield torch, "compile", _wrap_compile(torch.compile)


__all__ = ["describe", "patches"]
