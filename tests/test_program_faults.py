"""Promises that hold whatever the checked program does, and wherever a command is
stopped (issue 25, "Faults that break a promise").

One test (or a few) per item, numbered as in the issue: a program that ends the process
(1), a program that changes the working folder (2), Ctrl-C during start-up (3), output
paths and workloads that can never work, refused before the run (5), and the Python
version declared against what the code imports (6). Where a real process matters (an
``os._exit``, a signal) the test starts one, as a user does.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
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
    at = {where: "os._exit(3)"}  # not 0: were it to end this process, pytest would fail, not pass
    (tmp_path / "t.py").write_text(
        "import os\nfrom capturelint.target import Target\n"
        f"{at.get('import', '')}\n"
        f"def run():\n    {at.get('run', 'return 0')}\n"
        f"def targets():\n    {at.get('factory', '')}\n    return [Target(run=run)]\n"
    )
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "check", "--target", "t.py:targets", "--format", "json", "-o", "out.json")
    assert code == 2 and out == ""
    one_error_line(err, "called os._exit(3)", "no verdict", "remove the os._exit call")
    assert not (tmp_path / "out.json").exists()


def test_1_os_exit_in_a_worker_job_is_an_error_naming_the_call(capsys, tmp_path, monkeypatch):
    (tmp_path / "t.py").write_text(TARGET + textwrap.dedent("""\
        import dataclasses
        def targets():
            first, second = fixed_targets()
            def ends():
                os._exit(3)
            return [first, dataclasses.replace(second, run=ends)]
        """))
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "check", "--target", "t.py:targets", "--jobs", "2", "--format", "json")
    assert code == 2 and out == ""
    one_error_line(err, "called os._exit(3)", "no verdict")


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



# ------------------------------------------------------ 3: Ctrl-C during start-up


def _entry_points() -> list[list[str]]:
    """The program as it starts: the console script's function (``[project.scripts]``)
    and ``python -m capturelint``."""
    import tomllib

    script = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["capturelint"]
    module, function = script.split("#")[0].strip().split(":")
    console = f"import sys; from {module} import {function}; sys.argv[0] = 'capturelint'; sys.exit({function}())"
    return [[sys.executable, "-c", console], [sys.executable, "-m", "capturelint"]]


def _handlers_installed(pid: int) -> bool:
    """Whether process ``pid`` catches SIGTERM: Python does not, capturelint's first line
    (``capturelint.launch``) makes it (``/proc/PID/status``, ``SigCgt``)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True  # it ended: nothing to wait for
    caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.M).group(1), 16)
    return bool(caught >> (signal.SIGTERM - 1) & 1)


