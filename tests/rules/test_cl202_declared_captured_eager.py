"""CL202: an op a declared invariant requires captured ran in an eager break."""

from capturelint.rules.cl202_declared_captured_eager import DeclaredCapturedEager
from region_streams import check, invariant


def test_an_eager_moe_op_is_reported():
    inv = invariant("moe-captured", require="captured", scope="model.layers.*.ffn*", why="the MoE is the hot path")
    findings, _ = check(DeclaredCapturedEager, (inv,))
    assert [(f.code, f.invariant, f.segment_index, f.scope, f.op, f.capture_frame.line) for f in findings] == [
        ("CL202", "moe-captured", 1, "model.layers.0.ffn", "aten.mul.Tensor", 40)]
    assert "mixed/4 #1 eager Attn.sparse" in findings[0].message and "the MoE is the hot path" in findings[0].message


def test_captured_ops_pass():
    inv = invariant("w1-captured", require="captured", scope="model.layers.*.ffn.w1", op="aten.mm*")
    assert check(DeclaredCapturedEager, (inv,))[0] == []


def test_modes_match_the_graph_runtime_mode_or_the_configuration_mode():
    piecewise = invariant("pw", require="captured", modes=["PIECEWISE"], scope="model.layers.*.ffn*")
    full = invariant("full", require="captured", modes=["FULL"], scope="model.layers.*.ffn*")
    # a PIECEWISE graph of a FULL_AND_PIECEWISE configuration: held to "PIECEWISE", not to "FULL"
    findings, analyzer = check(DeclaredCapturedEager, (piecewise, full), mode="FULL_AND_PIECEWISE")
    assert [f.invariant for f in findings] == ["pw"] and set(analyzer.invariant_selected) == {"pw"}
    # "FULL" holds a graph captured FULL (the hand-built one keeps its eager segment)
    findings, _ = check(DeclaredCapturedEager, (full,), mode="FULL", runtime_mode="FULL")
    assert [f.invariant for f in findings] == ["full"]
