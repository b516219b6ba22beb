"""The terminal report read at a glance (issue 20): one entry per problem, the evidence
with ``--verbose``, and the group ids that JSON and SARIF carry for the same grouping.

The seed case is the README's: ``check --runner v1 --eager-region narrow`` on the
bundled engine at its default size (each configuration runs once per session:
``cached_configurations``). Expected source lines come from the JSON report of the same
run, never from numbers written here.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import string

import pytest

from capturelint.cli import main
from capturelint.report import finding_entries
from capturelint.findings import (
    Condition, Finding, Frame, MessageParts, Numerical, compact_names, group_findings, group_id,
)
from capturelint.formats import to_github
from capturelint.report import Checked, ConfigReport, Report

SEED = ("check", "--runner", "v1", "--eager-region", "narrow")
FINDING_LINE = re.compile(r"^(\S+:\d+|<no source line>): (CL\d{3}) ")


def run(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def seed(capsys, cached_configurations, monkeypatch):
    """The seed case's default output, its --verbose output, its JSON and SARIF reports."""
    monkeypatch.setenv("COLUMNS", "120")
    outputs = {}
    for name, extra in (("rich", ()), ("verbose", ("--verbose",)), ("json", ("--format", "json")),
                        ("sarif", ("--format", "sarif"))):
        code, out, _ = run(capsys, *SEED, *extra)
        assert code == 1, name
        outputs[name] = out
    return outputs


def where(f: dict) -> str:
    frame = f["location"]  # the line to change: CL101's branch condition
    return f"{frame['file']}:{frame['line']}"


def test_the_seed_case_reads_at_a_glance(seed):
    out, doc = seed["rich"], json.loads(seed["json"])
    lines = out.rstrip("\n").splitlines()
    assert len(lines) <= 40, out
    # the verdict and what was compared, first
    assert lines[0].startswith("replay DIFFERS from eager execution in v1/PIECEWISE (token agreement ")
    assert "matches in v1/FULL, v1/FULL_DECODE_ONLY" in lines[0]
    assert re.search(r"\(compared: \d+ replay steps with their eager shadow; each output with its eager twin\)$", lines[0])
    # what "matches" covers: per configuration the steps it exercised, as the JSON says them
    exercised = [line.split(" exercised: ") for line in lines if " exercised: " in line]
    assert exercised == [[f"{c['runner']}/{c['mode']}", "; ".join(c["checked"]["exercised"])]
                         for c in doc["configurations"]]
    assert all("tokens (replayed " in text for _, text in exercised)
    # one line per problem: every (rule, source line) of the JSON findings once, nothing else
    findings = finding_entries(doc)
    expected = {(where(f), f["code"]) for f in findings}
    assert {f["code"] for f in findings} == {"CL101", "CL201"} and len(findings) > len(expected)
    # the JSON too: one entry per problem, with its count of findings
    assert len(doc["findings"]) == len(expected) and sum(p["count"] for p in doc["findings"]) == len(findings)
    shown = [FINDING_LINE.match(line) for line in lines]
    assert sorted((m[1], m[2]) for m in shown if m) == sorted(expected)
    assert len({f["group"] for f in findings}) == len(expected)
    for i, m in enumerate(shown):
        if not m:
            continue
        scopes = sorted({f["scope"] for f in findings if (where(f), f["code"]) == (m[1], m[2])})
        assert scopes == [f"model.layers.{n}.attn" for n in range(4)]
        assert lines[i].endswith("model.layers.{0..3}.attn; mixed/32 in v1/FULL_AND_PIECEWISE, v1/PIECEWISE]")
        # its cause and its fix, one sentence each
        why, fix = lines[i + 1], lines[i + 2]
        assert why.startswith("  why: ") and why.endswith(".") and len(why) > 40
        assert fix.startswith("  fix: ") and fix.endswith(".") and ("eager break" in fix)
    cl101 = next(line for line in lines if FINDING_LINE.match(line) and " CL101 " in line)
    assert "attn_metadata was None" in lines[lines.index(cl101) + 1]
    # the summary, and the exact command that finds the fix
    assert lines[-2].startswith("16 findings (CL101 x8, CL201 x8) in 4 configurations")
    assert lines[-1].startswith("hint: run `capturelint suggest --runner v1 --eager-region narrow` ")
    assert "--verbose shows each with its ops, segments and replay steps" in out
    # the evidence is not repeated per layer
    assert "segments:" not in out and "Why:" not in out
    assert not any(f["message"] in out for f in findings)


