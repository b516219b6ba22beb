"""For every configuration of the engine's outcome matrix, the structural verdict (any
finding) and the numerical verdict (replay diverges from eager) agree, and both agree
with the matrix in docs/engine.md.

The default suite runs the matrix on a small engine (2 layers: a sliding-window and an
indexer layer; 8 steps, enough for a uniform decode batch that FULL_DECODE_ONLY
replays), about a tenth of the work; the engine's default size (4 layers, 24 steps) is
the opt-in ``slow`` job (``python -m pytest -m slow``, see README.md, "Tests")."""

import pytest

from capturelint.adapters.registry import make_plan
from capturelint.adapters.registry import engine_options
from capturelint.settings import Settings

WRONG, EQUAL = "wrong", "equal"
MATRIX = [
    ("v1", "PIECEWISE", "narrow", False, WRONG),
    ("v1", "PIECEWISE", "wide", False, EQUAL),
    ("v1", "PIECEWISE", "per-runner", False, EQUAL),
    ("v2", "PIECEWISE", "narrow", False, EQUAL),
    ("v2", "PIECEWISE", "per-runner", False, EQUAL),
    ("v1", "FULL", "narrow", False, EQUAL),
    ("v2", "FULL", "narrow", False, EQUAL),
    ("v1", "FULL_DECODE_ONLY", "narrow", False, EQUAL),
    ("v2", "FULL_DECODE_ONLY", "narrow", False, EQUAL),
    ("v1", "FULL", "per-runner", True, WRONG),
]


SMALL = {"layers": 2, "steps": 8}
DEFAULT_SIZE: dict = {}  # the engine's defaults


@pytest.mark.parametrize("size", [pytest.param(SMALL, id="small"),
                                  pytest.param(DEFAULT_SIZE, id="default-size", marks=pytest.mark.slow)])
@pytest.mark.parametrize("runner, mode, region, fresh, expected", MATRIX)
def test_structural_and_numerical_verdicts_agree(cached_configurations, runner, mode, region, fresh, expected, size):
    plan = make_plan(Settings(), engine_options(runner=runner, modes=(mode,), eager_region=region, fresh_metadata=fresh,
                                                **size))
    cfg = cached_configurations(plan, *plan.configurations[0])
    n = cfg.numerical
    numerically_wrong = n.token_agreement < 1.0 or n.max_step_error > 1e-4
    structurally_wrong = any(f.code != "CL901" for f in cfg.findings)
    assert not any(f.code == "CL901" for f in cfg.findings), "a divergence no rule explains"
    assert structurally_wrong == numerically_wrong == (expected == WRONG), (cfg.findings, n)
    if expected == WRONG:
        assert n.token_agreement < 0.5 and n.max_logit_error > 1.0
    else:
        assert n.token_agreement == 1.0 and n.max_logit_error < 1e-4
