"""The forward context: what a model reads about the step it is running.

The runner sets it around each forward; model code reads it with
``get_forward_context()``. A captured graph cannot read it on replay (there is no
Python in a replay), which is why what the model does with it decides whether a
region may be captured.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Iterator

from capturelint.runtime.protocol import CUDAGraphMode  # noqa: F401  (defined with the vocabulary; used here)


@dataclasses.dataclass(frozen=True, order=True)
class BatchDescriptor:
    """Key of a captured graph: padded token count and whether every request decodes."""

    num_tokens: int
    uniform_decode: bool

    def __str__(self) -> str:
        kind = "decode" if self.uniform_decode else "mixed"
        return f"{kind}/{self.num_tokens}"


@dataclasses.dataclass
class ForwardContext:
    """State of one forward.

    ``attn_metadata`` maps a layer-cache prefix (``"layers.0.swa"``) to that cache's
    metadata object, or is ``None`` during profile and dummy runs.
    """

    attn_metadata: dict[str, Any] | None
    cudagraph_runtime_mode: CUDAGraphMode = CUDAGraphMode.NONE
    batch_descriptor: BatchDescriptor | None = None


_local = threading.local()


def get_forward_context() -> ForwardContext:
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        raise RuntimeError(
            "no forward context is set; run the model inside set_forward_context(...)"
        )
    return ctx


def has_forward_context() -> bool:
    return getattr(_local, "ctx", None) is not None


@contextlib.contextmanager
def set_forward_context(
    attn_metadata: dict[str, Any] | None,
    cudagraph_runtime_mode: CUDAGraphMode = CUDAGraphMode.NONE,
    batch_descriptor: BatchDescriptor | None = None,
) -> Iterator[ForwardContext]:
    previous = getattr(_local, "ctx", None)
    ctx = ForwardContext(attn_metadata, cudagraph_runtime_mode, batch_descriptor)
    _local.ctx = ctx
    try:
        yield ctx
    finally:
        _local.ctx = previous