def test_verbose_keeps_the_evidence(seed):
    out, doc = seed["verbose"], json.loads(seed["json"])
    flat = " ".join(out.replace("│", " ").split())
    assert out.count("CL101 baked-control-flow [R1]") == 8 and out.count("CL201 declared-eager-captured") == 8
    assert "segments: C:" in out and "E _sparse_indexer_and_attn:" in out
    assert "seen at replay steps" in out and "aten.constant_pad_nd.default" in out
    for f in doc["findings"]:
        assert f"capture: {f['capture_frame']['file']}:{f['capture_frame']['line']}" in out
        parts = MessageParts.of(f["message"])  # every finding's message is said: once per problem where shared
        for part in (parts.what, parts.why, parts.fix):
            assert " ".join(part.split()).rstrip(".") in flat
    # why and fix once per problem, not once per finding
    assert out.count("  why: ") == out.count("  fix: ") == 2
    assert "Model Runner V1 captures its PIECEWISE graphs without attention metadata" in flat


def test_verbose_adds_and_never_removes(seed):
    """``-v`` prints the default report first (the verdict line, the grouped problems with
    their why and fix, exactly as without it), then the evidence, then the summary."""
    default, verbose = seed["rich"].splitlines(), seed["verbose"].splitlines()
    closing = next(i for i, line in enumerate(default) if "--verbose shows each" in line)
    head = default[:closing]
    assert head[0].startswith("replay DIFFERS from eager execution") and len(head) >= 7
    assert verbose[:len(head)] == head
    assert verbose[len(head)] == "evidence"
    assert verbose[-2:] == default[-2:]  # the same summary and hint close both
    problems = [line for line in verbose if line.startswith("problem ")]
    assert [p.split(":")[0] for p in problems] == ["problem 1 of 2", "problem 2 of 2"]


def test_group_ids_in_json_and_sarif(seed):
    findings = json.loads(seed["json"])["findings"]
    results = json.loads(seed["sarif"])["runs"][0]["results"]
    by_cause: dict[tuple[str, str], set[str]] = {}
    for f in findings:
        by_cause.setdefault((where(f), f["code"]), set()).add(f["group"])
    assert all(len(ids) == 1 for ids in by_cause.values())  # equal within a group
    assert len(set.union(*by_cause.values())) == len(by_cause) == 2  # different across groups
    assert all(re.fullmatch(r"[0-9a-f]{12}", f["group"]) for f in findings)
    # SARIF: one result per finding, in the same order, each with its finding's group
    assert [r["properties"]["group"] for r in results] == [f["group"] for f in findings]


def test_a_merged_report_prints_the_same(seed, tmp_path, capsys):
    """``merge`` reads the JSON report back: its Rich form is the check's, less the hint
    (which names the check's own options), and --verbose gives the evidence."""
    path = tmp_path / "report.json"
    path.write_text(seed["json"])
    code, out, _ = run(capsys, "merge", str(path), "--format", "rich")
    assert code == 1
    lines = seed["rich"].splitlines()
    assert lines[-1].startswith("hint: ") and out.splitlines() == lines[:-1]
    code, out, _ = run(capsys, "merge", str(path), "--format", "rich", "--verbose")
    assert code == 1 and out.count("CL101 baked-control-flow [R1]") == 8


def test_group_ids_are_stable_across_runs(capsys, real_configurations):
    args = ("check", "--runner", "v1", "--eager-region", "narrow", "--mode", "PIECEWISE", "--layers", "2", "--steps",
            "4", "--format", "json")
    first = finding_entries(json.loads(run(capsys, *args)[1]))
    second = finding_entries(json.loads(run(capsys, *args)[1]))
    assert [f["group"] for f in first] == [f["group"] for f in second]
    assert {f["scope"] for f in first} == {"model.layers.0.attn", "model.layers.1.attn"}
    assert len({f["group"] for f in first}) == len({(where(f), f["code"]) for f in first}) < len(first)