def _interrupted_at(command: list[str], delay: float, cwd: Path) -> tuple[int | None, str]:
    """``command`` sent SIGINT ``delay`` s after its first line ran (its SIGINT at its
    default, as in a terminal); its exit status (``None``: it finished first) and
    standard error."""
    process = subprocess.Popen(command, cwd=cwd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while not _handlers_installed(process.pid):
            assert time.monotonic() < deadline, "capturelint never installed its signal handlers"
            time.sleep(0.002)
        time.sleep(delay)
        sent = process.poll() is None
        if sent:
            process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return (process.returncode if sent else None), err


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/PID/status")
def test_3_ctrl_c_at_any_moment_of_start_up_is_130_and_one_line(tmp_path):
    """A sweep over the first seconds of a check, from capturelint's first line on: the
    CLI's import, the settings, torch's import, the engine's. (Before that line the
    interpreter is starting, and a signal is Python's.) A larger, random sweep:
    bench/sweep_signals.py."""
    # a check that outlasts the sweep on any machine: every signal is sent while it runs
    long_check = ["check", "--runner", "v1", "--mode", "PIECEWISE", "--layers", "1", "--steps", "400"]
    delays = (0, 0.01, 0.03, 0.06, 0.1, 0.15, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0, 1.3, 1.7, 2.2, 2.8, 3.5)
    commands = _entry_points()
    outcomes = [(delay, *_interrupted_at([*commands[i % 2], *long_check], delay, tmp_path))
                for i, delay in enumerate(delays)]
    broken = [(delay, code, err) for delay, code, err in outcomes if (code, err) != (130, "capturelint: interrupted\n")]
    assert not broken, broken  # code None: the check finished before the signal, so the signal was swallowed


# A module that swallows what interrupts its import, as native initialisation code can
# (torch's turned a KeyboardInterrupt into SIGABRT, or swallowed it): the signal arrives
# while it is imported.
SWALLOWING_IMPORT = """\
import os, pathlib, signal
try:
    os.kill(os.getpid(), signal.{name})
    for _ in range(1000):
        pass
except BaseException:
    pass
pathlib.Path("imported").write_text("the import went on")


def targets():
    pathlib.Path("ran").write_text("the check went on")
    raise RuntimeError("the signal was swallowed")
"""


@pytest.mark.parametrize("name, status, line", [("SIGINT", 130, "capturelint: interrupted\n"),
                                                ("SIGTERM", 143, "capturelint: terminated\n")])
def test_3_a_signal_while_a_module_is_imported_ends_the_program_there(tmp_path, name, status, line):
    (tmp_path / "t.py").write_text(SWALLOWING_IMPORT.format(name=name))
    process = subprocess.run([*_entry_points()[0], "check", "--target", "t.py:targets"], cwd=tmp_path, env=ENV,
                             capture_output=True, text=True, timeout=300,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (process.returncode, process.stderr, process.stdout) == (status, line, "")
    assert not (tmp_path / "imported").exists() and not (tmp_path / "ran").exists()


def test_3_the_program_starts_with_its_signal_handlers():
    """Both ways in go through ``capturelint.launch``: the handlers before any heavy import."""
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["capturelint"].split("#")[0].strip() == "capturelint.launch:entry"
    assert "from capturelint.launch import entry" in (ROOT / "capturelint" / "__main__.py").read_text()
    probe = ("import sys, signal, capturelint.launch as launch, capturelint.interrupts as interrupts\n"
             "launch.interrupts.exit_on_signal()\n"
             "assert signal.getsignal(signal.SIGINT).__module__ == 'capturelint.interrupts'\n"
             "heavy = {'torch', 'click', 'rich', 'capturelint.cli'} & set(sys.modules)\n"
             "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", probe], env=ENV, check=True, timeout=60)


# ----------------------------------- 5: what can never work is refused before the run


@pytest.fixture
def no_run(monkeypatch):
    """Fail the test if a command loads or runs an engine: the refusal must come first."""
    from capturelint.adapters import registry

    calls: list[str] = []

    def refuse(*args, **kwargs):
        calls.append("ran")
        raise KeyboardInterrupt  # never a silent pass: the test sees 130, not its expected status

    for name in ("load", "run_check", "record_regions"):
        monkeypatch.setattr(registry, name, refuse)
    yield calls
    assert calls == [], "the command ran the engine before refusing"


@pytest.mark.skipif(not (os.path.isdir("/sys") and os.path.isdir("/proc")), reason="Linux's /sys and /proc")
@pytest.mark.parametrize("args", [
    ["check", *SMALL, "--format", "json", "-o", "/sys/x.json"],
    ["check", *SMALL, "--format", "html", "-o", "/proc/x.html"],
    ["check", *SMALL, "--accept-findings", "/sys/accepted.json"],
    ["run", "-o", "/sys/x.json", "s.py"],
    ["snapshot", *SMALL, "-o", "/proc/x.json"],
])
def test_5_an_output_folder_that_refuses_files_is_refused_before_the_run(capsys, tmp_path, monkeypatch, no_run, args):
    # root's os.access says yes to /sys and /proc; only making a file there tells
    (tmp_path / "s.py").write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *args)
    assert code == 2 and out == ""
    path = next(a for a in args if a.startswith(("/sys", "/proc")))
    one_error_line(err, f"cannot write {path}: the folder", "refuses new files", "choose a writable path with")


