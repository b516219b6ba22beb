"""Benchmark of `capturelint check` on the bundled engine (not a test; numbers go to
BENCHMARKS.md with the machine they were measured on).

Reports, in one run:
- the wall time of `capturelint check --runner R` (all four modes, shadow and twin
  included) for each runner;
- per runner and mode, the ratio of a traced run to an untraced run of the same
  workload, each the best of --repeat runs, in two forms:
  * `check/engine-run`: what `capturelint check` does for one configuration (the
    generation traced, every replay step shadowed and analyzed, plus the eager twin)
    over what `capturelint engine run` does for it (the same generation untraced, plus
    the same eager twin): the cost of checking over the cost of the numerical
    comparison alone;
  * `traced/untraced generation`: the generation alone, traced or not (no twin on
    either side): the tracer's own overhead, shadows included.

    python bench/bench_check.py [--repeat 3] [--layers 4] [--steps 24] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch

from capturelint.analyzer import RunLabel
from capturelint.adapters.bundled.plan import CHECK_MODES, engine_config, forward_context_probe, layer_scope_group, make_plan, run_check
from capturelint.engine.llm import Engine
from capturelint.harness import trace_run
from capturelint.settings import Settings


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("CAPTURELINT_THREADS", "1")))  # as the CLI does
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads"
    rows = []
    check_times = {}
    for runner in ("v1", "v2"):
        plan = make_plan(Settings(), runner=runner, layers=args.layers, steps=args.steps)
        check_times[runner] = best_of(1, lambda: run_check(plan))
        for mode in CHECK_MODES:
            cfg = engine_config(plan, runner, mode)

            def untraced() -> None:
                with torch.no_grad():
                    Engine(cfg).generate()

            def twin() -> None:
                with torch.no_grad():
                    Engine(cfg.eager_twin()).generate()

            def traced() -> None:
                engine = Engine(cfg)
                roots = {"model": engine.model, "state": list(engine.runner.named_state_tensors())}
                trace_run(engine.generate, roots, RunLabel(runner, mode), plan.codes, probe=forward_context_probe,
                          scope_group=layer_scope_group)

            t_u = best_of(args.repeat, untraced)
            t_t = best_of(args.repeat, traced)
            t_e = best_of(args.repeat, twin)
            rows.append({
                "runner": runner, "mode": mode, "untraced_s": round(t_u, 3), "traced_s": round(t_t, 3),
                "twin_s": round(t_e, 3), "generation_ratio": round(t_t / t_u, 2),
                "check_over_engine_run": round((t_t + t_e) / (t_u + t_e), 2),
            })
    out = {"machine": machine, "check_wall_s": {k: round(v, 2) for k, v in check_times.items()}, "runs": rows}
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
        return
    print(f"machine: {machine}")
    for r, t in check_times.items():
        print(f"capturelint check --runner {r}: {t:.2f} s (4 modes, shadow and eager twin included)")
    print(f"{'runner':6} {'mode':20} {'untraced s':>10} {'traced s':>9} {'twin s':>7} {'traced/untraced':>16} {'check/engine-run':>17}")
    for r in rows:
        print(f"{r['runner']:6} {r['mode']:20} {r['untraced_s']:>10.3f} {r['traced_s']:>9.3f} {r['twin_s']:>7.3f} "
              f"{r['generation_ratio']:>16.2f} {r['check_over_engine_run']:>17.2f}")
    print(f"max check/engine-run ratio: {max(r['check_over_engine_run'] for r in rows):.2f}; "
          f"max traced/untraced generation ratio: {max(r['generation_ratio'] for r in rows):.2f}")


if __name__ == "__main__":
    main()
