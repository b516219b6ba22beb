"""Every fault of a ``--jobs`` run ends as stated (issue 16): one test (or a few) per row,
numbered as there.

Configurations run in worker processes forked from the command (``parallel_map``). A
worker's error comes back as data and is raised in the command with the same one line;
a worker that dies is an error naming its configuration; Ctrl-C, SIGTERM and SIGKILL
end the workers with the command, and nothing of theirs is printed. Where a real process
matters (signals, dead workers, hangs) the test starts one, with a timeout so that a
hang fails the test instead of the suite.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from capturelint.cli import main
from capturelint.errors import CapturelintError
from capturelint.hosting import real_exit
from capturelint.pipeline import WorkerCrash, parallel_map

ROOT = Path(__file__).resolve().parent.parent

# Targets of a plain torch.cuda.CUDAGraph program (the cheapest target), each factory one fault.
TARGETS = '''
import os, pathlib, signal, time
import torch
from capturelint.target import Target


class Doubler:
    """x * 2, captured once and replayed per step."""

    def __init__(self):
        self.x = torch.zeros(4)
        self.graph = torch.cuda.CUDAGraph()

    def run(self):
        with torch.cuda.graph(self.graph):
            self.y = self.x * 2
        out = []
        for i in range(3):
            self.x.copy_(torch.full((4,), float(i)))
            self.graph.replay()
            out.append(self.y.clone())
        return out

    def eager(self):
        return [torch.full((4,), float(i)) * 2 for i in range(3)]


class Unpicklable(Exception):
    def __init__(self, a, b):  # pickle rebuilds it with one argument: unpickling fails
        super().__init__(f"{a} and {b}")


def _runs_forever():
    pathlib.Path(f"worker-{os.getpid()}").write_text("")  # the test waits for this
    while True:
        time.sleep(0.05)


def forever():
    return [Target(run=_runs_forever, runner=f"forever{i}") for i in range(2)]


def exits():
    # the process's own end, as native code ends it: os._exit from Python is an error naming the call
    # (capturelint.hosting, tests/test_program_faults.py)
    from capturelint.hosting import real_exit

    return [Target(run=Doubler().run, runner="fine"), Target(run=lambda: real_exit(0), runner="dies")]


def killed():
    return [Target(run=Doubler().run, runner="fine"),
            Target(run=lambda: os.kill(os.getpid(), signal.SIGKILL), runner="dies")]


def _raise(error):
    def eager():
        raise error
    return eager


def unpicklable():
    return [Target(run=Doubler().run, eager=_raise(Unpicklable(1, 2)), runner=r) for r in ("a", "b")]


def raises():
    return [Target(run=Doubler().run, eager=_raise(ValueError("no eager run here")), runner=r) for r in ("a", "b")]


def eager_none():
    return [Target(run=Doubler().run, eager=lambda: None, runner="a")]


def eager_text():
    return [Target(run=Doubler().run, eager=lambda: "done", runner="a")]


def run_none():
    d = Doubler()
    return [Target(run=lambda: d.run() and None, eager=d.eager, runner="a")]
'''


@pytest.fixture
def targets(tmp_path):
    (tmp_path / "faults.py").write_text(TARGETS)
    return tmp_path


def start(folder: Path, factory: str, *args: str) -> subprocess.Popen:
    """``capturelint check --target faults.py:FACTORY`` in its own session (process
    group), with Ctrl-C's default handling (a background shell ignores it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "capturelint.cli", "check", "--target", f"faults.py:{factory}", *args],
        cwd=folder, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def finish(process: subprocess.Popen) -> tuple[int, str, str]:
    """Its exit status and output; a hang fails the test (the pipes close only once the
    workers, which hold them too, are gone)."""
    try:
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    return process.returncode, out.decode(), err.decode()


def running_workers(folder: Path, process: subprocess.Popen, count: int) -> list[int]:
    """The pids of ``count`` workers, once each is inside its target's run()."""
    deadline = time.monotonic() + 240
    while len(markers := list(folder.glob("worker-*"))) < count:
        assert process.poll() is None and time.monotonic() < deadline, finish(process)
        time.sleep(0.05)
    return [int(m.name.split("-")[1]) for m in markers]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a zombie has ended; only its exit status is left


def assert_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if alive(p)], "worker processes outlived the command"


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("capturelint: error: ") and "Traceback" not in err, err
    return lines[0]


# ------------------------------------------------------------ N1: Ctrl-C


def test_n1_ctrl_c_ends_the_workers_with_one_line(targets):
    process = start(targets, "forever", "--jobs", "2")
    workers = running_workers(targets, process, 2)
    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the whole process group
    code, out, err = finish(process)
    assert (code, out, err) == (130, "", "capturelint: interrupted\n")
    assert_gone(workers)


# ------------------------------------------------------------ N2: a worker dies


