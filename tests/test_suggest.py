"""`capturelint suggest`: regions found by experiment, verified by the full check.

Small engines only: the two-branch target (`tests/suggest_engines.py`), the stale-input
toy, and the bundled engine with 1 layer, 6 steps, PIECEWISE.
"""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from capturelint.cli import main

HERE = Path(__file__).resolve().parent
TWO = "tests/suggest_engines.py:targets"


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_two_independent_branches_get_a_two_break_region_that_fixes_both(capsys):
    code, out, err = run(capsys, "suggest", "--target", TWO, "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["failing"] == ["two/PIECEWISE"]
    top = doc["suggestions"][0]
    assert [r["function"] for r in top["region"]] == ["TwoBranches.first", "TwoBranches.second"]
    assert top["breaks_added"] == 2
    assert top["findings_fixed"] == top["findings_before"] == 1 and top["uncovered_findings_fixed"] == 1
    assert top["verification"][0]["clean"] and top["verification"][0]["replay_steps"] == 3
    assert top["region"][0]["file"] == "tests/suggest_engines.py" and top["region"][0]["line"] == 42
    # the enclosing function is clean too, but costs more eager ops per step
    block = next(s for s in doc["suggestions"] if [r["function"] for r in s["region"]] == ["TwoBranches.block"])
    assert block["eager_ops_per_step"] > top["eager_ops_per_step"]
    # one branch alone leaves the other
    alone = next(t for t in doc["unsuccessful"] if [r["function"] for r in t["region"]] == ["TwoBranches.first"])
    assert any("CL101" in f for f in alone["checked"][0]["findings"])
    # the same command gives the same bytes
    assert run(capsys, "suggest", "--target", TWO, "--format", "json")[1] == out


def test_the_patch_applies_to_a_copy_and_the_patched_copy_checks_clean(capsys, tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    code, patch, err = run(capsys, "suggest", "--target", TWO, "--format", "patch")
    assert code == 0, err
    assert patch.startswith("--- a/tests/suggest_engines.py\n+++ b/tests/suggest_engines.py\n")
    assert patch.count("+    @eager_break_during_capture\n") == 2
    (tmp_path / "tests").mkdir()
    shutil.copy(HERE / "suggest_engines.py", tmp_path / "tests" / "suggest_engines.py")
    (tmp_path / "fix.patch").write_text(patch)
    done = subprocess.run(["git", "apply", "fix.patch"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    # the original fails, the patched copy passes
    assert run(capsys, "check", "--target", TWO)[0] == 1
    code, out, err = run(capsys, "check", "--target", f"{tmp_path}/tests/suggest_engines.py:targets", "--format", "json")
    assert code == 0, out
    assert json.loads(out)["numerical"][0]["replay_steps"] == 3


def test_no_candidate_is_said_and_exits_1(capsys):
    # a metadata tensor re-allocated every step, read in the captured callable itself:
    # no function on its stack can be made a break that fixes it
    code, out, err = run(capsys, "suggest", "--target", str(HERE / "toy_engine.py") + ":stale_targets")
    assert code == 1
    assert "no candidate makes toy/PIECEWISE" in out.splitlines()[-1] or "no candidate makes toy/PIECEWISE" in out


@pytest.mark.parametrize("args", [["--max-candidates", "0"], ["--format", "sarif"], ["--mode", "NONE"]])
def test_bad_input_is_one_line_and_exit_2(capsys, args):
    code, out, err = run(capsys, "suggest", *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("capturelint: error:")


def test_eager_breaks_wrap_the_class_attribute_and_restore_it(monkeypatch):
    # loaded from its file (a --target run may have put a patched copy first on sys.path),
    # under a name of its own, beside the copies --target imports: each copy is wrapped
    import importlib.util
    import sys

    from capturelint.adapters.common import runtime_break
    from capturelint.suggest import FunctionRef, eager_breaks

    spec = importlib.util.spec_from_file_location("suggest_engines_wrapped", HERE / "suggest_engines.py")
    engines = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "suggest_engines_wrapped", engines)
    spec.loader.exec_module(engines)

    original = engines.TwoBranches.__dict__["first"]
    code = original.__code__
    ref = FunctionRef("tests/suggest_engines.py", 42, "TwoBranches.first", engines.__name__, code.co_filename,
                      code.co_firstlineno)
    with eager_breaks([ref], runtime_break()):
        assert engines.TwoBranches.first.__capturelint_break__ == "TwoBranches.first"
        assert engines.TwoBranches.first.__wrapped__ is original
    assert engines.TwoBranches.__dict__["first"] is original


def test_bundled_v1_narrow_gets_a_verified_region_no_wider_than_wide(capsys):
    # one layer (the sliding-window one, whose KV insert V1's narrow region bakes), 6 steps
    opts = ["--runner", "v1", "--layers", "1", "--steps", "6", "--mode", "PIECEWISE"]
    code, out, err = run(capsys, "suggest", *opts, "--eager-region", "narrow", "--format", "json")
    assert code == 0, err
    doc = json.loads(out)
    top = doc["suggestions"][0]
    assert [r["function"] for r in top["region"]] == ["DeepseekV4Attention._prepare_and_attn"]
    assert top["findings_fixed"] == top["findings_before"] > 0
    # safe under v2 as well, which is clean with the current region: no per-runner split needed
    assert top["runners"]["v2"] == {"modes": {"PIECEWISE": "clean"}, "needs_fix": False, "safe": True}
    assert top["per_runner"]["needed"] is False and top["per_runner"]["use"] == {"v1": "suggested", "v2": "current"}
    # the cross-checks of the verified regions under v2 in two worker processes: the same bytes
    assert len(doc["suggestions"]) > 1 and all(s["cross_check"] for s in doc["suggestions"])
    code, parallel, err = run(capsys, "suggest", *opts, "--eager-region", "narrow", "--format", "json", "--jobs", "2")
    assert code == 0, err
    assert parallel == out
    # the narrow region with the top suggestion applied checks clean, every replay step checked
    from capturelint.adapters.common import runtime_break
    from capturelint.suggest import FunctionRef, eager_breaks
    import capturelint.engine.dsv4.attention as attention

    code_obj = attention.DeepseekV4Attention._prepare_and_attn.__code__
    ref = FunctionRef(top["region"][0]["file"], top["region"][0]["line"], "DeepseekV4Attention._prepare_and_attn",
                      attention.__name__, code_obj.co_filename, code_obj.co_firstlineno)
    with eager_breaks([ref], runtime_break()):
        code, out, _ = run(capsys, "check", *opts, "--eager-region", "narrow", "--format", "json")
    assert code == 0
    checked = json.loads(out)
    assert checked["numerical"][0]["replay_steps"] == 5 and checked["summary"]["findings"] == 0
    # no more eager ops per step than the wide region
    code, out, _ = run(capsys, "check", *opts, "--eager-region", "wide", "--format", "json")
    graphs = json.loads(out)["configurations"][0]["graphs"]
    assert top["eager_ops_per_step"] <= sum(g["eager_ops"] for g in graphs) / len(graphs)


def test_the_help_states_the_default_budget():
    from capturelint.commands.suggest import DEFAULT_MAX_CANDIDATES
    from capturelint import suggest

    assert DEFAULT_MAX_CANDIDATES == suggest.DEFAULT_MAX_CANDIDATES


def test_a_copy_of_an_engine_is_named_by_its_own_file(tmp_path, capsys):
    # Code objects compare equal across files: frames of a copy of suggest_engines.py, run
    # after the original, must name the copy (else suggest wraps the original, and fails)
    assert run(capsys, "check", "--target", TWO)[0] == 1
    (tmp_path / "copy").mkdir()
    shutil.copy(HERE / "suggest_engines.py", tmp_path / "copy" / "other_engines.py")
    code, out, err = run(capsys, "suggest", "--target", f"{tmp_path}/copy/other_engines.py:targets", "--format", "json")
    assert code == 0, err
    top = json.loads(out)["suggestions"][0]
    assert [(r["function"], r["module"]) for r in top["region"]] == [
        ("TwoBranches.first", "capturelint_target_other_engines"), ("TwoBranches.second", "capturelint_target_other_engines")]