def test_5_the_probe_of_an_output_folder_leaves_nothing_behind(tmp_path):
    from capturelint.output import check_output_path

    (tmp_path / "old.json").write_text("{}")
    check_output_path(str(tmp_path / "new.json"))
    check_output_path(str(tmp_path / "old.json"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]


@pytest.mark.parametrize("batches, captures, wider, smaller", [
    ("8", "2,4", "2,4,8", "1,2,3,4"),
    ("5,6", None, "2,4,6", "1,2,3,4"),  # the default capture sizes, 2,4
])
def test_5_a_vllm_batch_larger_than_every_capture_size_says_what_to_change(capsys, no_run, batches, captures, wider,
                                                                          smaller):
    code, out, err = run(capsys, "check", "--engine", "vllm", "--runner", "v1", "--mode", "PIECEWISE", "--layers", "1",
                         "--batch-sizes", batches, *(["--capture-sizes", captures] if captures else []))
    assert code == 2 and out == ""
    line = one_error_line(err, "every step runs eagerly and no CUDA graph is replayed")
    assert f"--capture-sizes {wider}" in line and f"--batch-sizes {smaller}" in line and "more steps" not in line


def test_5_a_vllm_workload_with_a_step_that_fits_a_capture_size_runs(capsys, no_run):
    # one of its steps runs 1 request, which fits capture size 2: a graph can replay
    code, _, err = run(capsys, "check", "--engine", "vllm", "--runner", "v1", "--mode", "PIECEWISE", "--layers", "1",
                       "--steps", "2", "--batch-sizes", "1,9", "--capture-sizes", "2")
    assert code == 130 and no_run == ["ran"], err  # it went on to the run (stopped there by the fixture)
    no_run.clear()


# --------------------------------- 6: the Python declared is the Python the code needs

# What the standard library gained, by the version that brought it (3.10 to 3.13): a
# module, or a module's name. Enough to tell the versions the package could need.
NEW_IN: dict[tuple[int, int], frozenset[str]] = {
    (3, 10): frozenset({"typing.ParamSpec", "typing.TypeAlias", "typing.TypeGuard", "typing.Concatenate",
                        "typing.is_typeddict", "itertools.pairwise", "contextlib.aclosing", "bisect.key",
                        "dataclasses.KW_ONLY", "sys.orig_argv", "sys.stdlib_module_names", "aiter", "anext",
                        "EncodingWarning", "inspect.get_annotations"}),
    (3, 11): frozenset({"tomllib", "wsgiref.types", "typing.Self", "typing.LiteralString", "typing.Never",
                        "typing.assert_never", "typing.assert_type", "typing.reveal_type", "typing.Required",
                        "typing.NotRequired", "typing.dataclass_transform", "typing.TypeVarTuple", "typing.Unpack",
                        "enum.StrEnum", "enum.ReprEnum", "enum.verify", "enum.member", "enum.nonmember",
                        "datetime.UTC", "asyncio.TaskGroup", "asyncio.timeout", "asyncio.Runner", "contextlib.chdir",
                        "operator.call", "hashlib.file_digest", "math.exp2", "math.cbrt", "ExceptionGroup",
                        "BaseExceptionGroup", "sys.exception", "logging.getLevelNamesMapping"}),
    (3, 12): frozenset({"typing.override", "typing.TypeAliasType", "itertools.batched", "sys.monitoring",
                        "calendar.Month", "calendar.Day", "os.path.splitroot", "math.sumprod",
                        "sys.activate_stack_trampoline", "collections.abc.Buffer"}),
    (3, 13): frozenset({"warnings.deprecated", "typing.ReadOnly", "typing.TypeIs", "typing.NoDefault",
                        "copy.replace", "PythonFinalizationError", "base64.z85encode"}),
}


def needed_python(source: str) -> tuple[int, int]:
    """The oldest Python 3 that ``source`` runs on, by its syntax and by what it takes
    from the standard library (``NEW_IN``)."""
    tree = ast.parse(source)
    used: set[str] = set()
    needed = (3, 9)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            used.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            used.add(node.module)
            used.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            used.add(f"{node.value.id}.{node.attr}")
        elif isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.Match):
            needed = max(needed, (3, 10))
        elif type(node).__name__ == "TryStar":
            needed = max(needed, (3, 11))
        elif type(node).__name__ == "TypeAlias":
            needed = max(needed, (3, 12))
    for version, names in NEW_IN.items():
        if used & names:
            needed = max(needed, version)
    return needed


def declared_python() -> tuple[int, int]:
    import tomllib

    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    match = re.fullmatch(r">=\s*3\.(\d+)", spec.strip())
    assert match, f"requires-python {spec!r} is not >=3.N"
    return 3, int(match.group(1))


@pytest.mark.parametrize("source, version", [
    ("import os\nx = os.getcwd()\n", (3, 9)),
    ("import tomllib\n", (3, 11)),
    ("def f():\n    from typing import Self\n", (3, 11)),
    ("from itertools import batched\n", (3, 12)),
    ("import enum\nclass E(enum.StrEnum):\n    A = 'a'\n", (3, 11)),
    ("match x:\n    case 1:\n        pass\n", (3, 10)),
    ("try:\n    pass\nexcept* ValueError:\n    pass\n", (3, 11)),
])
def test_6_the_version_reader_knows_what_each_python_brought(source, version):
    assert needed_python(source) == version


def test_6_the_declared_python_runs_every_module_of_the_package():
    declared = declared_python()
    needs = {path.relative_to(ROOT).as_posix(): needed_python(path.read_text())
             for path in sorted((ROOT / "capturelint").rglob("*.py"))}
    too_new = {path: f"3.{v[1]}" for path, v in needs.items() if v > declared}
    assert not too_new, f"requires-python >=3.{declared[1]}, but these modules need newer: {too_new}"
    # the declared version is the one the code needs (no older Python claimed, none refused for nothing)
    assert max(needs.values()) == declared


def test_6_the_readme_says_the_declared_python():
    assert f"Python 3.{declared_python()[1]} or newer" in (ROOT / "README.md").read_text()
