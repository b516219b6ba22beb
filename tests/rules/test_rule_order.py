"""The rules are pure: each reads a view and returns findings, so the rule set finds the
same things in any order. Real checks (the bundled engine, the hazard toys) run with
the registry's order, reversed, and shuffled with several seeds, and must report the
same findings, byte for byte."""

import random

import pytest

from capturelint.rules import RULES
from capturelint.runtime.forward_context import CUDAGraphMode
from capturelint.runtime.protocol import BreakOutputs
from toy_engine import check_toy

COPY, DISCARD = BreakOutputs.COPY, BreakOutputs.DISCARD

ORDERS = [tuple(reversed(RULES))] + [tuple(random.Random(seed).sample(RULES, len(RULES))) for seed in range(4)]


def _json(result) -> list[dict]:
    return [f.to_json() for f in result.findings]


@pytest.mark.parametrize(
    "hazard, mode, policy, codes",
    [
        ("shape", CUDAGraphMode.PIECEWISE, COPY, ["CL103"]),
        ("shape", CUDAGraphMode.FULL, COPY, ["CL103"]),  # its follow-ons are not repeated
        ("stale_input", CUDAGraphMode.FULL, COPY, ["CL104"]),
        ("escaped_output", CUDAGraphMode.PIECEWISE, COPY, ["CL105"]),
        ("returned_output", CUDAGraphMode.PIECEWISE, DISCARD, ["CL105"]),
        ("break_arg", CUDAGraphMode.PIECEWISE, DISCARD, ["CL107", "CL105"]),
        ("break_scalar", CUDAGraphMode.PIECEWISE, COPY, ["CL107"]),
        # the shape mismatch follows from the baked size: CL103 must not report it, whether
        # it runs before CL102 or after
        ("host_shape", CUDAGraphMode.PIECEWISE, COPY, ["CL102"]),
    ],
)
def test_toy_findings_do_not_depend_on_rule_order(hazard, mode, policy, codes):
    base, _ = check_toy(hazard, mode=mode, break_outputs=policy)
    assert [f.code for f in base.findings] == codes
    for order in ORDERS:
        shuffled, _ = check_toy(hazard, mode=mode, break_outputs=policy, rules=order)
        assert _json(shuffled) == _json(base), [r.code for r in order]


@pytest.mark.parametrize(
    "mode, fresh, codes",
    [
        ("PIECEWISE", False, {"CL101", "CL201"}),  # the headline case: V1, narrow region
        ("FULL_AND_PIECEWISE", True, {"CL101", "CL104", "CL201"}),  # and re-allocated metadata besides
    ],
)
def test_bundled_engine_findings_do_not_depend_on_rule_order(mode, fresh, codes):
    from capturelint.adapters.bundled import plan as bundled
    from capturelint.harness import trace_run
    from capturelint.options import EngineOptions
    from capturelint.settings import Settings

    plan = bundled.make_plan(Settings(), EngineOptions.of(runner="v1", modes=(mode,), eager_region="narrow", layers=1,
                                                          steps=6, fresh_metadata=fresh))

    def check(rules):
        c = bundled.configuration(plan, *plan.configurations[0])
        return trace_run(c.run, c.roots, c.label, probe=c.probe, scope_group=c.scope_group,
                         invariants=c.invariants, rules=rules)

    base = check(RULES)
    assert {f.code for f in base.findings} == codes
    for order in ORDERS:
        assert _json(check(order)) == _json(base), [r.code for r in order]
