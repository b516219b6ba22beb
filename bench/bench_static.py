"""Benchmark of `capturelint check --static` against the full check of the same
configuration (not a test; numbers go to BENCHMARKS.md with the machine).

Runs both commands as a user does (a fresh process each, torch import included),
alternating static and full, --repeat times each, and reports the median wall time of
each and their ratio.

    python bench/bench_static.py [--repeat 3] [-- extra check arguments]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time


def wall(args: list[str]) -> tuple[float, int]:
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "capturelint.cli", "check", *args], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, env=dict(os.environ, CAPTURELINT_THREADS="1"))
    return time.perf_counter() - t, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("extra", nargs="*", default=["--runner", "v1", "--eager-region", "narrow", "--format", "json"])
    a = parser.parse_args()
    times: dict[str, list[float]] = {"static": [], "full": []}
    codes: dict[str, set[int]] = {"static": set(), "full": set()}
    for _ in range(a.repeat):
        for kind, flags in (("static", ["--static"]), ("full", [])):
            s, rc = wall(flags + a.extra)
            times[kind].append(s)
            codes[kind].add(rc)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}")
    print(f"command: capturelint check [--static] {' '.join(a.extra)}")
    for kind in times:
        print(f"{kind}: runs {[round(t, 2) for t in times[kind]]} s, median {statistics.median(times[kind]):.2f} s, "
              f"exit {sorted(codes[kind])}")
    print(f"static/full (medians): {statistics.median(times['static']) / statistics.median(times['full']):.2f}")


if __name__ == "__main__":
    main()
