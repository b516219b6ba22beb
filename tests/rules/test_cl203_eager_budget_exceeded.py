"""CL203: more eager ops per replayed step than a declared budget."""

from capturelint.rules.cl203_eager_budget_exceeded import EagerBudgetExceeded
from region_streams import check, invariant


def test_over_budget_points_at_the_first_op_over_it():
    findings, _ = check(EagerBudgetExceeded, (invariant("budget", **{"max-eager-ops": 1}),))
    assert [(f.code, f.invariant, f.scope, f.op, f.capture_frame.line) for f in findings] == [
        ("CL203", "budget", "<step>", "aten.mul.Tensor", 40)]
    assert "allows at most 1 eager ops" in findings[0].message and "runs 2" in findings[0].message


def test_within_budget_passes():
    assert check(EagerBudgetExceeded, (invariant("budget", **{"max-eager-ops": 2}),))[0] == []


def test_per_group_budgets_and_selected_ops_only():
    per_module = invariant("per-module", per="model.layers.*.*", **{"max-eager-ops": 1})
    assert check(EagerBudgetExceeded, (per_module,))[0] == []  # one eager op in attn, one in ffn
    strict = invariant("none-eager", per="model.layers.*.*", **{"max-eager-ops": 0})
    assert [f.scope for f in check(EagerBudgetExceeded, (strict,))[0]] == ["model.layers.0.attn", "model.layers.0.ffn"]
    ffn_only = invariant("ffn", scope="*.ffn*", **{"max-eager-ops": 0})
    assert [f.op for f in check(EagerBudgetExceeded, (ffn_only,))[0]] == ["aten.mul.Tensor"]
