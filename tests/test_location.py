"""Every finding names the line a developer edits: the re-binding of a captured input
(CL104 freed, CL108), the branch condition (CL101), first in every format."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from bare_programs import line_of, write
from capturelint.cli import main
from capturelint.findings import Condition, EditLine, Finding, LineRole
from capturelint.runtime.protocol import Frame
from capturelint.sources import SourceFiles, branch_line

REBOUND = """
class Runner:
    def __init__(self):
        torch.manual_seed(0)
        self.model = nn.Linear(4, 4).to(DEV).eval()
        self.static_x = torch.zeros(2, 4, device=DEV)

    @torch.no_grad()
    def serve(self, batches):
        self.model(self.static_x)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_y = self.model(self.static_x)
        outs = []
        for x in batches:
            self.static_x = x.to(DEV)
            self.graph.replay()
            outs.append(self.static_y.clone())
        return outs


def targets():
    batches = [torch.full((2, 4), float(i)) for i in range(3)]  # made outside the tracer's watch
    return Target(run=lambda: Runner().serve(batches), runner="plain", mode="graph")
"""


def run(capsys, path: Path, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["check", "--target", f"{path}:targets", *args])
    return code, capsys.readouterr().out


def test_a_freed_rebound_input_is_located_at_the_rebinding_line_in_every_format(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # findings name prog.py, as a user's project shows it
    path = write(tmp_path, REBOUND)
    rebind, capture = line_of(path, "self.static_x = x.to(DEV)"), line_of(path, "self.static_y = self.model(")

    code, out = run(capsys, path, "--format", "json")
    assert code == 1
    (f,) = json.loads(out)["findings"]
    assert f["code"] == "CL104" and f["tensor"] == "runner.static_x"
    assert f["location"] == {"file": "prog.py", "line": rebind, "function": "serve", "role": "re-binding"}
    assert f["capture_frame"]["line"] == capture  # the op's line stays
    assert f["allocation_frame"] is None  # the new tensor was made where the tracer does not watch
    assert f"re-bound at prog.py:{rebind}" in f["message"]

    code, out = run(capsys, path, "--format", "sarif")
    (result,) = json.loads(out)["runs"][0]["results"]
    assert result["locations"][0]["physicalLocation"]["region"]["startLine"] == rebind
    assert [r["physicalLocation"]["region"]["startLine"] for r in result["relatedLocations"]] == [capture]

    code, out = run(capsys, path, "--format", "github")
    assert out.splitlines()[0].startswith(f"::error file=prog.py,line={rebind},title=CL104 stale-input::")

    code, out = run(capsys, path)
    (line,) = [t for t in out.splitlines() if ": CL104 " in t]
    assert line.startswith(f"prog.py:{rebind}: CL104 ")

    code, out = run(capsys, path, "--verbose")
    assert f"line to change (re-binding): prog.py:{rebind} in serve" in out
    assert f"capture: prog.py:{capture} in serve" in out


def test_the_location_reads_back_from_json():
    edited = Finding("CL101", "baked-control-flow", Condition.R1, "v1", "PIECEWISE", "g", "PIECEWISE", "g #0 captured", 0, "aten.mm.default", "m", None,
                     Frame("a.py", 5, "f"), Frame("a.py", 7, "f"), "m.", edit=EditLine(Frame("a.py", 3, "f"),
                                                                                      LineRole.BRANCH))
    doc = edited.to_json()
    assert doc["location"] == {"file": "a.py", "line": 3, "function": "f", "role": "branch"}
    assert Finding.from_json(doc) == edited and Finding.from_json(doc).to_json() == doc
    plain = Finding.from_json({**doc, "location": {"file": "a.py", "line": 5, "function": "f", "role": "capture"}})
    assert plain.edit is None and plain.location == Frame("a.py", 5, "f")  # the op's own line: no edit


# ----------------------------------------------------------- the branch condition


SOURCE = """\
def prepare(q, md, n):
    if md is None:
        q = pad(q)
    out = insert(q)
    if n > 4:
        a = big(q)
    elif n > 2:
        a = mid(q)
    else:
        a = small(q)
    while n:
        n = step(n)
    done(n)
    if md:
        if n:
            c = third(q)
    b = (first(q)
         if md
         else second(q))
    return helper(q)


