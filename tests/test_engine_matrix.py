"""The engine's acceptance test: the outcome matrix of engine.md, through the CLI.

Each case runs a configuration and its eager twin (``capturelint engine run --json``)
with the default 4-layer model and workload, and checks the verdict: "equal" means the
same greedy tokens everywhere and per-step logits within float noise; "wrong" means the
tokens diverge within a few steps and the logits by whole units.
"""

from __future__ import annotations

import json

import pytest

from capturelint.cli import main
from capturelint.engine.runner import ModelRunnerV1


def run_engine(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert main(["engine", "run", *args, "--json"]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    return json.loads(lines[0])


def assert_equal(report: dict) -> None:
    assert report["token_agreement"] == 1.0, report
    assert report["max_logit_error"] < 1e-4, report
    assert report["first_divergent_step"] is None
    assert report["matches_eager"] is True


def assert_wrong(report: dict) -> None:
    assert report["token_agreement"] < 0.5, report
    assert report["max_logit_error"] > 1.0, report
    assert report["first_divergent_step"] is not None and report["first_divergent_step"] <= 3, report
    assert report["matches_eager"] is False


EQUAL_CASES = [
    ("v1", "PIECEWISE", "wide"),
    ("v1", "PIECEWISE", "per-runner"),
    ("v2", "PIECEWISE", "narrow"),
    ("v2", "PIECEWISE", "per-runner"),
    ("v1", "FULL", "narrow"),
    ("v1", "FULL", "wide"),
    ("v2", "FULL", "narrow"),
    ("v2", "FULL", "wide"),
    ("v1", "FULL_DECODE_ONLY", "narrow"),
    ("v1", "FULL_DECODE_ONLY", "wide"),
    ("v2", "FULL_DECODE_ONLY", "narrow"),
    ("v2", "FULL_DECODE_ONLY", "wide"),
]


# The equal cases run on a small engine by default (2 layers, a sliding-window and an
# indexer layer; 8 steps: one uniform decode batch, which FULL_DECODE_ONLY replays); at
# the default size (4 layers, 24 steps) they are the opt-in slow job (-m slow).
SIZES = [
    pytest.param((("--layers", "2", "--steps", "8"), 1), id="small"),
    pytest.param(((), 16), id="default-size", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("runner,mode,region", EQUAL_CASES)
def test_replay_equals_eager(capsys, runner, mode, region, size):
    flags, decode_steps = size
    report = run_engine(capsys, "--runner", runner, "--mode", mode, "--eager-region", region, *flags)
    assert_equal(report)
    assert report["config"]["runner"] == runner
    assert report["replayed_steps"] > 0
    assert report["decode_steps"] >= decode_steps


def test_v1_piecewise_narrow_is_wrong(capsys):
    report = run_engine(capsys, "--runner", "v1", "--mode", "PIECEWISE", "--eager-region", "narrow")
    assert_wrong(report)
    assert report["graphs"] == 6 and report["eager_breaks"] == 6 * 4


def test_v1_full_fresh_metadata_is_wrong(capsys):
    report = run_engine(capsys, "--runner", "v1", "--mode", "FULL", "--eager-region", "narrow", "--fresh-metadata")
    assert report["token_agreement"] < 0.5, report
    assert report["max_logit_error"] > 1.0, report
    assert report["eager_breaks"] == 0


def test_v1_narrow_is_right_once_piecewise_capture_builds_metadata(capsys, monkeypatch):
    """Pins the mechanism: the V1 + narrow failure is the metadata-less PIECEWISE capture.
    Give that capture metadata (persistent buffers, as FULL capture has) and the same
    configuration replays correctly."""
    monkeypatch.setattr(ModelRunnerV1, "piecewise_capture_builds_metadata", True)
    report = run_engine(capsys, "--runner", "v1", "--mode", "PIECEWISE", "--eager-region", "narrow")
    assert_equal(report)


def test_v1_default_mode_is_wrong_with_narrow_region(capsys):
    """vLLM's default mode (FULL_AND_PIECEWISE) runs mixed batches in PIECEWISE graphs,
    so V1 + narrow goes wrong there too."""
    report = run_engine(capsys, "--runner", "v1", "--eager-region", "narrow")
    assert report["config"]["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert report["token_agreement"] < 1.0 and report["max_logit_error"] > 1.0


def test_json_is_byte_deterministic(capsys):
    args = ("--runner", "v2", "--mode", "PIECEWISE", "--steps", "6", "--seed", "3")
    capsys.readouterr()
    main(["engine", "run", *args, "--json"])
    first = capsys.readouterr().out
    main(["engine", "run", *args, "--json"])
    assert capsys.readouterr().out == first
    report = json.loads(first)
    assert list(report) == sorted(report)
    for key in ("token_agreement", "max_logit_error", "graphs", "eager_breaks", "config"):
        assert key in report


def test_table_output(capsys):
    capsys.readouterr()
    assert main(["engine", "run", "--runner", "v1", "--mode", "FULL_DECODE_ONLY", "--steps", "4"]) == 0
    out = capsys.readouterr().out
    assert "token agreement" in out and "graphs captured" in out
    assert out.strip().splitlines()[-1] == "replay equals eager"
