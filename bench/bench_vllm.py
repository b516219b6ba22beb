"""Benchmark of `capturelint check --engine vllm` (not a test; numbers go to
BENCHMARKS.md with the machine they were measured on).

Measures, in one run, medians of --repeat whole processes each:
- import: `import vllm` plus the DeepSeek V4 FlashMLA attention module, for the CPU
  target (what every `--engine vllm` command pays first);
- the matrix: `capturelint check --engine vllm` at its defaults (v1 and v2, PIECEWISE and
  FULL; three layers, one of each kind; the serving workload: prefill, mixed, padded and
  full steps over two capture sizes), the two acceptance commands `--runner v1
  --eager-region narrow` and `--runner v2 --eager-region narrow`, `--spec mtp`; PIECEWISE
  runs vLLM's own model runners (the default), and once more on capturelint's
  reproduction of their capture conditions (`CAPTURELINT_VLLM_RUNNER_IMPL=shim`);
- an untraced run of one configuration (v1 PIECEWISE at the defaults: build, capture, the
  six steps, no tracer, no twin; the second in the process, after the lazy imports and
  first-call costs that a check pays once) as the unit the ratios are expressed in, so they survive
  a noisy machine.

    python bench/bench_vllm.py [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

IMPORT = ("import os; os.environ.setdefault('VLLM_TARGET_DEVICE','cpu'); os.environ.setdefault('VLLM_LOGGING_LEVEL','ERROR'); "
          "import vllm, vllm.models.deepseek_v4.nvidia.flashmla")
UNTRACED = """
import os, time
from capturelint.adapters.vllm.install import cpu_shim
from capturelint.adapters.vllm.runners.reproduced import ReproducedLoop
from capturelint.adapters.vllm.workload import RunSpec
with cpu_shim():
    ReproducedLoop(RunSpec()).generate()  # once for the lazy imports and first-call costs a check pays once too
    t0 = time.perf_counter()
    ReproducedLoop(RunSpec()).generate()  # v1 PIECEWISE, the default model and workload
    print(time.perf_counter() - t0)
"""
COMMANDS = {
    "check --engine vllm (4 configurations)": ["check", "--engine", "vllm", "--format", "json"],
    "check --engine vllm --jobs 1": ["check", "--engine", "vllm", "--jobs", "1", "--format", "json"],
    "check --engine vllm, PIECEWISE on the reproduction (CAPTURELINT_VLLM_RUNNER_IMPL=shim)": [
        "check", "--engine", "vllm", "--format", "json"],
    "check --engine vllm --runner v1 --eager-region narrow": ["check", "--engine", "vllm", "--runner", "v1",
                                                              "--eager-region", "narrow", "--format", "json"],
    "check --engine vllm --runner v2 --eager-region narrow": ["check", "--engine", "vllm", "--runner", "v2",
                                                              "--eager-region", "narrow", "--format", "json"],
    "check --engine vllm --spec mtp": ["check", "--engine", "vllm", "--spec", "mtp", "--format", "json"],
}
ENV = {"check --engine vllm, PIECEWISE on the reproduction (CAPTURELINT_VLLM_RUNNER_IMPL=shim)":
       {"CAPTURELINT_VLLM_RUNNER_IMPL": "shim"}}


def wall(argv: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                   env={**os.environ, **(env or {})})
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    py = sys.executable
    results: dict[str, float] = {}
    results["import vLLM (DSV4 path)"] = statistics.median(wall([py, "-c", IMPORT]) for _ in range(args.repeat))
    runs = []
    for _ in range(args.repeat):
        out = subprocess.run([py, "-c", UNTRACED], capture_output=True, text=True, check=True)
        runs.append(float(out.stdout.strip().splitlines()[-1]))
    unit = statistics.median(runs)
    results["untraced run, v1 PIECEWISE (in process, after import)"] = unit
    for name, argv in COMMANDS.items():
        results[name] = statistics.median(wall([py, "-m", "capturelint.cli", *argv], ENV.get(name))
                                          for _ in range(args.repeat))
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    if args.json:
        print(json.dumps({"machine": machine, "seconds": results}, indent=2))
        return
    imp = results["import vLLM (DSV4 path)"]
    print(f"machine: {machine}; medians of {args.repeat} processes")
    print("| workload | wall (s) | minus import, in untraced runs |")
    print("|---|---|---|")
    for name, seconds in results.items():
        ratio = "" if name.startswith(("import", "untraced")) else f"{(seconds - imp) / unit:.1f}"
        print(f"| {name} | {seconds:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
