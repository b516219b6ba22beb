"""One cause, one problem: a break handed one stale object with many tensors inside
gives many CL107 findings, and every format lists them as one problem with a count
(JSON: one entry with ``count`` and its ``members``; SARIF: one result with
``properties.count``), which ``merge`` reads back finding by finding."""

from __future__ import annotations

import json

from capturelint.cli import main
from capturelint.report import Report

TARGET = "tests/capture_engines.py:wide_argument"
FIELDS = 6  # capture_engines.WideMeta's tensors


def run(capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["check", "--target", TARGET, *args])
    return code, capsys.readouterr().out


def test_many_findings_of_one_stale_argument_are_one_json_entry_with_a_count(capsys):
    code, out = run(capsys, "--format", "json")
    assert code == 1
    doc = json.loads(out)
    (problem,) = doc["findings"]
    assert (problem["code"], problem["count"], problem["op"]) == ("CL107", FIELDS, "break WideArgument.scaled")
    assert doc["summary"]["findings"] == FIELDS and doc["summary"]["problems"] == 1
    assert doc["summary"]["by_code"] == {"CL107": FIELDS}
    # each member says only where it differs from the first: here the tensor inside the argument
    tensors = [problem["tensor"]] + [m["tensor"] for m in problem["members"]]
    assert tensors == [f"argument meta.{name}" for name in "abcdef"]
    assert all("code" not in m and "capture_frame" not in m for m in problem["members"])
    # read back finding by finding (merge), and written again byte for byte
    report = Report.from_json(doc)
    assert len(report.findings) == FIELDS and len(report.groups) == 1
    assert report.to_json() == doc
    assert run(capsys, "--format", "json")[1] == out  # the same command, the same bytes


def test_many_findings_of_one_stale_argument_are_one_sarif_result(capsys):
    code, out = run(capsys, "--format", "sarif")
    assert code == 1
    (result,) = json.loads(out)["runs"][0]["results"]
    assert result["ruleId"] == "CL107" and result["properties"]["count"] == FIELDS
    assert result["properties"]["members"] == {"test/PIECEWISE": {"findings": FIELDS, "graphs": ["mixed/4"],
                                                                  "scopes": ["<top>"]}}
    assert result["message"]["text"].endswith(f"\n\nSame cause in {FIELDS} findings: mixed/4 in test/PIECEWISE")
    # the GitHub annotation says the same of the same problem
    _, annotations = run(capsys, "--format", "github")
    (error,) = [line for line in annotations.splitlines() if line.startswith("::error")]
    assert error.endswith(f"%0A%0ASame cause in {FIELDS} findings: mixed/4 in test/PIECEWISE")


def test_a_problem_of_one_finding_has_count_one_and_no_members(capsys):
    capsys.readouterr()
    assert main(["check", "--target", "tests/capture_engines.py:dataclass_argument", "--format", "json"]) == 1
    (problem,) = json.loads(capsys.readouterr().out)["findings"]
    assert problem["count"] == 1 and "members" not in problem
