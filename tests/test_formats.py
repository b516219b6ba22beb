"""SARIF and GitHub-annotation renderings of findings."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema
import pytest
import referencing
import referencing.jsonschema

from capturelint.errors import CapturelintError
from capturelint.findings import Condition, Finding, Frame, RuleInfo, group_id
from capturelint.formats import fingerprint, to_github, to_sarif
from capturelint.formats.github import annotation, escape_data, escape_property
from capturelint.formats.sarif import markdown_to_text

SCHEMA_PATH = Path(__file__).parent / "data" / "sarif-schema-2.1.0.json"

RULES = (
    RuleInfo(
        code="CL104",
        name="stale-input",
        condition=Condition.R4,
        summary="A captured op reads an external tensor that is re-allocated every step.",
        doc="## What it does\n\nFinds **stale** inputs.\n\n## Example\n\n```python\nx = torch.empty(4)\n```\n\nSee [vLLM #37363](https://github.com/vllm-project/vllm/issues/37363) and `set_forward_context`.\n",
    ),
    RuleInfo(
        code="CL101",
        name="baked-control-flow",
        condition=Condition.R1,
        summary="The capture took another code path than real steps take.",
        doc="## What it does\n\nCompares op sequences.\n",
    ),
)


def make_finding(**changes) -> Finding:
    base = Finding(
        code="CL101",
        name="baked-control-flow",
        condition=Condition.R1,
        runner="v1",
        mode="PIECEWISE",
        graph="decode/4",
        runtime_mode="PIECEWISE",
        segment="decode/4 #2 captured",
        segment_index=2,
        op="aten::constant_pad_nd",
        scope="layers.0.attn",
        tensor=None,
        capture_frame=Frame("engine/model.py", 42, "forward"),
        shadow_frame=Frame("engine/model.py", 40, "forward"),
        message="capture recorded aten::constant_pad_nd where the shadow runs dsv4::fused_qnorm_rope_kv_insert",
        steps=(1, 2, 3),
        occurrences=7,
    )
    return dataclasses.replace(base, **changes)


def _refuse(uri: str):
    raise AssertionError(f"the SARIF schema tried to fetch {uri}; validation must stay offline")


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    assert schema["$schema"] == "http://json-schema.org/draft-04/schema#"
    resource = referencing.Resource.from_contents(schema, default_specification=referencing.jsonschema.DRAFT4)
    registry = referencing.Registry(retrieve=_refuse).with_resource(schema["id"], resource)
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema, registry=registry)


def _errors(validator, log) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(log)]


def test_sarif_with_findings_validates(validator):
    findings = [
        make_finding(),
        make_finding(code="CL104", name="stale-input", condition=Condition.R4, tensor="runner.positions",
                     op="aten::index_select", capture_frame=None, steps=()),
        make_finding(capture_frame=Frame("/abs/path with space/m.py", 7, "f"), shadow_frame=None),
        make_finding(capture_frame=Frame("<unknown>", 0, "<unknown>"), shadow_frame=None),
    ]
    for fallback in (None, "pyproject.toml"):
        log = to_sarif(findings, RULES, "0.1.0", fallback_uri=fallback)
        assert _errors(validator, log) == []
        json.dumps(log)  # every value is JSON


def test_sarif_without_findings_validates(validator):
    log = to_sarif([], RULES, "0.1.0")
    assert _errors(validator, log) == []
    assert log["runs"][0]["results"] == []
    assert [r["id"] for r in log["runs"][0]["tool"]["driver"]["rules"]] == ["CL101", "CL104"]


def test_schema_validator_rejects_a_broken_log(validator):
    log = to_sarif([make_finding()], RULES, "0.1.0")
    log["runs"][0]["results"][0]["level"] = "fatal"
    assert any("fatal" in e for e in _errors(validator, log))


def test_sarif_rules_and_result_fields():
    log = to_sarif([make_finding()], RULES, "0.1.0")
    assert log["version"] == "2.1.0"
    driver = log["runs"][0]["tool"]["driver"]
    assert driver["name"] == "capturelint" and driver["version"] == "0.1.0"
    rule = driver["rules"][1]
    assert rule["id"] == "CL104"
    assert rule["name"] == "stale-input"
    assert rule["shortDescription"] == {"text": RULES[0].summary}
    assert rule["help"]["markdown"] == RULES[0].doc
    assert rule["help"]["text"] == (
        "What it does\n\nFinds stale inputs.\n\nExample\n\nx = torch.empty(4)\n\n"
        "See vLLM #37363 (https://github.com/vllm-project/vllm/issues/37363) and set_forward_context."
    )
    assert rule["fullDescription"] == rule["help"]
    assert rule["properties"]["tags"] == ["correctness", "cuda-graph", "replay-equivalence", "R4"]

    (result,) = log["runs"][0]["results"]
    assert result["ruleId"] == "CL101" and result["ruleIndex"] == 0
    assert result["level"] == "error"
    assert result["message"] == {"text": make_finding().message}
    assert result["locations"][0]["physicalLocation"] == {
        "artifactLocation": {"uri": "engine/model.py", "uriBaseId": "%SRCROOT%"},
        "region": {"startLine": 42},
    }
    (related,) = result["relatedLocations"]
    assert related["physicalLocation"]["region"] == {"startLine": 40}
    assert related["message"] == {"text": "shadow (eager) side: forward"}
    assert result["properties"] == {
        "runner": "v1",
        "mode": "PIECEWISE",
        "graph": "decode/4",
        "runtimeMode": "PIECEWISE",
        "segment": "decode/4 #2 captured",
        "segmentIndex": 2,
        "scope": "layers.0.attn",
        "op": "aten::constant_pad_nd",
        "tensor": None,
        "condition": "R1",
        "steps": [1, 2, 3],
        "occurrences": 7,
        "group": group_id(make_finding()),
        "count": 1,
    }


def test_sarif_location_fallbacks():
    shadow_only = make_finding(capture_frame=None)
    (result,) = to_sarif([shadow_only], RULES, "0.1.0")["runs"][0]["results"]
    assert result["locations"][0]["physicalLocation"]["region"] == {"startLine": 40}
    assert "relatedLocations" not in result

    absolute = make_finding(capture_frame=Frame("/src/a b.py", 3, "f"), shadow_frame=None)
    (result,) = to_sarif([absolute], RULES, "0.1.0")["runs"][0]["results"]
    assert result["locations"][0]["physicalLocation"]["artifactLocation"] == {"uri": "file:///src/a%20b.py"}

    nowhere = make_finding(capture_frame=None, shadow_frame=None)
    (result,) = to_sarif([nowhere], RULES, "0.1.0")["runs"][0]["results"]
    assert "locations" not in result
    (result,) = to_sarif([nowhere], RULES, "0.1.0", fallback_uri="pyproject.toml")["runs"][0]["results"]
    assert result["locations"] == [{"physicalLocation": {
        "artifactLocation": {"uri": "pyproject.toml", "uriBaseId": "%SRCROOT%"}, "region": {"startLine": 1}}}]


def test_sarif_is_deterministic_and_sorted():
    a = make_finding(capture_frame=Frame("engine/b.py", 1, "f"))
    b = make_finding(capture_frame=Frame("engine/a.py", 9, "f"))
    first = json.dumps(to_sarif([a, b], RULES, "0.1.0"))
    second = json.dumps(to_sarif([b, a], tuple(reversed(RULES)), "0.1.0"))
    assert first == second
    uris = [r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
            for r in json.loads(first)["runs"][0]["results"]]
    assert uris == ["engine/a.py", "engine/b.py"]


def test_fingerprints_are_stable():
    f = make_finding()
    assert fingerprint(f) == fingerprint(make_finding())
    assert len(fingerprint(f)) == 32
    # line numbers, steps, messages and the configuration do not change the identity ...
    moved = make_finding(capture_frame=Frame("engine/model.py", 99, "forward"), steps=(8,),
                         message="other words", runner="v2", mode="FULL")
    assert fingerprint(moved) == fingerprint(f)
    # ... code, file, scope, op and tensor do
    for change in ({"code": "CL102"}, {"capture_frame": Frame("engine/other.py", 42, "forward")},
                   {"scope": "layers.1.attn"}, {"op": "aten::add"}, {"tensor": "runner.positions"}):
        assert fingerprint(make_finding(**change)) != fingerprint(f), change
    (result,) = to_sarif([f], RULES, "0.1.0")["runs"][0]["results"]
    assert result["partialFingerprints"] == {"capturelint/v1": fingerprint(f)}


def test_sarif_refuses_a_finding_without_its_rule():
    with pytest.raises(CapturelintError, match="CL105"):
        to_sarif([make_finding(code="CL105")], RULES, "0.1.0")


def test_sarif_refuses_two_rules_with_one_code():
    clash = dataclasses.replace(RULES[1], name="another-name")
    with pytest.raises(CapturelintError, match="CL101"):
        to_sarif([], (*RULES, clash), "0.1.0")


def test_markdown_to_text():
    assert markdown_to_text("# Title\n\n__bold__ and **bold** `code`\n~~~\nx\n~~~\n") == "Title\n\nbold and bold code\nx"


def test_github_annotation_exact():
    assert annotation(make_finding()) == (
        "::error file=engine/model.py,line=42,title=CL101 baked-control-flow::"
        "capture recorded aten::constant_pad_nd where the shadow runs dsv4::fused_qnorm_rope_kv_insert"
    )


def test_github_escaping_exact():
    f = make_finding(
        capture_frame=Frame("dir,with:odd%name.py", 5, "f"),
        name="a:b,c",
        message="100% wrong\r\nsecond line: a, b",
    )
    assert annotation(f) == (
        "::error file=dir%2Cwith%3Aodd%25name.py,line=5,title=CL101 a%3Ab%2Cc::"
        "100%25 wrong%0D%0Asecond line: a, b"
    )
    assert escape_data("%0A\n") == "%250A%0A"
    assert escape_property("a:b,c%\r\n") == "a%3Ab%2Cc%25%0D%0A"


def test_github_location_fallbacks():
    shadow_only = make_finding(capture_frame=None)
    assert annotation(shadow_only).startswith("::error file=engine/model.py,line=40,title=")
    nowhere = make_finding(capture_frame=None, shadow_frame=None)
    assert annotation(nowhere).startswith("::error title=CL101 baked-control-flow::")
    no_line = make_finding(capture_frame=Frame("m.py", 0, "f"))
    assert annotation(no_line).startswith("::error file=m.py,title=")


def test_github_one_line_per_finding_sorted():
    a = make_finding(capture_frame=Frame("b.py", 1, "f"), message="x\ny")
    b = make_finding(capture_frame=Frame("a.py", 2, "f"))
    text = to_github([a, b])
    assert text.endswith("\n")
    lines = text.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("::error file=a.py,line=2,")
    assert lines[1] == "::error file=b.py,line=1,title=CL101 baked-control-flow::x%0Ay"
    assert to_github([]) == ""


def test_sarif_of_the_registered_rules_validates(validator):
    from capturelint import __version__
    from capturelint.rules import RULES as REGISTERED

    infos = [r.info() for r in REGISTERED]
    log = to_sarif([], infos, __version__)
    assert _errors(validator, log) == []
    assert [d["id"] for d in log["runs"][0]["tool"]["driver"]["rules"]] == sorted(i.code for i in infos)
