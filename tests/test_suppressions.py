"""Accepting a known finding, visibly: inline ``# capturelint: ignore[CODE]`` comments
and the ``--accept-findings`` file (``capturelint.waivers``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest

from bare_programs import line_of, write
from capturelint.acceptance import whole_check
from capturelint.cli import main
from capturelint.options import EngineOptions
from capturelint.report import Report
from capturelint.rules import BY_CODE
from capturelint.waivers import comments_in

# A runner that re-binds its static input (CL104 at the re-binding line) and, with
# SECOND, a second graph whose input is re-bound too (a new finding).
PROGRAM = """
class Runner:
    def __init__(self):
        torch.manual_seed(0)
        self.model = nn.Linear(4, 4).to(DEV).eval()
        self.static_x = torch.zeros(2, 4, device=DEV)
        self.static_z = torch.zeros(2, 4, device=DEV)

    @torch.no_grad()
    def serve(self, batches, second):
        self.model(self.static_x)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_y = self.model(self.static_x)
        self.other = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.other):
            self.static_w = self.static_z * 2
        outs = []
        for x in batches:
            self.static_x = x.to(DEV)
            if second:
                self.static_z = x.to(DEV)
            else:
                self.static_z.copy_(x)
            self.graph.replay()
            self.other.replay()
            outs.append(self.static_y.clone())
        return outs


def targets():
    batches = [torch.full((2, 4), float(i)) for i in range(3)]
    return Target(run=lambda: Runner().serve(batches, SECOND), runner="plain", mode="graph")


