"""What the tracer costs per recorded op (not a test; the figure goes in the tracer's
docstring and BENCHMARKS.md with the machine).

A bare emulated CUDA graph captures a chain of N small elementwise ops (two per
iteration, on a 16-element tensor, so the op itself costs next to nothing); the capture
is timed with and without the tracer, and the difference divided by the ops recorded is
the per-op cost of recording: the dispatch-mode hop, the source-frame walk (cached per
code object and line), the storage bookkeeping and the record itself. A second figure
runs the same chain with the frame walk replaced by a constant, to show its share.

    python bench/bench_ops.py [--ops 20000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import platform
import os
import statistics
import time

import torch

import capturelint.tracer as tracer_module
from capturelint.analyzer import RunLabel
from capturelint.harness import trace_run
from capturelint.runtime.emulated import EmulatedCUDAGraph, emulate_cuda
from capturelint.runtime.protocol import Frame


def chain(x: torch.Tensor, n: int) -> torch.Tensor:
    for _ in range(n):
        x = x * 1.0001 + 0.5
    return x


def capture(n: int) -> None:
    static = torch.ones(16)
    g = EmulatedCUDAGraph()
    g.capture_begin()
    chain(static, n)
    g.capture_end()


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    n = args.ops // 2
    label = RunLabel("bench", "FULL")
    with emulate_cuda(force=True):
        capture(100)  # warm up the dispatcher and the caches
        plain = statistics.median(timed(lambda: capture(n)) for _ in range(args.repeat))
        traced = statistics.median(
            timed(lambda: trace_run(lambda: capture(n), {}, label, frozenset())) for _ in range(args.repeat))
        fixed = Frame("bench.py", 1, "chain")
        real = tracer_module.user_frame
        tracer_module.user_frame = lambda skip: fixed
        try:
            no_walk = statistics.median(
                timed(lambda: trace_run(lambda: capture(n), {}, label, frozenset())) for _ in range(args.repeat))
        finally:
            tracer_module.user_frame = real
    ops = 2 * n
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, 1 thread; "
          f"{ops} ops captured, medians of {args.repeat}")
    print(f"capture without the tracer: {plain / ops * 1e6:.1f} us/op")
    print(f"capture with the tracer:    {traced / ops * 1e6:.1f} us/op  (recording: {(traced - plain) / ops * 1e6:.1f} us/op)")
    print(f"  of which the frame walk:  {(traced - no_walk) / ops * 1e6:.1f} us/op")


if __name__ == "__main__":
    main()
