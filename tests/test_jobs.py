"""Configurations in parallel worker processes (``--jobs``) and work shared between
configurations (the eager twins; ``--no-reuse``): neither may change the report."""

from __future__ import annotations

import pytest

from capturelint.cli import main
from capturelint.errors import CapturelintError
from capturelint.pipeline import parallel_map

# both runners, with findings (the narrow region fails under V1 PIECEWISE), two modes each:
# two configurations share each runner's eager twin, which --no-reuse runs again per
# configuration. Every mode (8 configurations) is the opt-in slow job.
MATRIX = ["check", "--runner", "all", "--eager-region", "narrow", "--layers", "1", "--steps", "6", "--format", "json"]
TWO_MODES = ["--mode", "PIECEWISE,FULL"]


@pytest.mark.parametrize("modes, configurations", [
    pytest.param(TWO_MODES, 4, id="two-modes"),
    pytest.param([], 8, id="every-mode", marks=pytest.mark.slow),
])
def test_report_is_byte_identical_for_any_jobs_and_without_reuse(tmp_path, capsys, modes, configurations):
    outputs = {}
    for name, extra in {"serial": ["--jobs", "1"], "parallel": ["--jobs", "2"],
                        "no-reuse": ["--jobs", "2", "--no-reuse"]}.items():
        path = tmp_path / f"{name}.json"
        assert main([*MATRIX, *modes, *extra, "-o", str(path)]) == 1  # CL101 under v1
        outputs[name] = path.read_bytes()
    capsys.readouterr()
    assert b'"CL101"' in outputs["serial"] and f'"configurations": {configurations}'.encode() in outputs["serial"]
    assert outputs["parallel"] == outputs["serial"]
    assert outputs["no-reuse"] == outputs["serial"]


@pytest.mark.parametrize("value", ["0", "257", "-1"])
def test_bad_jobs_is_one_line(value, capsys):
    assert main(["check", "--jobs", value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--jobs must be an integer from 1 to 256" in err[0]


def test_jobs_setting_is_checked(tmp_path, capsys):
    config = tmp_path / "pyproject.toml"
    config.write_text("[tool.capturelint]\njobs = 0\n")
    assert main(["check", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "jobs" in err and "an integer from 1 to 256" in err


def test_parallel_map_keeps_order_and_runs_closures():
    state = {"base": 10}  # a closure over local state: inherited by the fork, never pickled
    fns = [lambda i=i: state["base"] + i * i for i in range(5)]
    done = []
    assert parallel_map(fns, 2, done.append) == [10, 11, 14, 19, 26]
    assert done == [0, 1, 2, 3, 4]


def _fails() -> None:
    raise CapturelintError("configuration 3 cannot run: its engine is broken")


def test_a_worker_error_is_raised_here():
    with pytest.raises(CapturelintError, match="configuration 3 cannot run"):
        parallel_map([lambda: 1, lambda: 2, _fails, lambda: 4], 2)


def test_several_torch_threads_run_here(monkeypatch):
    import os

    import torch

    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    pids = parallel_map([os.getpid, os.getpid], 2)
    assert pids == [os.getpid(), os.getpid()]  # no worker was forked


def test_jobs_run_in_worker_processes():
    import os

    pids = parallel_map([os.getpid] * 4, 2)
    assert os.getpid() not in pids and 1 <= len(set(pids)) <= 2
