"""vLLM PR #52401: the eager region chosen per runner, checked clean under both runners.

The second fix kept the narrow region where it is safe and gave it up where it is not:
the wide region under Model Runner V1, whose PIECEWISE capture runs without attention
metadata, and the narrow one under V2, whose capture builds real metadata. That is the
bundled engine's default eager region, ``per-runner``. This script runs what a CI job
would run, ``capturelint check --runner v1`` and ``--runner v2`` over every CUDA-graph
mode with the default region, and shows that both come out clean: no findings, every
replay equal to its eager twin, exit status 0.

Run it from the repository root, with capturelint installed (``pip install -e .``) or
with ``PYTHONPATH=.``::

    python examples/pr52401_per_runner_region.py [--layers N] [--steps N]

Exit status: 0 when the story holds as told (both checks clean, every mode replayed
graphs that matched eager execution, the region resolved to wide under V1 and narrow
under V2), 1 when it does not.

Expected output:

    vLLM PR #52401: the eager region per runner (wide under V1, narrow under V2)
    engine: layers 4, steps 12, seed 0, modes PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE

    capturelint check --runner v1 --layers 4 --steps 12   (eager region per-runner: wide)
      mode                region  graphs replay steps findings  token agreement  max step error
      PIECEWISE           wide         6           12        0  100.0%           < 1e-4
      FULL                wide        12           12        0  100.0%           < 1e-4
      FULL_DECODE_ONLY    wide         6            6        0  100.0%           < 1e-4
      FULL_AND_PIECEWISE  wide        12           12        0  100.0%           < 1e-4
      exit status 0: no findings in 4 configurations: replay matches eager execution

    capturelint check --runner v2 --layers 4 --steps 12   (eager region per-runner: narrow)
      mode                region  graphs replay steps findings  token agreement  max step error
      PIECEWISE           narrow       6           12        0  100.0%           < 1e-4
      FULL                narrow      12           12        0  100.0%           < 1e-4
      FULL_DECODE_ONLY    narrow       6            6        0  100.0%           < 1e-4
      FULL_AND_PIECEWISE  narrow      12           12        0  100.0%           < 1e-4
      exit status 0: no findings in 4 configurations: replay matches eager execution

    The story holds: with the per-runner region both runners pass in all 4 modes, every
    replay equal to eager execution; capturelint check exits 0 for each.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap

import torch

from capturelint.adapters.bundled.plan import CHECK_MODES, make_plan, run_check
from capturelint.cli import EXIT_CLEAN, EXIT_FINDINGS
from capturelint.engine.config import EngineConfig
from capturelint.rules.cl901_unexplained_divergence import STEP_TOLERANCE
from capturelint.settings import Settings

RUNNERS = ("v1", "v2")
TOLERANCE = f"{STEP_TOLERANCE:.0e}".replace("e-0", "e-")  # 1e-4, as people write it


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4, help="decoder layers (default 4: every attention kind)")
    p.add_argument("--steps", type=int, default=12, help="engine steps of the workload (default 12)")
    return p.parse_args(argv)


def step_error(x: float) -> str:
    return f"< {TOLERANCE}" if x < STEP_TOLERANCE else f"{x:.3g}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The engine's tensors are tiny: more intra-op threads only contend for cores.
    torch.set_num_threads(int(os.environ.get("CAPTURELINT_THREADS", "1")))

    regions = {r: str(EngineConfig(runner=r).effective_eager_region) for r in RUNNERS}
    print("vLLM PR #52401: the eager region per runner (wide under V1, narrow under V2)")
    print(f"engine: layers {args.layers}, steps {args.steps}, seed 0, modes {', '.join(CHECK_MODES)}")

    problems: list[str] = []
    for runner in RUNNERS:
        # No eager region given: the default, per-runner, as a CI job would run it.
        plan = make_plan(Settings(), runner=runner, layers=args.layers, steps=args.steps)
        report = run_check(plan)
        status = EXIT_FINDINGS if report.failed else EXIT_CLEAN
        print()
        print(
            f"capturelint check --runner {runner} --layers {args.layers} --steps {args.steps}"
            f"   (eager region {plan.eager_region}: {regions[runner]})"
        )
        print(
            f"  {'mode':<19} {'region':<7} {'graphs':>6} {'replay steps':>12} {'findings':>8}  "
            f"{'token agreement':<16} max step error"
        )
        for cfg in report.configs:
            n = cfg.numerical
            agreement = f"{n.token_agreement:.1%}" if n is not None else "-"
            error = step_error(n.max_step_error) if n is not None else "-"
            replays = n.replay_steps if n is not None else 0
            print(
                f"  {cfg.mode:<19} {cfg.eager_region:<7} {len(cfg.graphs):>6} {replays:>12} {len(cfg.findings):>8}  "
                f"{agreement:<16} {error}"
            )
            where = f"{runner} {cfg.mode}"
            if cfg.findings:
                problems.append(f"{where} has findings")
            if n is None or n.token_agreement < 1.0 or n.max_step_error >= STEP_TOLERANCE:
                problems.append(f"{where} diverges from eager execution")
            if n is None or n.replay_steps == 0:
                problems.append(f"{where} replayed no graph, so it checked nothing")
        print(f"  exit status {status}: {report.summary_line()}")
    for runner, region in (("v1", "wide"), ("v2", "narrow")):
        if regions[runner] != region:
            problems.append(f"per-runner resolves to {regions[runner]} under {runner}, not {region}")
    holds = not problems

    print()
    if holds:
        text = (
            f"The story holds: with the per-runner region both runners pass in all {len(CHECK_MODES)} modes, "
            "every replay equal to eager execution; capturelint check exits 0 for each."
        )
    else:
        text = f"The story does not hold: {'; '.join(problems)}."
    print(textwrap.fill(text, width=88))
    return 0 if holds else 1


if __name__ == "__main__":
    sys.exit(main())
