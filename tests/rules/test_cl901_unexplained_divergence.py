"""CL901: numerical divergence that no structural rule explains (a coverage gap)."""

from capturelint.analyzer import RunLabel
from capturelint.harness import coverage_gap
from capturelint.rules import BY_CODE
from toy_engine import check_toy

ALL = frozenset(BY_CODE)
LABEL = RunLabel("v1", "PIECEWISE")


def test_divergence_without_a_structural_finding_is_reported():
    f = coverage_gap(LABEL, [], token_agreement=0.4, max_step_error=3.0, codes=ALL)
    assert f is not None and f.code == "CL901" and f.condition.value == "numerical"
    assert "coverage gap" in f.message and "3" in f.message


def test_divergence_explained_by_a_structural_finding_is_not_a_gap():
    result, _ = check_toy("stale_input")
    assert result.findings and result.max_step_error > 0.1
    assert coverage_gap(LABEL, result.findings, 1.0, result.max_step_error, ALL) is None


def test_float_noise_and_deselection_are_not_gaps():
    assert coverage_gap(LABEL, [], 1.0, 5e-5, ALL) is None
    assert coverage_gap(LABEL, [], 0.2, 3.0, ALL - {"CL901"}) is None
