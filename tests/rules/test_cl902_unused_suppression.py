"""CL902: an inline suppression names a code that no finding on its line has."""

from __future__ import annotations

import json

import pytest

from bare_programs import check, codes, line_of, write
from capturelint.rules import suppression_findings
from capturelint.waivers import Suppression, SuppressionView

RUNNER = """
class Runner:
    def __init__(self, in_place):
        torch.manual_seed(0)
        self.in_place = in_place
        self.model = nn.Linear(4, 4).to(DEV).eval()
        self.static_x = torch.zeros(2, 4, device=DEV)

    @torch.no_grad()
    def serve(self):
        self.model(self.static_x)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_y = self.model(self.static_x)
        for step in range(3):
            batch = torch.full((2, 4), float(step), device=DEV)
            if self.in_place:
                self.static_x.copy_(batch)  # capturelint: ignore[CL104]
            else:
                self.static_x = batch + 0  # capturelint: ignore[CL104]
            self.graph.replay()
        return self.static_y.clone()


def targets():
    return Target(run=Runner(in_place=True).serve, runner="plain", mode="graph")


def buggy():
    return Target(run=Runner(in_place=False).serve, runner="plain", mode="graph")
"""


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_a_suppression_left_after_the_fix_is_reported_at_its_comment(tmp_path, capsys):
    path = write(tmp_path, RUNNER)
    code, doc = check(capsys, path)  # the fixed runner: refreshed in place, nothing to suppress
    assert code == 1 and codes(doc) == ["CL902", "CL902"]  # the comment on the dead branch too: both are unused
    lines = sorted(f["location"]["line"] for f in doc["findings"])
    assert lines == sorted([line_of(path, "self.static_x.copy_(batch)"), line_of(path, "self.static_x = batch + 0")])
    f = doc["findings"][0]
    assert f["location"]["role"] == "comment" and f["condition"] == "suppression"
    assert (f["runner"], f["mode"]) == ("", "")  # of no configuration
    assert "names CL104, and no CL104 finding of this check is on its line" in f["message"]


def test_a_suppression_that_matches_is_not_reported(tmp_path, capsys):
    path = write(tmp_path, RUNNER)
    code, doc = check(capsys, path, "buggy")
    # the buggy runner's re-binding is suppressed; the in-place line's comment matches nothing
    assert code == 1 and codes(doc) == ["CL902"]
    assert doc["findings"][0]["location"]["line"] == line_of(path, "self.static_x.copy_(batch)")
    assert doc["summary"]["suppressed"] == 1


def test_a_code_whose_rule_had_nothing_to_check_or_a_narrowed_check_is_not_judged(tmp_path, capsys):
    # CL101 needs a shadowed step, which a bare graph has none of: the comment is not judged
    path = write(tmp_path, RUNNER.replace("ignore[CL104]", "ignore[CL101]"))
    code, doc = check(capsys, path)
    assert code == 0 and codes(doc) == []
    assert doc["waivers"]["suppressions"][0]["checked"] == []
    # a shard does not judge (merge of all the shards does)
    code, doc = check(capsys, write(tmp_path, RUNNER), "targets", "--shard", "1/1")
    assert code == 0 and codes(doc) == []
    # nor a check with CL902 ignored
    code, doc = check(capsys, write(tmp_path, RUNNER), "targets", "--ignore", "CL902")
    assert code == 0 and codes(doc) == []


def test_the_rule_judges_only_what_it_is_told_it_may():
    s = Suppression("a.py", 3, ("CL104", "CL108"), "# capturelint: ignore[CL104, CL108]", used=("CL104",),
                    checked=("CL104", "CL108"))
    (f,) = suppression_findings(SuppressionView((s,), judged=True), frozenset({"CL902"}))
    assert (f.code, f.location.line, f.op) == ("CL902", 3, "# capturelint: ignore[CL104, CL108]")
    assert "names CL108," in f.message and "Remove the unused codes" in f.message
    assert suppression_findings(SuppressionView((s,), judged=False), frozenset({"CL902"})) == []
    assert json.dumps(f.to_json())  # a finding of every format
