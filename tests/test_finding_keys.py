"""Each key of a finding (``capturelint.finding_keys``) tells apart what its use needs
told apart, and no more."""

from __future__ import annotations

import dataclasses

from capturelint.analyzer import FindingSet
from capturelint.finding_keys import cause_key, fingerprint, group_id, occurrence_key, order_key, trial_key
from capturelint.findings import Condition, Finding, Frame, group_findings

KEYS = {"order": order_key, "cause": cause_key, "occurrence": occurrence_key, "trial": trial_key,
        "fingerprint": fingerprint}


def finding(**changes) -> Finding:
    base = Finding(code="CL101", name="baked-control-flow", condition=Condition.R1, runner="v1", mode="PIECEWISE",
                   graph="decode/4", runtime_mode="PIECEWISE", segment="decode/4 #2 captured", segment_index=2,
                   op="aten::constant_pad_nd", scope="model.layers.0.attn", tensor=None,
                   capture_frame=Frame("engine/model.py", 42, "forward"),
                   shadow_frame=Frame("engine/model.py", 40, "forward"), message="m", steps=(1,))
    return dataclasses.replace(base, **changes)


def same(a: Finding, b: Finding) -> set[str]:
    """The keys under which ``a`` and ``b`` are one."""
    return {name for name, key in KEYS.items() if key(a) == key(b)}


def test_another_layer_is_the_same_problem_and_hazard_but_another_occurrence():
    other = finding(scope="model.layers.3.attn")
    assert same(finding(), other) == {"cause"}  # fingerprint hashes the scope as written


def test_another_segment_is_the_same_finding_to_suggest_only():
    # suggest's breaks move segment indices; the analyzer keys a configuration's findings without them too
    assert same(finding(), finding(segment_index=5)) == {"cause", "occurrence", "trial", "fingerprint"}


def test_another_configuration_is_one_problem_one_hazard_and_one_trial_key():
    assert same(finding(), finding(runner="v2", mode="FULL")) == {"cause", "trial", "fingerprint"}


def test_a_break_handed_one_stale_object_is_one_problem_whatever_tensors_in_it_differ():
    # a break handed the capture's metadata object: each tensor inside it is a finding
    # (hundreds under vLLM), all of one problem; another argument is another problem
    def stale(path: str) -> Finding:
        return finding(code="CL107", name="stale-break-argument", condition=Condition.R6, op="eager break",
                       tensor=path, capture_frame=None, shadow_frame=Frame("engine/model.py", 60, "forward"))

    one = [stale("meta.slot_mapping"), stale("meta['model.layers.1.attn'].decode.block_table"),
           stale("argument meta.num_decodes"), stale("meta.seq_lens")]
    assert len({group_id(f) for f in one}) == 1
    assert len(group_findings(one)) == 1 and len(group_findings(one)[0].findings) == 4
    assert group_id(stale("positions")) != group_id(one[0])
    # other rules keep the tensor: two stale reads in a captured segment are two problems
    assert group_id(finding(tensor="meta.slot_mapping")) != group_id(finding(tensor="meta.seq_lens"))


def test_a_moved_line_keeps_only_the_fingerprint():
    moved = finding(capture_frame=Frame("engine/model.py", 50, "forward"),
                    shadow_frame=Frame("engine/model.py", 48, "forward"))
    assert same(finding(), moved) == {"fingerprint"}
    assert group_id(finding()) != group_id(moved)


def test_steps_merge_into_one_occurrence_and_groups_follow_the_cause():
    merged = FindingSet()
    merged.extend([finding(steps=(s,)) for s in (3, 1, 2)] + [finding(scope="model.layers.1.attn")])
    out = merged.sorted()
    assert [(f.scope, f.steps, f.occurrences) for f in out] == [
        ("model.layers.0.attn", (1, 2, 3), 3), ("model.layers.1.attn", (1,), 1)]
    assert [len(g.findings) for g in group_findings(out)] == [2]
    assert out == sorted(out, key=Finding.sort_key) and Finding.sort_key(out[0]) == order_key(out[0])


def test_a_rule_builds_its_finding_from_its_info_and_a_site():
    from capturelint.findings import RuleInfo, Site

    info = RuleInfo("CL104", "stale-input", Condition.R5, "summary", "doc")
    site = Site.captured("v1", "PIECEWISE", "decode/4", "PIECEWISE", 2)
    made = Finding.of(info, site, op="aten::mm", scope="", tensor="x", capture_frame=Frame("m.py", 3, "f"),
                      shadow_frame=None, message="m", steps=(4,))
    assert (made.code, made.name, made.condition) == ("CL104", "stale-input", Condition.R5)
    assert (made.segment, made.segment_index, made.scope, made.steps) == ("decode/4 #2 captured", 2, "<top>", (4,))
    assert made.site == site
    assert Finding.of(info, Site(), op="", scope="model.x", tensor=None, capture_frame=None, shadow_frame=None,
                      message="").site == Site("", "", "", "", "", -1)