def helper(q):
    return q
"""


def frames(tmp_path: Path) -> tuple[SourceFiles, callable]:
    path = tmp_path / "engine.py"
    path.write_text(SOURCE)

    def at(line: int, function: str = "prepare", first: int = 1) -> Frame:
        return Frame("engine.py", line, function, function, str(path), first)

    return SourceFiles(), at


def test_branch_line_finds_the_condition_whose_arms_part_the_two_sides(tmp_path):
    sources, at = frames(tmp_path)
    # an if without else: the capture entered it, the step went past it
    assert branch_line([at(3)], at(4), sources).line == 2
    # if / elif / else: the outer if parts its body from the else, not the elif
    assert branch_line([at(6)], at(10), sources).line == 5
    # the elif parts its own arms
    assert branch_line([at(8)], at(10), sources).line == 7
    # a loop that ran once more at capture
    assert branch_line([at(12)], at(13), sources).line == 11
    # a conditional expression over three lines: its test's line
    assert branch_line([at(17)], at(19), sources).line == 18
    # the capture entered two nested ifs that the step went past: the outer one decided
    assert branch_line([at(16)], at(17), sources).line == 14
    found = branch_line([at(3)], at(4), sources)
    assert (found.file, found.function, found.source) == ("engine.py", "prepare", str(tmp_path / "engine.py"))


def test_branch_line_walks_the_capture_stack_to_the_function_both_sides_run(tmp_path):
    sources, at = frames(tmp_path)
    # the capture's op ran in helper(), called from prepare's last line; the step's in prepare, inside the
    # first if, which the capture skipped
    assert branch_line([at(24, "helper", 23), at(20)], at(3), sources).line == 2
    # the step's op inside helper() too: its function is the common one, and nothing in it branches
    assert branch_line([at(24, "helper", 23), at(20)], at(24, "helper", 23), sources) is None


def test_branch_line_gives_none_where_nothing_separates(tmp_path):
    sources, at = frames(tmp_path)
    assert branch_line([at(4)], at(4), sources) is None  # one line
    assert branch_line([at(4)], at(13), sources) is None  # straight-line code
    assert branch_line([at(24, "helper", 23)], at(4), sources) is None  # the step's function is not on the stack
    missing = Frame("gone.py", 3, "prepare", "prepare", str(tmp_path / "gone.py"), 1)
    assert branch_line([missing], Frame("gone.py", 4, "prepare", "prepare", missing.source, 1), sources) is None


def test_cl109_is_located_where_the_stale_view_was_taken(tmp_path, capsys):
    path = write(tmp_path, textwrap.dedent("""
    @torch.no_grad()
    def serve():
        x = torch.zeros(4, device=DEV)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x * 2
        views = []
        for step in range(3):
            x.copy_(torch.full((4,), float(step)))
            g.replay()
            views.append(y[:2])
        return torch.cat(views)


    def targets():
        return Target(run=serve, runner="plain", mode="graph")
    """))
    code, out = run(capsys, path, "--format", "json")
    found = [f for f in json.loads(out)["findings"] if f["code"] == "CL109"]
    assert code == 1 and found
    taken = line_of(path, "views.append(y[:2])")
    assert {(f["location"]["line"], f["location"]["role"]) for f in found} == {(taken, "view")}
    assert {f["shadow_frame"]["line"] for f in found} == {line_of(path, "return torch.cat(views)")}


def test_a_frame_spells_its_location_as_file_colon_line():
    frame = Frame("engine/attn.py", 305, "forward", qualname="Attn.forward")
    assert frame.location == "engine/attn.py:305"
    assert str(frame) == "engine/attn.py:305 in forward"
    assert Frame("<unknown>", 0, "<unknown>").location == "<unknown>:0"