def test_a_clean_run_says_what_was_compared_and_lists_no_finding(capsys, cached_configurations):
    code, out, _ = run(capsys, "check", "--runner", "v2", "--mode", "PIECEWISE", "--layers", "1", "--steps", "6")
    assert code == 0
    lines = out.rstrip("\n").splitlines()
    assert re.fullmatch(r"replay matches eager execution in v2/PIECEWISE \(compared: \d+ replay steps with their "
                        r"eager shadow; each output with its eager twin\)", lines[0])
    assert not any(FINDING_LINE.match(line) for line in lines)
    assert lines[-1] == "no findings in 1 configuration: replay matches eager execution [engine bundled]"


def test_rules_code_explains_the_rule(capsys):
    code, out, _ = run(capsys, "rules", "CL201")
    assert code == 0
    assert "CL201 declared-eager-captured" in out and "Why is this bad?" in out
    assert "Model Runner V1 the PIECEWISE capture runs" in " ".join(out.split())


# ----------------------------------------------------------- the grouping, unit by unit


def finding(**changes) -> Finding:
    base = Finding(
        code="CL101", name="baked-control-flow", condition=Condition.R1, runner="v1", mode="PIECEWISE",
        graph="mixed/32", runtime_mode="PIECEWISE", segment="mixed/32 #0 captured", segment_index=0,
        op="aten.constant_pad_nd.default", scope="model.layers.0.attn", tensor=None,
        capture_frame=Frame("engine/attn.py", 305, "f"), shadow_frame=Frame("engine/attn.py", 307, "f"),
        message="captured segment S recorded X at a.py:1 where replay step 1 runs Y at a.py:2: the capture recorded "
                "another branch (2 ops missing). Replay re-issues the recorded ops, so the step's ops never run. Move "
                "the branching code into an eager break.",
    )
    return dataclasses.replace(base, **changes)


def test_one_cause_in_every_layer_and_mode_is_one_group():
    members = [finding(scope=f"model.layers.{n}.attn", mode=mode, segment_index=2 * n,
                       message=finding().message.replace("2 ops", f"{n + 2} ops"))
               for n in range(4) for mode in ("PIECEWISE", "FULL_AND_PIECEWISE")]
    other_line = finding(capture_frame=Frame("engine/attn.py", 281, "f"))
    other_tensor = finding(code="CL104", tensor="model.layers.0.attn.kv_cache")
    layer_tensor = finding(code="CL104", tensor="model.layers.3.attn.kv_cache", scope="model.layers.3.attn")
    other_kind = finding(code="CL104", tensor="model.layers.0.attn.slot_mapping")
    everything = [*members, other_line, other_tensor, layer_tensor, other_kind]
    groups = group_findings(everything)
    assert [len(g.findings) for g in groups] == [1, 8, 2, 1]
    big = groups[1]
    assert {f.scope for f in big.findings} == {f"model.layers.{n}.attn" for n in range(4)}
    assert big.where == "engine/attn.py:305" and big.scopes() == "model.layers.{0..3}.attn"
    assert big.graphs() == "mixed/32 in v1/FULL_AND_PIECEWISE, v1/PIECEWISE"
    assert big.line() == ("engine/attn.py:305: CL101 replay re-issues the recorded ops, so the step's ops never run "
                          "[8 findings: model.layers.{0..3}.attn; mixed/32 in v1/FULL_AND_PIECEWISE, v1/PIECEWISE]")
    assert big.parts.fix == "Move the branching code into an eager break."
    assert {group_id(f) for f in big.findings} == {big.id}
    # pure: any order gives the same groups
    shuffled = list(everything)
    random.Random(0).shuffle(shuffled)
    assert group_findings(shuffled) == groups


def test_compact_names():
    assert compact_names([f"m.layers.{n}.attn" for n in (0, 1, 2, 5)]) == "m.layers.{0..2,5}.attn"
    assert compact_names(["m.layers.0.attn", "m.layers.1.attn"]) == "m.layers.{0,1}.attn"
    assert compact_names(["m.layers.0.attn", "m.layers.0.attn", "<top>"]) == "m.layers.0.attn, <top>"
    assert compact_names(["m.layers.0.experts.1", "m.layers.1.experts.2"]) == "m.layers.0.experts.1, m.layers.1.experts.2"


