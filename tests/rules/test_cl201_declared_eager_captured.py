"""CL201: an op a declared invariant requires eager was captured."""

from capturelint.report import ConfigReport, Report
from capturelint.rules.cl201_declared_eager_captured import DeclaredEagerCaptured
from region_streams import check, invariant

WHY = "V1 captures without attention metadata"


def test_captured_preparation_is_reported_with_id_ops_scope_line_and_why():
    inv = invariant("prep-eager", require="eager", runners=["v1"], modes=["PIECEWISE"], scope="model.layers.*.attn*", why=WHY)
    findings, _ = check(DeclaredEagerCaptured, (inv,))
    assert [(f.code, f.invariant, f.segment_index, f.scope, f.op) for f in findings] == [
        ("CL201", "prep-eager", 0, "model.layers.0.attn", "aten.mm.default")]
    f = findings[0]
    assert (f.capture_frame.file, f.capture_frame.line, f.condition.value) == ("engine/attn.py", 10, "declared")
    assert "dsv4.kv_insert.default (model.layers.0.attn) at engine/attn.py:20" in f.message
    assert WHY in f.message and "prep-eager" in f.message and f.segment == "mixed/4 #0 captured"
    assert f.to_json()["invariant"] == "prep-eager"


def test_ops_already_in_the_eager_break_pass():
    inv = invariant("break-eager", require="eager", scope="model.layers.*.attn", function="_sparse_*")
    findings, analyzer = check(DeclaredEagerCaptured, (inv,))
    assert findings == [] and analyzer.invariant_selected == {"break-eager": 1}


def test_out_of_scope_invariants_do_not_apply_and_empty_selectors_are_counted():
    other_runner = invariant("v2-only", require="eager", runners=["v2"], scope="*")
    with_metadata = invariant("needs-metadata", require="eager", scope="*", **{"when-context": "metadata"})
    nothing = invariant("typo", require="eager", scope="model.layer.*")
    findings, analyzer = check(DeclaredEagerCaptured, (other_runner, with_metadata, nothing))
    assert findings == [] and analyzer.invariant_selected == {"typo": 0}
    report = Report([ConfigReport("v1", "PIECEWISE", "narrow", [], None, [], invariant_selected=analyzer.invariant_selected)],
                    invariants=(other_runner, with_metadata, nothing))
    assert report.empty_invariants == ["typo"]
    # the profile-run condition: the same invariant applies to a capture without metadata
    without = invariant("no-metadata", require="eager", scope="model.layers.*.attn*", **{"when-context": "none"})
    assert [f.code for f in check(DeclaredEagerCaptured, (without,))[0]] == ["CL201"]