SECOND = False
"""

REBIND = "self.static_x = x.to(DEV)"


def program(tmp_path: Path, *, comment: str = "", on: str = REBIND, second: bool = False, name: str = "prog.py") -> Path:
    body = PROGRAM.replace("SECOND = False", f"SECOND = {second}")
    if comment:
        body = body.replace(on, f"{on}  {comment}", 1)
    return write(tmp_path, body, name)


def check(capsys, path: Path, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["check", "--target", f"{path}:targets", *args])
    out, err = capsys.readouterr()
    return code, out, err


def report(capsys, path: Path, *args: str) -> tuple[int, dict]:
    code, out, _ = check(capsys, path, "--format", "json", *args)
    return code, json.loads(out)


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # findings name prog.py, as the comments' files


# ------------------------------------------------------------ inline suppressions


def test_an_inline_suppression_on_the_reported_line_turns_the_finding_into_a_counted_one(tmp_path, capsys):
    path = program(tmp_path, comment="# capturelint: ignore[CL104] -- the old batch is dropped on purpose")
    code, doc = report(capsys, path)
    assert code == 0 and doc["findings"] == []
    assert doc["summary"]["suppressed"] == 1 and doc["summary"]["accepted"] == 0
    (s,) = doc["suppressed"]  # listed, not hidden
    assert s["code"] == "CL104" and s["location"]["line"] == line_of(path, REBIND)
    assert s["suppression"] == {"kind": "inline", "where": f"prog.py:{line_of(path, REBIND)}",
                                "reason": "the old batch is dropped on purpose"}
    assert doc["configurations"][0]["suppressed"] == 1
    (comment,) = doc["waivers"]["suppressions"]
    assert (comment["codes"], comment["used"], comment["problem"]) == (["CL104"], ["CL104"], None)

    code, out, _ = check(capsys, path)
    assert code == 0 and "1 finding suppressed" in out.splitlines()[-1]
    assert "matches eager" not in out  # a suppressed finding is not a pass of replay

    code, out, _ = check(capsys, path, "--format", "sarif")
    log = json.loads(out)
    schema = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())
    jsonschema.Draft4Validator(schema).validate(log)  # the standard's suppressions, as the schema has them
    (result,) = log["runs"][0]["results"]
    (sup,) = result["suppressions"]
    assert sup["kind"] == "inSource" and sup["justification"] == "the old batch is dropped on purpose"
    assert sup["location"]["physicalLocation"]["region"]["startLine"] == line_of(path, REBIND)

    code, out, _ = check(capsys, path, "--format", "github")
    assert "::error" not in out
    assert "::notice title=findings accepted::1 finding suppressed, not failed on" in out

    code, out, _ = check(capsys, path, "--verbose")
    assert f"suppressed at prog.py:{line_of(path, REBIND)} (the old batch is dropped on purpose)" in out



@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz's 'dot' (Debian package graphviz)")
def test_the_html_report_counts_and_lists_suppressed_findings(tmp_path, capsys):
    path = program(tmp_path, comment="# capturelint: ignore[CL104]")
    code, _, _ = check(capsys, path, "--format", "html", "-o", "report.html")
    page = Path("report.html").read_text()
    assert code == 0 and "<h1>No findings that fail the check (1 finding suppressed)</h1>" in page
    assert '<section id="suppressed"><h2>Not failed on (1 finding suppressed)</h2>' in page
    assert f"<code>prog.py:{line_of(path, REBIND)}</code>: <b class=\"code\">CL104</b>" in page


def test_a_suppression_on_the_captured_ops_line_applies_too(tmp_path, capsys):
    path = program(tmp_path, comment="# capturelint: ignore[CL104]", on="self.static_y = self.model(self.static_x)")
    code, doc = report(capsys, path)
    assert code == 0 and doc["summary"]["suppressed"] == 1


def test_a_suppression_of_another_code_suppresses_nothing_and_is_reported_unused(tmp_path, capsys):
    path = program(tmp_path, comment="# capturelint: ignore[CL108]")
    code, doc = report(capsys, path)
    assert code == 1 and sorted(f["code"] for f in doc["findings"]) == ["CL104", "CL902"]
    assert doc["summary"]["suppressed"] == 0


def test_a_directive_inside_a_string_is_no_comment():
    lines = ['x = "# capturelint: ignore[CL104]"', "y = 1  # capturelint: ignore[CL101, cl104] -- why"]
    (s,) = comments_in(lines, "a.py", frozenset(BY_CODE))
    assert (s.line, s.codes, s.reason, s.problem) == (2, ("CL101", "CL104"), "why", None)


def test_only_a_whole_check_judges_suppressions_unused():
    assert whole_check(EngineOptions(), static=False)
    assert not whole_check(EngineOptions(given=("--runner",)), static=False)  # the project's check narrowed
    assert not whole_check(EngineOptions(given=("--steps",)), static=False)  # a shorter workload may miss it
    assert not whole_check(EngineOptions(invariants_file="more.toml"), static=False)
    assert not whole_check(EngineOptions(), static=True)


def test_a_shard_does_not_judge_and_merge_of_all_shards_does(tmp_path, capsys):
    path = program(tmp_path, comment="# capturelint: ignore[CL104, CL108]")
    code, whole = report(capsys, path)
    assert code == 1 and [f["code"] for f in whole["findings"]] == ["CL902"]
    assert check(capsys, path, "--shard", "1/1", "--format", "json", "-o", "shard.json")[0] == 0
    shard = json.loads(Path("shard.json").read_text())
    assert shard["findings"] == [] and shard["summary"]["suppressed"] == 1  # not judged: CL108 may be elsewhere
    assert main(["merge", "shard.json", "-o", "merged.json"]) == 1
    merged = json.loads(Path("merged.json").read_text())
    assert [f["code"] for f in merged["findings"]] == ["CL902"]
    assert Report.from_json(merged).to_json() == merged
    # the merged report is the unsharded check's, byte for byte
    assert check(capsys, path, "--format", "json", "-o", "whole.json")[0] == 1
    assert Path("merged.json").read_bytes() == Path("whole.json").read_bytes()
    assert check(capsys, path, "--shard", "1/1", "--format", "sarif", "-o", "shard.sarif")[0] == 0
    assert check(capsys, path, "--format", "sarif", "-o", "whole.sarif")[0] == 1
    assert main(["merge", "shard.sarif", "-o", "merged.sarif"]) == 1
    assert Path("merged.sarif").read_bytes() == Path("whole.sarif").read_bytes()


# ------------------------------------------------------------ accepted findings


def test_accept_findings_records_todays_findings_passes_on_them_and_fails_on_a_new_one(tmp_path, capsys):
    path = program(tmp_path)
    accepted = tmp_path / "accepted.json"
    code, out, err = check(capsys, path, "--accept-findings", str(accepted))
    assert code == 0 and accepted.exists()
    assert f"recorded 1 finding in {accepted}, which did not exist" in err
    entries = json.loads(accepted.read_text())
    assert entries["format"] == "capturelint-accepted-findings"
    assert [(e["code"], e["file"], e["tensor"]) for e in entries["findings"]] == [("CL104", "prog.py", "runner.static_x")]
    assert "line" not in entries["findings"][0]  # keyed by fingerprint: no line number

    code, doc = report(capsys, path, "--accept-findings", str(accepted))
    assert code == 0 and doc["findings"] == [] and doc["summary"]["accepted"] == 1
    assert doc["suppressed"][0]["suppression"] == {"kind": "accepted", "where": str(accepted), "reason": ""}

    # code moved by unrelated edits: still the same finding
    moved = write(tmp_path, "\n\n\n# a comment\n" + path.read_text().split("\n", 5)[5], "prog.py")
    code, doc = report(capsys, moved, "--accept-findings", str(accepted))
    assert code == 0 and doc["summary"]["accepted"] == 1

    # a new finding fails, alone
    new = program(tmp_path, second=True)
    code, doc = report(capsys, new, "--accept-findings", str(accepted))
    assert code == 1 and [(f["code"], f["tensor"]) for f in doc["findings"]] == [("CL104", "runner.static_z")]
    assert doc["summary"]["accepted"] == 1
    code, out, _ = check(capsys, new, "--accept-findings", str(accepted))
    (summary,) = [line for line in out.splitlines() if line.startswith("1 finding (CL104 x1) in 1 configuration")]
    assert "; 1 finding accepted [targets " in summary and summary.endswith("prog.py:targets]")  # then what was checked


def test_accepted_findings_that_no_longer_occur_are_shown_and_update_drops_them(tmp_path, capsys):
    path = program(tmp_path, second=True)
    accepted = tmp_path / "accepted.json"
    assert check(capsys, path, "--accept-findings", str(accepted))[0] == 0
    assert len(json.loads(accepted.read_text())["findings"]) == 2
    fixed = program(tmp_path)  # the second re-binding fixed
    code, doc = report(capsys, fixed, "--accept-findings", str(accepted))
    assert code == 0 and [e["tensor"] for e in doc["waivers"]["no_longer_occur"]] == ["runner.static_z"]
    code, out, _ = check(capsys, fixed, "--accept-findings", str(accepted))
    assert "accepted, no longer found: CL104 stale-input in prog.py" in out
    assert "1 accepted finding no longer occurs (--update-accepted drops it)" in out
    code, _, err = check(capsys, fixed, "--accept-findings", str(accepted), "--update-accepted")
    assert code == 0 and f"updated {accepted}: 1 accepted finding" in err
    assert [e["tensor"] for e in json.loads(accepted.read_text())["findings"]] == ["runner.static_x"]
    before = accepted.read_bytes()
    assert check(capsys, fixed, "--accept-findings", str(accepted), "--update-accepted")[0] == 0
    assert accepted.read_bytes() == before  # the same findings, the same bytes
    # a check whose CL104 did not run cannot tell that the entry is gone: it is kept
    code, _, err = check(capsys, fixed, "--accept-findings", str(accepted), "--update-accepted", "--select", "CL108")
    assert code == 0 and "1 kept: this check cannot tell whether they still occur" in err
    assert accepted.read_bytes() == before


def test_the_settings_name_the_accepted_file_relative_to_the_pyproject(tmp_path, capsys, monkeypatch):
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[tool.capturelint]\naccept-findings = "ci/accepted.json"\n')
    (project / "ci").mkdir()
    path = program(project)
    monkeypatch.chdir(project / "sub")
    assert check(capsys, path)[0] == 0
    assert (project / "ci" / "accepted.json").exists()
    code, doc = report(capsys, path)
    assert code == 0 and doc["summary"]["accepted"] == 1


@pytest.mark.parametrize("content, message", [
    ("{", "is not JSON"),
    ('{"format": "capturelint-snapshot"}', "is not a capturelint accepted-findings file"),
    ('{"format": "capturelint-accepted-findings", "version": 9, "findings": []}', "is of version 9"),
    ('{"format": "capturelint-accepted-findings", "version": 1, "findings": [{"code": "CL104"}]}',
     "field 'fingerprint' is missing"),
])
def test_a_bad_accepted_file_is_one_line_and_exit_2(tmp_path, capsys, content, message):
    bad = tmp_path / "accepted.json"
    bad.write_text(content)
    code, out, err = check(capsys, program(tmp_path), "--accept-findings", str(bad))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert message in err and err.startswith("capturelint: error: --accept-findings: ")
    assert bad.read_text() == content  # never rewritten


def test_what_cannot_decide_the_accepted_file_is_refused_before_the_run(tmp_path, capsys):
    path = program(tmp_path)
    code, _, err = check(capsys, path, "--update-accepted")
    assert code == 2 and "--update-accepted rewrites the accepted-findings file, and none is given" in err
    code, _, err = check(capsys, path, "--accept-findings", str(tmp_path / "new.json"), "--shard", "1/1")
    assert code == 2 and "does not exist, and recording it writes one file for the whole check" in err
    assert not (tmp_path / "new.json").exists()


def test_capturelint_run_applies_a_scripts_inline_suppressions(tmp_path, capsys):
    script = tmp_path / "serve.py"
    script.write_text(
        "import torch\n"
        "static_x = torch.zeros(4, device='cuda')\n"
        "g = torch.cuda.CUDAGraph()\n"
        "with torch.cuda.graph(g):\n"
        "    y = static_x * 2\n"
        "for i in range(3):\n"
        "    static_x = torch.full((4,), float(i), device='cuda')  # capturelint: ignore[CL104]\n"
        "    g.replay()\n"
    )
    capsys.readouterr()
    assert main(["run", "--format", "json", str(script)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["findings"] == [] and [f["code"] for f in doc["suppressed"]] == ["CL104"]