def test_every_rule_message_ends_with_a_fix_that_names_no_field():
    """The parts the concise report prints come from each rule's message templates: the
    last sentence is the fix, the same for every finding of the template."""
    from capturelint.rules import RULES

    class Fields(string.Formatter):
        def get_value(self, key, args, kwargs):
            return "" if key in ("context", "why") else f"<{key}>"  # the optional sentences: none

        def format_field(self, value, spec):
            return str(value)

    checked = 0
    for rule in RULES:
        for name in dir(rule):
            template = getattr(rule, name)
            if not (name.endswith("message") and isinstance(template, str)):
                continue
            parts = MessageParts.of(Fields().format(template))
            assert parts.what and parts.why and parts.fix, (rule.code, name, parts)
            assert "<" not in parts.fix and parts.fix[0].isupper(), (rule.code, name, parts.fix)
            checked += 1
    assert checked >= len(RULES)


def test_a_declared_invariants_why_is_the_groups_why():
    message = ("invariant keep-eager (default) requires these ops to run in an eager break under v1 PIECEWISE, but 2 "
               "of m.layers.0 ran in g #0 captured: a, b. A captured op replays what it did at capture instead of "
               "re-running every step. Why: the capture has no metadata (see #1). Move these ops into an eager break.")
    parts = MessageParts.of(message)
    assert parts == MessageParts("a captured op replays what it did at capture instead of re-running every step.",
                                 "The capture has no metadata (see #1).", "Move these ops into an eager break.")


def test_github_annotates_each_problem_once():
    a, b = finding(), finding(scope="model.layers.1.attn", message="other evidence. Same fix.")
    lines = to_github([b, a]).splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("::error file=engine/attn.py,line=305,title=CL101 baked-control-flow::captured segment")
    assert lines[0].endswith("%0A%0ASame cause in 2 findings: model.layers.{0,1}.attn; mixed/32 in v1/PIECEWISE")


def test_assert_clean_prints_the_groups():
    members = [finding(scope=f"model.layers.{n}.attn") for n in range(3)]
    report = Report([ConfigReport("v1", "PIECEWISE", "narrow", members, None, [])])
    with pytest.raises(AssertionError) as info:
        report.assert_clean()
    text = str(info.value)
    (group,) = report.groups
    assert text.startswith(f"{group.line()}\n  why: {group.parts.why}\n  fix: {group.parts.fix}\ncompared:\n")
    assert "[3 findings: model.layers.{0..2}.attn; mixed/32 in v1/PIECEWISE]" in text
    assert text.endswith(report.summary_line())


def test_the_verdict_says_matches_only_where_replay_was_compared_and_found_nothing():
    compared = Checked(rules=("CL101",), shadowed_steps=3, eager_twin=True)

    def config(mode, findings=(), agreement=1.0, checked=compared):
        numerical = Numerical("v1", mode, agreement, 0.0 if agreement == 1.0 else 2.0, 0.0, 3)
        return ConfigReport("v1", mode, "narrow", list(findings), numerical, [], checked=checked)

    bare = Checked(rules=("CL104",), bare_replays=2)
    report = Report([config("PIECEWISE", [finding()], agreement=0.5), config("FULL", [finding(mode="FULL")]),
                     config("FULL_DECODE_ONLY"), config("NONE", checked=bare)])
    assert report.verdict_line() == (
        "replay DIFFERS from eager execution in v1/PIECEWISE (token agreement 0.50, max step error 2); agrees "
        "numerically in v1/FULL, yet has findings; matches in v1/FULL_DECODE_ONLY; NOT compared with eager in v1/NONE "
        "(bare graph, no eager twin given) (compared: 9 replay steps with their eager shadow; 3 outputs with an eager "
        "twin)")
    assert Report([config("FULL_DECODE_ONLY")]).verdict_line() == (
        "replay matches eager execution in v1/FULL_DECODE_ONLY (compared: 3 replay steps with their eager shadow; "
        "each output with its eager twin)")
    assert Report([config("FULL", [finding()])], static=True).verdict_line().startswith(
        "static check: captures only (declared invariants, host syncs at capture); replay was NOT compared")
