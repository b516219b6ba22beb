"""Progress where people wait, and colour as ruff has it (issue 25, item 9).

Off a terminal (a CI log) a command prints one plain line per configuration finished on
stderr (what, its verdict, its seconds) and stdout carries the report alone, byte for
byte what a quiet run prints; ``--quiet`` and ``CAPTURELINT_QUIET=1`` silence it. On a
terminal the bar names every configuration running under ``--jobs``; ``suggest`` names
each run and the candidate (no total that grows) and ends with the command that applies
its patch. ``--color``, ``NO_COLOR`` and ``FORCE_COLOR`` decide colour.

The conftest sets ``CAPTURELINT_QUIET=1`` for the suite; these tests unset it.
"""

from __future__ import annotations

import json
import re

import pytest

from capturelint.api import ProgressReporter
from capturelint.cli import main
from capturelint.pipeline import Task, run_all
from capturelint.report import ConfigReport

TOY = ["--target", "tests/toy_engine.py:fixed_targets"]  # two configurations, clean
LINE = re.compile(r"^capturelint: (.+): (.+) \((\d+\.\d) s\) \[(\d+)/(\d+)\]$")
ESC = "\x1b["


def run(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def progress_on(monkeypatch):
    monkeypatch.delenv("CAPTURELINT_QUIET", raising=False)
    for name in ("NO_COLOR", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)


def test_off_a_terminal_a_line_per_configuration_on_stderr_and_stdout_is_the_report(capsys, progress_on,
                                                                                      monkeypatch):
    code, out, err = run(capsys, "check", *TOY, "--format", "json")
    assert code == 0
    doc = json.loads(out)  # stdout: the report alone
    configs = [f"{c['runner']}/{c['mode']}" for c in doc["configurations"]]
    lines = err.splitlines()
    progress = [LINE.match(line) for line in lines]
    assert len(configs) == 2 and sum(1 for m in progress if m) == len(configs), err
    for i, m in enumerate([m for m in progress if m], 1):
        assert m[2] == "no findings, replay matches eager" and float(m[3]) >= 0
        assert (int(m[4]), int(m[5])) == (i, len(configs))
    # the same bytes on stdout as a quiet run's
    monkeypatch.setenv("CAPTURELINT_QUIET", "1")
    code, quiet_out, quiet_err = run(capsys, "check", *TOY, "--format", "json")
    assert code == 0 and quiet_out == out
    assert not any(LINE.match(line) for line in quiet_err.splitlines())


def test_a_line_says_a_configurations_findings(capsys, progress_on):
    code, out, err = run(capsys, "check", "--target", "examples/plain/stale_holder.py:targets_bug", "--format", "json")
    assert code == 1
    n = len(json.loads(out)["findings"])
    (m,) = [m for m in map(LINE.match, err.splitlines()) if m]
    assert m[2].startswith(f"{n} finding{'s' * (n != 1)}") and m[1].startswith("runner ")


def test_quiet_silences_progress(capsys, progress_on):
    for flag in ("--quiet", "-q"):
        code, out, err = run(capsys, "check", *TOY, flag)
        assert code == 0 and not any(LINE.match(line) for line in err.splitlines()), err
        assert out.splitlines()[-1] == ("no findings in 2 configurations: replay matches eager execution "
                                        "[targets tests/toy_engine.py:fixed_targets]")


def test_a_bad_quiet_variable_is_one_line(capsys, monkeypatch):
    monkeypatch.setenv("CAPTURELINT_QUIET", "maybe")
    code, out, err = run(capsys, "check", *TOY)
    assert code == 2 and out == ""
    assert err.splitlines() == ["capturelint: error: CAPTURELINT_QUIET='maybe' is not a switch; set it to 1 (or true, "
                                "yes, on) to silence progress, 0 (or false, no, off) or unset it"]


def test_the_python_api_prints_no_progress_off_a_terminal(capsys, progress_on):
    from capturelint import api

    capsys.readouterr()
    api.check(target="tests/toy_engine.py:fixed_targets")
    assert capsys.readouterr().err == ""


class Heard:
    """What the pipeline tells a progress reporter."""

    def __init__(self):
        self.events: list[tuple] = []

    def __call__(self, label):  # the older protocol: never used when the newer is there
        raise AssertionError(label)

    def running(self, labels):
        self.events.append(("running", tuple(labels)))

    def finished(self, label, report, seconds):
        assert isinstance(report, ConfigReport) and seconds >= 0
        self.events.append(("finished", label, report.mode))


def _config(mode: str) -> ConfigReport:
    return ConfigReport("v1", mode, "narrow", [], None, [])


@pytest.mark.parametrize("jobs", [1, 2])
def test_every_configuration_running_is_named(jobs):
    tasks = [Task(f"t{i}", lambda i=i: _config(f"M{i}")) for i in range(3)]
    heard = Heard()
    reports = run_all(tasks, jobs, heard)
    assert [r.mode for r in reports] == ["M0", "M1", "M2"]
    if jobs == 1:
        assert heard.events[0] == ("running", ("t0",))
    else:  # under --jobs 2, two run at once, and the bar names both
        assert heard.events[0] == ("running", ("t0", "t1"))
    finished = [e for e in heard.events if e[0] == "finished"]
    assert finished == [("finished", f"t{i}", f"M{i}") for i in range(3)]


def test_on_a_terminal_the_bar_names_the_configurations_running(monkeypatch, progress_on):
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with ProgressReporter(3) as progress:
        assert progress.bar and not progress.lines
        progress.running(["runner v1 · PIECEWISE", "runner v1 · FULL"])
        task = progress.progress.tasks[0]
        assert task.description == "checking runner v1 · PIECEWISE, runner v1 · FULL" and task.total == 3
        progress.finished("runner v1 · PIECEWISE", _config("PIECEWISE"), 1.0)
        assert progress.progress.tasks[0].completed == 1
    # suggest: a spinner naming the run and the candidate, never a total that grows
    with ProgressReporter(2, unbounded=True) as progress:
        for total in (2, 8, 16):
            progress.trying("v1/PIECEWISE · Attention.forward", total)
        task = progress.progress.tasks[0]
        assert task.total is None and task.description == "suggest run 3: v1/PIECEWISE · Attention.forward"


def test_suggest_names_each_run_and_ends_with_the_command_that_applies_its_patch(capsys, progress_on):
    code, out, err = run(capsys, "suggest", "--target", "tests/suggest_engines.py:targets")
    assert code == 0
    runs = [line for line in err.splitlines() if line.startswith("capturelint: suggest run ")]
    assert runs and [int(r.split()[3].rstrip(":")) for r in runs] == list(range(1, len(runs) + 1))
    assert out.rstrip().splitlines()[-1] == ("apply the best region: capturelint suggest --target "
                                            "tests/suggest_engines.py:targets --format patch | git apply")


# ------------------------------------------------------------------------- colour


@pytest.mark.parametrize("env, flag, coloured", [
    ({}, None, False),  # auto, not a terminal
    ({"FORCE_COLOR": "1"}, None, True),
    ({"NO_COLOR": "1"}, "always", True),  # the flag overrides the variables
    ({"FORCE_COLOR": "1"}, "never", False),
    ({"FORCE_COLOR": "1", "NO_COLOR": "1"}, None, False),  # NO_COLOR wins
    ({}, "always", True),
    ({"NO_COLOR": ""}, None, False),  # empty: not set
])
def test_colour_as_ruff_has_it(capsys, progress_on, monkeypatch, env, flag, coloured):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, out, err = run(capsys, "check", *TOY, "-q", *(["--color", flag] if flag else []))
    assert code == 0 and (ESC in out) == coloured, out
    assert "replay matches eager execution" in out


def test_a_bad_colour_is_a_usage_error(capsys):
    code, out, err = run(capsys, "check", *TOY, "--color", "sometimes")
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and "--color" in err
