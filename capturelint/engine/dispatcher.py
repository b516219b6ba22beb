"""Per-step choice of the CUDA-graph runtime mode and the padded batch descriptor."""

from __future__ import annotations

import bisect
from typing import Sequence

from capturelint.runtime.forward_context import BatchDescriptor, CUDAGraphMode


class CudagraphDispatcher:
    """Maps a step (token count, uniform decode or not) to ``(runtime mode, descriptor)``.

    ``FULL_DECODE_ONLY`` is FULL for uniform decode batches and NONE otherwise;
    ``FULL_AND_PIECEWISE`` is FULL for uniform decode and PIECEWISE for mixed batches.
    A batch larger than the largest capture size runs eagerly. PIECEWISE graphs do not
    depend on the batch being uniform, so their descriptor drops the flag.
    """

    def __init__(self, mode: CUDAGraphMode, capture_sizes: Sequence[int]):
        sizes = sorted(set(int(s) for s in capture_sizes))
        if mode is not CUDAGraphMode.NONE and not sizes:
            raise ValueError("capture sizes are empty; give at least one size")
        if any(s <= 0 for s in sizes):
            raise ValueError(f"capture sizes must be positive, got {sizes}")
        self.mode = mode
        self.capture_sizes = sizes

    @property
    def max_capture_size(self) -> int:
        return self.capture_sizes[-1] if self.capture_sizes else 0

    def padded_size(self, num_tokens: int) -> int | None:
        i = bisect.bisect_left(self.capture_sizes, num_tokens)
        return self.capture_sizes[i] if i < len(self.capture_sizes) else None

    def runtime_mode(self, uniform_decode: bool) -> CUDAGraphMode:
        m = self.mode
        if m is CUDAGraphMode.FULL_DECODE_ONLY:
            return CUDAGraphMode.FULL if uniform_decode else CUDAGraphMode.NONE
        if m is CUDAGraphMode.FULL_AND_PIECEWISE:
            return CUDAGraphMode.FULL if uniform_decode else CUDAGraphMode.PIECEWISE
        return m

    def dispatch(self, num_tokens: int, uniform_decode: bool) -> tuple[CUDAGraphMode, BatchDescriptor]:
        mode = self.runtime_mode(uniform_decode)
        padded = self.padded_size(num_tokens)
        if mode is CUDAGraphMode.NONE or padded is None:
            return CUDAGraphMode.NONE, BatchDescriptor(num_tokens, uniform_decode)
        if mode is CUDAGraphMode.PIECEWISE:
            return mode, BatchDescriptor(padded, False)
        return mode, BatchDescriptor(padded, uniform_decode)

    def capture_descriptors(self) -> list[tuple[CUDAGraphMode, BatchDescriptor]]:
        """Every graph the runner captures at start-up, in capture order."""
        out: list[tuple[CUDAGraphMode, BatchDescriptor]] = []
        for size in sorted(self.capture_sizes, reverse=True):
            for uniform in (True, False):
                mode, desc = self.dispatch(size, uniform)
                if mode is not CUDAGraphMode.NONE and (mode, desc) not in out:
                    out.append((mode, desc))
        return out
