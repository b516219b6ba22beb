"""``capturelint run SCRIPT.py [ARGS...]``: a plain program written for a GPU runs
unmodified under the emulated device and the tracer, and its graphs are checked; the
script's own exit status is kept apart from capturelint's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from capturelint.cli import main

ROOT = Path(__file__).resolve().parent.parent

# A GPU program as written for a GPU: .cuda(), device="cuda", side-stream warm-up, a
# bare CUDAGraph replayed with fresh inputs copied in place.
GOOD = """\
import sys
import torch
from torch import nn

print("argv:", sys.argv[1:], __name__)
model = nn.Linear(8, 8).cuda()
static_x = torch.zeros(4, 8, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        model(static_x)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    static_y = model(static_x)
steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 2
outs = []
for _ in range(steps):
    static_x.copy_(torch.randn(4, 8, device="cuda"))
    g.replay()
    outs.append(static_y.clone())
torch.cuda.synchronize()
"""

# The same, but each step re-binds the captured input while a list keeps the old one alive.
STALE = """\
import torch
from torch import nn


class Runner:
    def __init__(self):
        self.model = nn.Linear(8, 8).cuda()
        self.static_x = torch.zeros(4, 8, device="cuda")
        self.keep = [self.static_x]
        self.model(self.static_x)
        self.g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.g):
            self.static_y = self.model(self.static_x)

    def step(self, x):
        self.static_x = x  # re-binds: the graph keeps reading the captured tensor
        self.g.replay()
        return self.static_y.clone()


r = Runner()
for _ in range(3):
    r.step(torch.randn(4, 8, device="cuda"))
"""


def write(tmp_path: Path, text: str, name: str = "prog.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def run(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["run", *args])
    out, err = capsys.readouterr()
    return code, out, err


def line_of(path: Path, text: str) -> int:
    (line,) = [i for i, t in enumerate(path.read_text().splitlines(), 1) if t.strip().startswith(text)]
    return line


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # findings show paths relative to the working folder


def test_a_correct_gpu_script_is_clean_and_says_what_was_compared(capsys, tmp_path):
    write(tmp_path, GOOD)
    argv, path = list(sys.argv), list(sys.path)
    code, out, err = run(capsys, "prog.py")
    assert code == 0, err
    assert "argv: [] __main__" in err  # it ran as __main__; what it prints goes to stderr, not into the report
    assert out.splitlines()[0] == "replay NOT compared with eager in script/prog.py (bare graph, no eager twin given)"
    code, verbose, err = run(capsys, "--verbose", "prog.py")  # the evidence
    assert code == 0, err
    assert "checked: rules CL104, CL106, CL108-CL116; 2 bare-graph replays, not shadowed; no eager twin" in verbose
    assert ("no findings in 1 configuration: structural rules only, replay NOT compared with eager (bare graph, no "
            "eager twin given)") in out
    assert "matches eager" not in out
    assert (sys.argv, sys.path) == (argv, path)  # restored


def test_a_stale_input_is_found_at_the_scripts_lines(capsys, tmp_path):
    prog = write(tmp_path, STALE)
    code, out, err = run(capsys, "--format", "json", "prog.py")
    assert code == 1, err
    doc = json.loads(out)
    (f,) = doc["findings"]
    assert (f["code"], f["runner"], f["mode"], f["tensor"]) == ("CL108", "script", "prog.py", "runner.static_x")
    assert f["capture_frame"] == {"file": "prog.py", "function": "__init__", "line": line_of(prog, "self.static_y =")}
    assert f["shadow_frame"]["line"] == line_of(prog, "self.static_x = x")
    assert "1 finding (CL108 x1) in 1 configuration" in err


def test_the_scripts_arguments_pass_through(capsys, tmp_path):
    write(tmp_path, GOOD)
    code, out, err = run(capsys, "--format", "json", "prog.py", "--steps", "5", "--format", "x")
    assert code == 0, err
    assert "argv: ['--steps', '5', '--format', 'x'] __main__" in err
    assert json.loads(out)["configurations"][0]["checked"]["bare_replays"] == 5


def test_the_scripts_exit_status_is_kept_apart(capsys, tmp_path):
    write(tmp_path, STALE + "raise SystemExit(3)\n")
    code, out, err = run(capsys, "--format", "json", "prog.py")
    assert code == 1, err  # from the findings, not the script's 3
    assert json.loads(out)["configurations"][0]["note"] == "the script exited with status 3"
    assert "(the script exited with status 3)" in err
    write(tmp_path, GOOD + "sys.exit(3)\n")
    code, out, err = run(capsys, "prog.py")
    assert code == 0, err
    assert "the script exited with status 3" in out


def test_an_uncaught_exception_is_one_line_naming_the_scripts_line(capsys, tmp_path):
    prog = write(tmp_path, GOOD + "raise ValueError('bad batch')\n")
    code, out, err = run(capsys, "prog.py")
    assert code == 2
    assert out == ""
    lines = [t for t in err.splitlines() if t.startswith("capturelint:")]
    assert lines == [(f"capturelint: error: the script prog.py raised ValueError at prog.py:{line_of(prog, 'raise')} "
                      "in <module>: bad batch; this is a bug of the script, not a replay hazard: fix it and run again")]


def test_a_script_that_captures_no_graph_is_an_error(capsys, tmp_path):
    write(tmp_path, "import torch\nx = torch.ones(3, device='cuda') * 2\n")
    code, _, err = run(capsys, "prog.py")
    assert code == 2
    assert err.strip() == ("capturelint: error: the script prog.py captured no CUDA graph, so nothing was compared and "
                           "the check would prove nothing; capture with torch.cuda.CUDAGraph, torch.cuda.graph or "
                           "torch.cuda.make_graphed_callables, and replay")


def test_a_missing_script_is_an_error(capsys, tmp_path):
    code, _, err = run(capsys, "nope.py")
    assert code == 2
    assert err.strip() == ("capturelint: error: capturelint run: no file nope.py; give the path of a Python script, "
                           "e.g. capturelint run train.py --steps 3")


def test_require_oracle_refuses_a_bare_graph(capsys, tmp_path):
    write(tmp_path, GOOD)
    code, _, err = run(capsys, "--require-oracle", "prog.py")
    assert code == 2
    assert "--require-oracle asks for replay compared with eager execution, and script/prog.py" in err


def test_the_report_goes_to_a_file(capsys, tmp_path):
    write(tmp_path, STALE)
    code, out, err = run(capsys, "-o", "out.json", "--format", "json", "--ignore", "CL108", "prog.py")
    assert code == 0, err
    assert out == ""
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["findings"] == [] and doc["summary"]["not_compared"] == ["script/prog.py"]


def test_python_m_capturelint_run(tmp_path):
    write(tmp_path, STALE)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "capturelint", "run", "--format", "json", "prog.py"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1, done.stderr
    assert [f["code"] for f in json.loads(done.stdout)["findings"]] == ["CL108"]