@pytest.mark.parametrize("factory, how", [("exits", "exited with status 0"), ("killed", "was killed by SIGKILL")])
def test_n2_a_dead_worker_is_an_error_naming_its_configuration(targets, factory, how):
    code, out, err = finish(start(targets, factory, "--jobs", "2"))
    assert code == 2 and out == ""
    line = one_error_line(err)
    assert f"the worker process checking runner dies · custom {how} before returning its result" in line
    assert "fine" not in line and "no verdict" in line
    if factory == "killed":  # what the OOM killer does
        assert "run fewer --jobs" in line


def _exit_three() -> None:
    real_exit(3)  # as native code ends a process (os._exit from Python is turned into an error in a job)


def test_n2_parallel_map_names_the_job_of_a_dead_worker():
    with pytest.raises(CapturelintError, match="the worker process checking second exited with status 3 before"):
        parallel_map([lambda: 1, _exit_three, lambda: 3], 2, names=["first", "second", "third"])


# ------------------------------------------------- N3: an exception that cannot be unpickled


def test_n3_an_unpicklable_exception_of_a_target_is_one_line(targets):
    code, out, err = finish(start(targets, "unpicklable", "--jobs", "2"))
    assert code == 2 and out == ""
    line = one_error_line(err)
    assert "--target 'faults.py:unpicklable': eager() of runner a, mode custom raised Unpicklable: 1 and 2" in line


class _Unpicklable(Exception):
    def __init__(self, a: int, b: int):
        super().__init__(f"{a} and {b}")


def _raise_unpicklable() -> None:
    raise _Unpicklable(1, 2)


def test_n3_a_bug_in_a_worker_comes_back_as_data_with_its_traceback():
    with pytest.raises(WorkerCrash, match="_Unpicklable in the worker process checking job 2: 1 and 2") as raised:
        parallel_map([lambda: 1, _raise_unpicklable], 2)
    assert "_raise_unpicklable" in str(raised.value.__cause__)  # the worker's traceback, for --debug


# ------------------------------------------------------------ N4: eager() raises


def test_n4_eager_raising_is_an_error_naming_the_target_with_any_jobs(targets, monkeypatch, capsys):
    monkeypatch.chdir(targets)
    lines = []
    for jobs in ("1", "2"):
        assert main(["check", "--target", "faults.py:raises", "--jobs", jobs]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        lines.append(one_error_line(err))
    assert lines[0] == lines[1]  # the worker's error, raised here with the same line
    assert ("--target 'faults.py:raises': eager() of runner a, mode custom raised ValueError: no eager run here"
            in lines[0])
    assert "internal error" not in lines[0]


# ------------------------------------------------- N5: nothing to compare


@pytest.mark.parametrize("factory, what", [
    ("eager_none", "eager() of runner a, mode custom returned None"),
    ("eager_text", "eager() of runner a, mode custom returned a str with no tensors"),
    ("run_none", "run() of runner a, mode custom returned None"),
])
def test_n5_an_output_without_tensors_is_an_error_saying_what_to_return(targets, monkeypatch, capsys, factory, what):
    monkeypatch.chdir(targets)
    assert main(["check", "--target", f"faults.py:{factory}"]) == 2
    out, err = capsys.readouterr()
    line = one_error_line(err)
    assert out == "" and f"--target 'faults.py:{factory}': {what}, so there is nothing to compare" in line
    assert "must each return the output to compare: tensors, or lists, tuples or dicts of them" in line
    assert "CL901" not in line


# ------------------------------------------------- N6: the command is killed


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_n6_workers_end_with_the_command_silently(targets, sig):
    process = start(targets, "forever", "--jobs", "2")
    workers = running_workers(targets, process, 2)
    os.kill(process.pid, sig)  # the command alone, not its group
    code, out, err = finish(process)
    assert code != 0 and out == ""
    # nothing from the workers: at most the command's own one line (a SIGTERM handler's)
    assert len(err.splitlines()) <= 1 and all(line.startswith("capturelint: ") for line in err.splitlines()), err
    assert_gone(workers)


class _Stop(Exception):
    pass


def _signal_parent_then_wait(folder: str) -> None:
    Path(folder, f"worker-{os.getpid()}").write_text("")
    os.kill(os.getppid(), signal.SIGUSR1)
    while True:
        time.sleep(0.05)


def test_n6_an_exception_raised_here_while_waiting_kills_the_workers(tmp_path):
    # what a SIGTERM handler that raises in the command does
    def stop(signum, frame):
        raise _Stop

    previous = signal.signal(signal.SIGUSR1, stop)
    try:
        with pytest.raises(_Stop):
            parallel_map([lambda: _signal_parent_then_wait(str(tmp_path))] * 2, 2)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    workers = [int(m.name.split("-")[1]) for m in tmp_path.glob("worker-*")]
    assert workers and os.getpid() not in workers
    assert_gone(workers)
