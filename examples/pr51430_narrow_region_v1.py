"""vLLM PR #51430: the narrow eager region under Model Runner V1, caught before any eval.

PR #51430 narrowed DeepSeek V4's eager region to cut latency: the attention's input
preparation (q norm and RoPE, the KV-cache insert, the compressors) moved into the
captured graph, leaving only the sparse indexer and the attention kernel eager. Under
Model Runner V1 a PIECEWISE capture is a dummy run without attention metadata, so the
graph recorded the profile-run branch, and every replay skipped the KV-cache write:
GSM8K fell from 0.94 to 0.04. This script first shows the garbage the way a user would
meet it (the engine against its eager twin), then shows capturelint's CL101 finding,
which names the op, the layer and both source lines from traces alone, on a CPU, with
no eval run.

Run it from the repository root, with capturelint installed (``pip install -e .``) or
with ``PYTHONPATH=.``::

    python examples/pr51430_narrow_region_v1.py [--layers N] [--steps N]

Exit status: 0 when the story holds as told (replay diverges from eager, and the check
reports CL101 and would exit 1), 1 when it does not.

Expected output:

    vLLM PR #51430: DeepSeek V4, Model Runner V1, PIECEWISE graphs, narrow eager region
    engine: layers 4, steps 12, seed 0

    1. The engine against its eager twin (same weights and workload, graphs off)
       request 0, eager twin: 127 148 45 22 148 148 190 83 190 83 90 90
       request 0, graphs:     221 205 252 244 75 87 61 7 152 116 198 41
       token agreement:       0.0% of 45 generated tokens
       first divergent step:  1 of 12 (a replay of graph mixed/32)
       max logit error:       14.8 (replay equal to eager stays below 1e-4)

    2. capturelint check --runner v1 --eager-region narrow --mode PIECEWISE --layers 4 --steps 12
       CL101 in the attention of 4 of the model's 4 layers; the first:
       CL101 baked-control-flow [R1] in model.layers.0.attn, segment mixed/32 #0 captured
         captured op: aten.constant_pad_nd.default
         capture:     capturelint/engine/dsv4/attention.py:305 in _fused_qnorm_rope_kv_insert
         step:        capturelint/engine/dsv4/attention.py:307 in _fused_qnorm_rope_kv_insert
         seen at replay steps 1, 2, 3, 4, 5 (12 times in all)
         captured segment mixed/32 #0 captured recorded aten.constant_pad_nd.default at
         capturelint/engine/dsv4/attention.py:305 where replay step 1 runs
         aten.new_empty.default at capturelint/engine/dsv4/attention.py:307: the capture
         recorded another branch than the step runs (2 ops of the step missing from the
         graph: aten.new_empty.default, dsv4.fused_qnorm_rope_kv_insert.default; 1 extra:
         aten.constant_pad_nd.default). The forward context differed at capture:
         attn_metadata was None (a dummy or profile run: no attention metadata), while at
         the step attn_metadata held 9 entries; code that branches on it took another path
         at capture. Replay re-issues the recorded ops, so the step's ops never run. Move
         the branching code into an eager break, or make the capture take the path real
         steps take.
       exit status 1; findings by code: CL101 x4

    The story holds: replay diverges from eager execution (0.0% token agreement), and
    capturelint reports CL101 in _fused_qnorm_rope_kv_insert, from traces alone, with no
    GSM8K run.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap

import torch

from capturelint.adapters.bundled.plan import make_plan, run_check
from capturelint.cli import EXIT_CLEAN, EXIT_FINDINGS
from capturelint.engine.config import EngineConfig
from capturelint.engine.llm import EQUAL_LOGIT_TOLERANCE, run_with_eager_twin
from capturelint.findings import Finding
from capturelint.settings import Settings

RUNNER, MODE, REGION = "v1", "PIECEWISE", "narrow"
SHOWN_TOKENS = 12
"""Tokens of request 0 printed per run: enough to see that the graphs' run never
produces what the eager run produces."""
TOLERANCE = f"{EQUAL_LOGIT_TOLERANCE:.0e}".replace("e-0", "e-")  # 1e-4, as people write it


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4, help="decoder layers (default 4: every attention kind)")
    p.add_argument("--steps", type=int, default=12, help="engine steps of the workload (default 12)")
    return p.parse_args(argv)


def tokens(seq: tuple[int, ...]) -> str:
    return " ".join(str(t) for t in seq[:SHOWN_TOKENS])


def logit_error(x: float) -> str:
    return f"< {TOLERANCE}" if x < EQUAL_LOGIT_TOLERANCE else f"{x:.3g}"


def print_finding(f: Finding, indent: str) -> None:
    print(f"{indent}{f.code} {f.name} [{f.condition}] in {f.scope}, segment {f.segment}")
    print(f"{indent}  captured op: {f.op}")
    if f.capture_frame is not None:
        print(f"{indent}  capture:     {f.capture_frame}")
    if f.shadow_frame is not None:
        print(f"{indent}  step:        {f.shadow_frame}")
    if f.steps:
        print(f"{indent}  seen at replay steps {', '.join(map(str, f.steps))} ({f.occurrences} times in all)")
    print(textwrap.fill(f.message, width=88, initial_indent=indent + "  ", subsequent_indent=indent + "  "))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The engine's tensors are tiny: more intra-op threads only contend for cores.
    torch.set_num_threads(int(os.environ.get("CAPTURELINT_THREADS", "1")))

    print(f"vLLM PR #51430: DeepSeek V4, Model Runner V1, {MODE} graphs, {REGION} eager region")
    print(f"engine: layers {args.layers}, steps {args.steps}, seed 0")

    # 1. What a user sees: generations that have nothing to do with the model's.
    config = EngineConfig(runner=RUNNER, cudagraph_mode=MODE, eager_region=REGION, num_layers=args.layers, steps=args.steps)
    twin = run_with_eager_twin(config)
    generated = sum(len(t) for t in twin.eager.tokens)
    print()
    print("1. The engine against its eager twin (same weights and workload, graphs off)")
    print(f"   request 0, eager twin: {tokens(twin.eager.tokens[0])}")
    print(f"   request 0, graphs:     {tokens(twin.captured.tokens[0])}")
    print(f"   token agreement:       {twin.comparison.token_agreement:.1%} of {generated} generated tokens")
    step = twin.first_divergent_step
    if step is None:
        print("   first divergent step:  none")
    else:
        record = twin.captured.steps[step]
        how = f"a replay of graph {record.descriptor}" if record.descriptor is not None else "run eagerly"
        # counted from 1, as the check counts replay steps
        print(f"   first divergent step:  {step + 1} of {len(twin.captured.steps)} ({how})")
    print(
        f"   max logit error:       {logit_error(twin.comparison.max_logit_error)} "
        f"(replay equal to eager stays below {TOLERANCE})"
    )

    # 2. What capturelint says, from the traces of capture, shadow and replay.
    # the replay check alone, as in this story: the invariants that record the decision came
    # after it (examples/invariants/, CL2xx)
    plan = make_plan(Settings(), runner=RUNNER, modes=(MODE,), eager_region=REGION, layers=args.layers, steps=args.steps, default_invariants=False)
    report = run_check(plan)
    status = EXIT_FINDINGS if report.failed else EXIT_CLEAN
    cl101 = [f for f in report.findings if f.code == "CL101"]
    print()
    print(
        f"2. capturelint check --runner {RUNNER} --eager-region {REGION} --mode {MODE} "
        f"--layers {args.layers} --steps {args.steps}"
    )
    if cl101:
        layers = len({f.scope for f in cl101})
        print(f"   CL101 in the attention of {layers} of the model's {args.layers} layers; the first:")
        print_finding(cl101[0], "   ")
    codes = ", ".join(f"{code} x{n}" for code, n in report.summary_json()["by_code"].items()) or "none"
    print(f"   exit status {status}; findings by code: {codes}")

    holds = not twin.matches_eager and bool(cl101) and status == EXIT_FINDINGS
    if holds:
        where = cl101[0].capture_frame.function if cl101[0].capture_frame else cl101[0].op
        text = (
            f"The story holds: replay diverges from eager execution "
            f"({twin.comparison.token_agreement:.1%} token agreement), and capturelint reports CL101 in "
            f"{where}, from traces alone, with no GSM8K run."
        )
    else:
        text = (
            f"The story does not hold: replay {'matches' if twin.matches_eager else 'diverges from'} eager "
            f"execution and capturelint reported {len(cl101)} CL101 findings (exit status {status})."
        )
    print()
    print(textwrap.fill(text, width=88))
    return 0 if holds else 1


if __name__ == "__main__":
    sys.exit(main())
