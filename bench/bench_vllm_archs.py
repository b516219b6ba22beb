"""Benchmark of `capturelint check --engine vllm --model ...` per architecture, and the
renewal of the architecture table (not a test; numbers go to BENCHMARKS.md with the
machine they were measured on).

Measures whole processes (vLLM's import included, the budget of issue 27: at most 60 s
for one architecture's default check on two cores): each supported architecture's
default check (`--model ARCH`: v1 and v2, PIECEWISE and FULL, its default layers and the
serving workload), then `--model all`, sharded `--shard K/N` (the jobs of a CI matrix)
and joined with `capturelint merge`. With `--write` each architecture's report is stored
as `tests/vllm/data/model_all/ARCH.json` and the table of all stored reports as
`docs/vllm-architectures.md` (`tests/vllm/test_vllm_archs.py` checks that they agree).
`--model ARCH` (repeatable) runs only those architectures' checks and no `--model all`
(renewing one family's stored reports).

    python bench/bench_vllm_archs.py [--shards 3] [--model ARCH]... [--write] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


CPU: dict[str, float] = {}  # CPU seconds (user + system) of each command's process, by the last wall measured


def timed(argv: list[str]) -> tuple[float, int]:
    """Wall seconds and exit status of ``argv``; its CPU seconds go to ``CPU`` (on a
    shared, loaded machine the CPU time is the figure that survives the load)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, cwd=ROOT)
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU[" ".join(argv[3:])] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, done.returncode


def main() -> None:
    from capturelint.adapters.vllm import archs

    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--write", action="store_true", help="store the joined report and docs/vllm-architectures.md")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--model", action="append", choices=archs.SUPPORTED, help="only these architectures, no --model all")
    args = ap.parse_args()
    cli = [sys.executable, "-m", "capturelint"]
    results: dict[str, float] = {}
    statuses: dict[str, int] = {}
    stored = ROOT / "tests" / "vllm" / "data" / "model_all"
    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.model or archs.SUPPORTED:
            name = f"check --engine vllm --model {arch}"
            out = os.path.join(tmp, f"{arch}.json")
            results[name], statuses[name] = timed([*cli, "check", "--engine", "vllm", "--model", arch, "--jobs", "1",
                                                   "--format", "json", "-o", out])
            if args.write:
                report = json.loads(Path(out).read_text())
                (stored / f"{arch}.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
        if args.write:
            reports = [json.loads((stored / f"{a}.json").read_text()) for a in archs.SUPPORTED]
            (ROOT / "docs" / "vllm-architectures.md").write_text(archs.markdown(reports))
    if not args.model:
        with tempfile.TemporaryDirectory() as tmp:
            shards = []
            for k in range(1, args.shards + 1):
                out = os.path.join(tmp, f"shard{k}.json")
                name = f"check --model all --shard {k}/{args.shards}"
                results[name], statuses[name] = timed([*cli, "check", "--engine", "vllm", "--model", "all", "--jobs",
                                                       "1", "--shard", f"{k}/{args.shards}", "--format", "json", "-o",
                                                       out])
                shards.append(out)
            joined = os.path.join(tmp, "all.json")
            results["merge"], statuses["merge"] = timed([*cli, "merge", *shards, "--format", "json", "-o", joined])
            results["--model all, sharded (sum)"] = sum(v for k, v in results.items() if "--shard" in k)
            if args.write:  # the sharded --model all gives the rows the per-architecture reports give
                reports = [json.loads((stored / f"{a}.json").read_text()) for a in archs.SUPPORTED]
                same = archs.table(json.loads(Path(joined).read_text())) == archs.table(reports)
                print(f"--model all, sharded and merged, makes the stored reports' table: {same}", file=sys.stderr)
    machine = (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, load average "
               f"{os.getloadavg()[0]:.1f} at the end")
    if args.json:
        print(json.dumps({"machine": machine, "seconds": results, "cpu_seconds": CPU, "exit": statuses}, indent=2))
        return
    print(f"machine: {machine}")
    print("| command | wall (s) | CPU (s) | exit |")
    print("|---|---|---|---|")
    cpu = list(CPU.values())
    for i, (name, seconds) in enumerate(results.items()):
        used = f"{cpu[i]:.1f}" if i < len(cpu) else ""
        print(f"| {name} | {seconds:.1f} | {used} | {statuses.get(name, '')} |")


if __name__ == "__main__":
    main()
