"""`capturelint check --target`: the checker on an engine it does not ship."""

import json

import pytest

from capturelint.report import finding_entries
from capturelint.cli import main


def check(capsys, *args):
    code = main(["check", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_users_engine_with_a_stale_metadata_tensor_fails(capsys):
    code, out, _ = check(capsys, "--target", "tests/toy_engine.py:stale_targets", "--format", "json")
    doc = json.loads(out)
    assert code == 1
    assert [(f["code"], f["mode"], f["tensor"]) for f in finding_entries(doc)] == [
        ("CL104", "FULL", "attn_metadata['bias']"),
        ("CL104", "PIECEWISE", "attn_metadata['bias']"),
    ]
    assert all(n["token_agreement"] is None and float(n["max_step_error"]) > 0.1 for n in doc["numerical"])


def test_the_fixed_engine_passes(capsys):
    code, out, err = check(capsys, "--target", "tests/toy_engine.py:fixed_targets")
    assert code == 0, out
    assert "no eager twin" in out and "no findings in 2 configurations" in out


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("tests/toy_engine.py", "is not MODULE:FUNCTION"),
        ("tests/missing.py:targets", "no file tests/missing.py"),
        ("tests/toy_engine.py:nothing_here", "has no function 'nothing_here'"),
        ("tests/toy_engine.py:check_toy", "check_toy() raised TypeError"),
        ("tests/toy_engine.py:Toy", "Toy() raised TypeError"),
        ("no_such_module_xyz:targets", "cannot import module no_such_module_xyz"),
    ],
)
def test_bad_targets_are_one_line_errors(capsys, spec, needle):
    code, out, err = check(capsys, "--target", spec)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


def test_an_engine_that_raises_during_capture_is_a_one_line_error(capsys):
    code, out, err = check(capsys, "--target", "tests/toy_engine.py:broken_targets")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "the engine raised RuntimeError under runner toy, mode PIECEWISE" in err
    assert "tests/toy_engine.py:" in err and "cache not allocated" in err
