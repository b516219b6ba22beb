"""vLLM PR #51768: an architecture-name denylist, and why the check makes it unnecessary.

The first fix for the narrow-region breakage (PR #51430) was a denylist in the config:
by its architecture name, DeepSeek V4 was kept out of PIECEWISE graphs or sent to
another model runner. But the hazard is not a property of the model: it is a property
of the runner, the eager region and the CUDA-graph mode together. This script shows
that the bundled engine's config has no denylist (every runner, mode and region is
accepted for DeepSeek V4 and resolved as asked), then checks v1/v2 x narrow/wide x
PIECEWISE/FULL and derives the safe set from the findings alone: only V1 with the narrow
region and PIECEWISE graphs fails, so a ban on the name would also have ruled out safe
configurations, and the check, which needs no name, rules out exactly the bad one.

Run it from the repository root, with capturelint installed (``pip install -e .``) or
with ``PYTHONPATH=.``::

    python examples/pr51768_denylist_unnecessary.py [--layers N] [--steps N]

Exit status: 0 when the story holds as told (the config accepts every combination and
the check fails v1 + narrow + PIECEWISE and nothing else), 1 when it does not.

Expected output:

    vLLM PR #51768: an architecture-name denylist for DeepSeek V4, and the check instead
    engine: layers 4, steps 12, seed 0

    1. The engine config has no denylist
       EngineConfig(architecture='DeepseekV4ForCausalLM') accepts 30 of the 30 combinations
       of runner (2) x CUDA-graph mode (5) x eager region (3), each resolved to the runner,
       mode and region asked for.

    2. capturelint check, one runner x eager region x mode at a time
       runner  region  mode       findings   token agreement  max logit error  verdict
       v1      narrow  PIECEWISE  CL101 x4   0.0%             14.8             unsafe
       v1      narrow  FULL       none       100.0%           < 1e-4           safe
       v1      wide    PIECEWISE  none       100.0%           < 1e-4           safe
       v1      wide    FULL       none       100.0%           < 1e-4           safe
       v2      narrow  PIECEWISE  none       100.0%           < 1e-4           safe
       v2      narrow  FULL       none       100.0%           < 1e-4           safe
       v2      wide    PIECEWISE  none       100.0%           < 1e-4           safe
       v2      wide    FULL       none       100.0%           < 1e-4           safe

    3. What the traces say, and what a ban on the name would have done
       unsafe: v1 narrow PIECEWISE; the other 7 are safe
       banning PIECEWISE graphs for DeepseekV4ForCausalLM rules out 4 configurations here, 3
         of them safe (v1 wide, v2 narrow, v2 wide)
       banning Model Runner V1 for DeepseekV4ForCausalLM rules out 4 configurations here, 3
         of them safe (narrow FULL, wide PIECEWISE, wide FULL)

    The story holds: only v1 + narrow + PIECEWISE fails, found from traces; no configuration
    needs to be keyed on the architecture name.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import textwrap

import torch

from capturelint.adapters.bundled.plan import make_plan, run_check
from capturelint.engine.config import DEEPSEEK_V4, EagerRegion, EngineConfig, Runner
from capturelint.runtime.forward_context import CUDAGraphMode
from capturelint.engine.llm import EQUAL_LOGIT_TOLERANCE
from capturelint.errors import CapturelintError
from capturelint.report import ConfigReport
from capturelint.settings import Settings

RUNNERS = ("v1", "v2")
REGIONS = ("narrow", "wide")
MODES = ("PIECEWISE", "FULL")
UNSAFE_AS_TOLD = {("v1", "narrow", "PIECEWISE")}
"""The one combination the history says is broken; every other one checked must pass."""

TOLERANCE = f"{EQUAL_LOGIT_TOLERANCE:.0e}".replace("e-0", "e-")  # 1e-4, as people write it


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4, help="decoder layers (default 4: every attention kind)")
    p.add_argument("--steps", type=int, default=12, help="engine steps of the workload (default 12)")
    return p.parse_args(argv)


def logit_error(x: float) -> str:
    return f"< {TOLERANCE}" if x < EQUAL_LOGIT_TOLERANCE else f"{x:.3g}"


def config_accepts_everything() -> tuple[int, int]:
    """How many (runner, mode, region) combinations ``EngineConfig`` accepts for DeepSeek
    V4 *and* resolves as asked (no runner or mode swapped behind the user's back), of all."""
    combos = list(itertools.product(Runner, CUDAGraphMode, EagerRegion))
    accepted = 0
    for runner, mode, region in combos:
        try:
            cfg = EngineConfig(architecture=DEEPSEEK_V4, runner=runner, cudagraph_mode=mode, eager_region=region).validate()
        except CapturelintError:
            continue
        as_asked = cfg.resolved_runner is runner and cfg.cudagraph_mode is mode
        if region is not EagerRegion.PER_RUNNER:
            as_asked = as_asked and cfg.effective_eager_region is region
        accepted += as_asked
    return accepted, len(combos)


def findings_cell(cfg: ConfigReport) -> str:
    if not cfg.findings:
        return "none"
    codes: dict[str, int] = {}
    for f in cfg.findings:
        codes[f.code] = codes.get(f.code, 0) + 1
    return ", ".join(f"{c} x{n}" for c, n in sorted(codes.items()))


def names(keys: list[tuple[str, str, str]], drop: int) -> str:
    """``v1 wide PIECEWISE`` without the field the ban is on (``drop``)."""
    return ", ".join(" ".join(k[i] for i in range(3) if i != drop) for k in keys)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The engine's tensors are tiny: more intra-op threads only contend for cores.
    torch.set_num_threads(int(os.environ.get("CAPTURELINT_THREADS", "1")))

    print("vLLM PR #51768: an architecture-name denylist for DeepSeek V4, and the check instead")
    print(f"engine: layers {args.layers}, steps {args.steps}, seed 0")

    accepted, total = config_accepts_everything()
    print()
    print("1. The engine config has no denylist")
    print(
        textwrap.fill(
            f"EngineConfig(architecture={DEEPSEEK_V4!r}) accepts {accepted} of the {total} combinations "
            f"of runner ({len(Runner)}) x CUDA-graph mode ({len(CUDAGraphMode)}) x eager region "
            f"({len(EagerRegion)}), each resolved to the runner, mode and region asked for.",
            width=88,
            initial_indent="   ",
            subsequent_indent="   ",
        )
    )

    # The verdict of each combination comes from the findings (the traces); the
    # numbers of the eager twin are shown next to it as a cross-check.
    verdicts: dict[tuple[str, str, str], bool] = {}
    print()
    print("2. capturelint check, one runner x eager region x mode at a time")
    print(f"   {'runner':<7} {'region':<7} {'mode':<10} {'findings':<10} {'token agreement':<16} {'max logit error':<16} verdict")
    for runner, region, mode in itertools.product(RUNNERS, REGIONS, MODES):
        # the replay check alone, as in this story: the invariants that record the decision came
        # after it (examples/invariants/, CL2xx)
        plan = make_plan(Settings(), runner=runner, modes=(mode,), eager_region=region, layers=args.layers, steps=args.steps, default_invariants=False)
        cfg = run_check(plan).configs[0]
        ok = not cfg.findings
        verdicts[(runner, region, mode)] = ok
        n = cfg.numerical
        agreement = f"{n.token_agreement:.1%}" if n is not None else "-"
        error = logit_error(n.max_logit_error) if n is not None else "-"
        print(
            f"   {runner:<7} {region:<7} {mode:<10} {findings_cell(cfg):<10} {agreement:<16} {error:<16} "
            f"{'safe' if ok else 'unsafe'}"
        )

    unsafe = [k for k, ok in verdicts.items() if not ok]
    safe = [k for k, ok in verdicts.items() if ok]
    print()
    print("3. What the traces say, and what a ban on the name would have done")
    print(f"   unsafe: {', '.join(' '.join(k) for k in unsafe) or 'none'}; the other {len(safe)} are safe")
    for label, field, value in (("PIECEWISE graphs", 2, "PIECEWISE"), ("Model Runner V1", 0, "v1")):
        banned = [k for k in verdicts if k[field] == value]
        banned_safe = [k for k in banned if verdicts[k]]
        print(
            textwrap.fill(
                f"banning {label} for {DEEPSEEK_V4} rules out {len(banned)} configurations here, "
                f"{len(banned_safe)} of them safe ({names(banned_safe, field) or 'none'})",
                width=88,
                initial_indent="   ",
                subsequent_indent="     ",
            )
        )

    holds = accepted == total and set(unsafe) == UNSAFE_AS_TOLD
    print()
    if holds:
        text = (
            f"The story holds: only {' + '.join(next(iter(UNSAFE_AS_TOLD)))} fails, found from traces; "
            "no configuration needs to be keyed on the architecture name."
        )
    else:
        text = (
            f"The story does not hold: the config accepts {accepted} of {total} combinations, and the "
            f"check found unsafe: {', '.join(' '.join(k) for k in unsafe) or 'none'}."
        )
    print(textwrap.fill(text, width=88))
    return 0 if holds else 1


if __name__ == "__main__":
    sys.exit(main())
