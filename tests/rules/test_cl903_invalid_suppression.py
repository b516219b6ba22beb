"""CL903: an inline suppression names no rule code (bare, empty, unknown)."""

from __future__ import annotations

import pytest

from bare_programs import check, codes, line_of, write
from capturelint.rules import BY_CODE
from capturelint.waivers import comments_in

RUNNER = """
class Runner:
    def __init__(self):
        torch.manual_seed(0)
        self.model = nn.Linear(4, 4).to(DEV).eval()
        self.static_x = torch.zeros(2, 4, device=DEV)

    @torch.no_grad()
    def serve(self):
        self.model(self.static_x)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_y = self.model(self.static_x)
        for step in range(3):
            self.static_x = torch.full((2, 4), float(step), device=DEV)  # capturelint: ignore
            self.graph.replay()
        return self.static_y.clone()


def targets():
    return Target(run=Runner().serve, runner="plain", mode="graph")
"""


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def test_a_bare_ignore_is_refused_and_the_finding_on_its_line_still_fails(tmp_path, capsys):
    path = write(tmp_path, RUNNER)
    code, doc = check(capsys, path)
    assert code == 1 and sorted(codes(doc)) == ["CL104", "CL903"]
    rebind = line_of(path, "self.static_x = torch.full(")
    (bad,) = [f for f in doc["findings"] if f["code"] == "CL903"]
    assert bad["location"] == {"file": "prog.py", "line": rebind, "function": "", "role": "comment"}
    assert "`# capturelint: ignore` at prog.py:" in bad["message"] and "names no code" in bad["message"]
    assert doc["summary"]["suppressed"] == 0


def test_a_suppression_naming_its_code_is_not_reported(tmp_path, capsys):
    code, doc = check(capsys, write(tmp_path, RUNNER.replace("ignore\n", "ignore[CL104]\n")))
    assert code == 0 and codes(doc) == [] and doc["summary"]["suppressed"] == 1


@pytest.mark.parametrize("comment, problem", [
    ("# capturelint: ignore[]", "names no code between its brackets"),
    ("# capturelint: ignore[CL999]", "names CL999, which is no rule code"),
    ("# capturelint: ignore[CL104", "has no closing bracket after its codes"),
    ("# capturelint: ignore", "names no code"),
])
def test_every_malformed_directive_is_one_and_says_why(comment, problem):
    (s,) = comments_in([f"x = 1  {comment}"], "a.py", frozenset(BY_CODE))
    assert s.problem == problem


def test_a_directive_in_a_string_or_another_comment_word_is_not_one():
    assert comments_in(['s = "# capturelint: ignore"', "# capturelint: ignored elsewhere"], "a.py",
                       frozenset(BY_CODE)) == []
