"""Promises that hold whatever the checked program does, and wherever a command is
stopped (issue 25, "Faults that break a promise").

One test (or a few) per item, numbered as in the issue: a program that ends the process
(1), a program that changes the working folder (2), Ctrl-C during start-up (3), output
paths and workloads that can never work, refused before the run (5), and the Python
version declared against what the code imports (6). Where a real process matters (an
``os._exit``, a signal) the test starts one, as a user does.
"""

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
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
SMALL = ["--runner", "v1", "--mode", "PIECEWISE", "--layers", "1", "--steps", "6"]

# A GPU program as written for a GPU: one bare graph, captured and replayed.
SCRIPT = """\
import os
import torch

x = torch.zeros(4, 8, device="cuda")
w = torch.randn(8, 8, device="cuda")
torch.mm(x, w)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = torch.mm(x, w)
for _ in range(2):
    x.copy_(torch.randn(4, 8, device="cuda"))
    g.replay()
torch.cuda.synchronize()
"""

# A --target over the toy engine of tests/toy_engine.py (two clean configurations).
TARGET = f"""\
import os, sys
sys.path.insert(0, {str(ROOT / "tests")!r})
from toy_engine import fixed_targets
"""


def capturelint(*args: str, cwd: Path | str = ROOT) -> subprocess.CompletedProcess:
    """``python -m capturelint ARGS`` in a process; text output."""
    return subprocess.run([sys.executable, "-m", "capturelint", *map(str, args)], cwd=cwd, env=ENV, text=True,
                          capture_output=True, timeout=300)


def run(capsys, *args: str) -> tuple[int, str, str]:
    """``capturelint ARGS`` in this process."""
    capsys.readouterr()
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str, *needles: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("capturelint: error: ") and "Traceback" not in err, err
    assert all(n in lines[0] for n in needles), err
    return lines[0]


# ------------------------------------------------- 1: a program that ends the process


@pytest.mark.parametrize("status", [0, 5])
def test_1_a_script_that_calls_os_exit_is_checked_and_the_status_is_capturelints(tmp_path, status):
    # a forked child of the script still ends with os._exit, with its own status
    fork = "pid = os.fork()\nif pid == 0:\n    os._exit(7)\nassert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7\n"
    (tmp_path / "s.py").write_text(SCRIPT + fork + f"os._exit({status})\nraise RuntimeError('after os._exit')\n")
    done = capturelint("run", "--format", "json", "s.py", cwd=tmp_path)
    # a report, and capturelint's status (0: clean), never the script's; its note says how it ended
    assert done.returncode == 0, done.stderr
    (config,) = json.loads(done.stdout)["configurations"]
    assert config["note"] == f"the script ended with os._exit({status}); it was checked up to that call"
    assert "Traceback" not in done.stderr and "after os._exit" not in done.stderr


def test_1_a_script_that_captures_nothing_before_os_exit_0_is_an_error(tmp_path):
    (tmp_path / "s.py").write_text("import os\nos._exit(0)\n")
    done = capturelint("run", "--format", "json", "s.py", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    one_error_line(done.stderr, "captured no CUDA graph")


@pytest.mark.parametrize("where", ["import", "factory", "run"])
def test_1_a_target_that_calls_os_exit_is_an_error_naming_the_call(capsys, tmp_path, monkeypatch, where):
    at = {where: "os._exit(0)"}
    (tmp_path / "t.py").write_text(
        "import os\nfrom capturelint.target import Target\n"
        f"{at.get('import', '')}\n"
        f"def run():\n    {at.get('run', 'return 0')}\n"
        f"def targets():\n    {at.get('factory', '')}\n    return [Target(run=run)]\n"
    )
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "check", "--target", "t.py:targets", "--format", "json", "-o", "out.json")
    assert code == 2 and out == ""
    one_error_line(err, "called os._exit(0)", "no verdict", "remove the os._exit call")
    assert not (tmp_path / "out.json").exists()


def test_1_os_exit_in_a_worker_job_is_an_error_naming_the_call(capsys, tmp_path, monkeypatch):
    (tmp_path / "t.py").write_text(TARGET + textwrap.dedent("""\
        import dataclasses
        def targets():
            first, second = fixed_targets()
            def ends():
                os._exit(0)
            return [first, dataclasses.replace(second, run=ends)]
        """))
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "check", "--target", "t.py:targets", "--jobs", "2", "--format", "json")
    assert code == 2 and out == ""
    one_error_line(err, "called os._exit(0)", "no verdict")


def test_1_os_exit_in_a_thread_of_the_script_ends_with_2_and_one_line(tmp_path):
    (tmp_path / "s.py").write_text(SCRIPT + "import threading, time\n"
                                   "threading.Thread(target=os._exit, args=(0,)).start()\ntime.sleep(30)\n")
    done = capturelint("run", "--format", "json", "s.py", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    one_error_line(done.stderr, "a thread of the program checked called os._exit(0)", "no verdict")


# ---------------------------------------------- 2: a program that changes the folder


def test_2_a_script_that_changes_folder_writes_the_report_where_the_user_said(capsys, tmp_path, monkeypatch):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "z.json").write_text("nobody named this\n")
    (tmp_path / "chdir.py").write_text("import os\nos.chdir('pkg')\n" + SCRIPT)
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "run", "--format", "json", "-o", "z.json", "chdir.py")
    assert code == 0, err
    assert json.loads((tmp_path / "z.json").read_text())["configurations"]
    assert (tmp_path / "pkg" / "z.json").read_text() == "nobody named this\n"
    assert Path.cwd() == tmp_path


@pytest.mark.parametrize("where", ["factory", "run"])
def test_2_a_target_that_changes_folder_writes_the_report_where_the_user_said(capsys, tmp_path, monkeypatch, where):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "z.json").write_text("nobody named this\n")
    (tmp_path / "t.py").write_text(TARGET + textwrap.dedent(f"""\
        import dataclasses
        def moved(run):
            def call():
                os.chdir({str(tmp_path / "pkg")!r})
                return run()
            return call
        def targets():
            {"os.chdir('pkg')" if where == "factory" else "pass"}
            return [dataclasses.replace(t, run=moved(t.run)) if {where == "run"} else t for t in fixed_targets()]
        """))
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "check", "--target", "t.py:targets", "--format", "json", "-o", "z.json")
    assert code == 0, err
    assert len(json.loads((tmp_path / "z.json").read_text())["configurations"]) == 2
    assert (tmp_path / "pkg" / "z.json").read_text() == "nobody named this\n"
    assert Path.cwd() == tmp_path
