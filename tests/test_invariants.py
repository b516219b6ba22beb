"""Declared region invariants: parsing and its one-line errors, where invariants come
from, the bundled engine's defaults, and ``check --static`` / ``capturelint invariants``."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from capturelint.report import finding_entries
from capturelint.cli import main
from capturelint.errors import CapturelintError
from capturelint.invariants import Requirement, in_force, read_invariants_file
from capturelint.settings import load_settings
from region_streams import invariant

ROOT = Path(__file__).resolve().parent.parent
MOE = ROOT / "tests" / "data" / "moe_invariant" / "pyproject.toml"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "pyproject.toml"
    p.write_text(text, encoding="utf-8")
    return p


@pytest.mark.parametrize("table, says", [
    ('[tool.capturelint.invariants.a]\nrequire = "eager"\nscope = "x"\ncolour = 1\n', "[tool.capturelint.invariants.a] has unknown key 'colour'"),
    ('[tool.capturelint.invariants.a]\nrequire = "eager"\nscope = "layers.[0"\n', "[tool.capturelint.invariants.a] scope has the pattern 'layers.[0', which has an unclosed '['"),
    ('[tool.capturelint.invariants.a]\nrequire = "eager"\nscope = "x"\nrunners = ["v3"]\n', "[tool.capturelint.invariants.a] runners has unknown entry 'v3'"),
    ('[tool.capturelint.invariants.a]\nrequire = "eager"\nscope = "x"\nmodes = ["PIECE"]\n', "[tool.capturelint.invariants.a] modes has unknown entry 'PIECE'"),
    ('[tool.capturelint.invariants.a]\nrequire = "sometimes"\nscope = "x"\n', '[tool.capturelint.invariants.a] require must be "eager" or "captured"'),
    ('[tool.capturelint.invariants.a]\nrequire = "eager"\n', "[tool.capturelint.invariants.a] selects no op"),
    ('[tool.capturelint.invariants.a]\nrequire = "eager"\nmax-eager-ops = 3\n', "needs exactly one of require"),
    ('[tool.capturelint.invariants.a]\nrequire = "eager"\nselect = [{scope = "x", colour = "y"}]\n', "select has unknown key 'colour'"),
    ('[tool.capturelint.invariants.A]\nrequire = "eager"\nscope = "x"\n', "has the invariant id 'A'"),
])
def test_bad_invariants_are_one_line_errors_naming_file_and_key(tmp_path, table, says):
    path = write(tmp_path, table)
    with pytest.raises(CapturelintError) as e:
        load_settings(path)
    message = str(e.value)
    assert says in message and "pyproject.toml: " in message and "\n" not in message


def test_bad_invariant_on_the_command_line_exits_2_with_one_line(tmp_path, capsys):
    path = write(tmp_path, '[tool.capturelint.invariants.a]\nrequire = "eager"\nscope = "x"\nrunners = ["v9"]\n')
    assert main(["check", "--static", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runners has unknown entry 'v9'" in err and "Traceback" not in err


def test_syntax_forms_and_where_each_comes_from(tmp_path):
    budget = invariant("b", per="model.layers.*", **{"max-eager-ops": 4})
    assert budget.requirement is Requirement.BUDGET and budget.selectors[0].scope == ("*",)
    two = invariant("two", require="eager", select=[{"scope": "a.*"}, {"scope": "b", "function": ["f", "g"]}])
    assert [s.describe() for s in two.selectors] == ["scope ~ a.*", "scope ~ b & function ~ f|g"]
    cli_file = tmp_path / "inv.toml"
    cli_file.write_text('[invariants.two]\nrequire = "captured"\nscope = "c"\n[invariants.b]\nenabled = false\n')
    layered = in_force([budget, two], read_invariants_file(str(cli_file)))
    assert [(i.id, i.requirement.value, i.source) for i in layered] == [("two", "captured", f"command line ({cli_file})")]


def test_the_bundled_defaults_are_the_examples_invariants():
    from capturelint.adapters.bundled.invariants import default_invariants
    from capturelint.invariants import parse_invariants

    doc = tomllib.loads((ROOT / "examples" / "invariants" / "pyproject.toml").read_text())
    example = parse_invariants("x", "y", doc["tool"]["capturelint"]["invariants"], "default")
    assert default_invariants() == example
    assert [i.id for i in example] == ["dsv4-v1-attention-prep-eager", "dsv4-sparse-attention-eager"]


def test_invariants_lists_sources_and_settings_override_defaults(tmp_path, capsys):
    path = write(tmp_path, '[tool.capturelint.invariants.dsv4-sparse-attention-eager]\nenabled = false\n'
                           '[tool.capturelint.invariants.moe]\nrequire = "captured"\nscope = "model.layers.*.ffn*"\n')
    assert main(["invariants", "--config", str(path), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["invariants"]
    assert [(r["id"], r["source"].split(" ")[0]) for r in rows] == [("dsv4-v1-attention-prep-eager", "default"), ("moe", "settings")]


# --------------------------------------------------- the bundled engine, static

@pytest.fixture
def _memo(cached_configurations):
    yield


def static(capsys, *args):
    code = main(["check", "--static", "--mode", "PIECEWISE", "--layers", "2", "--format", "json", *args])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def test_static_v1_narrow_names_the_attention_preparation_of_every_layer(_memo, capsys):
    code, doc, err = static(capsys, "--runner", "v1", "--eager-region", "narrow")
    assert code == 1 and doc["static"] is True
    assert {(f["code"], f["invariant"], f["scope"]) for f in finding_entries(doc)} == {
        ("CL201", "dsv4-v1-attention-prep-eager", "model.layers.0.attn"),
        ("CL201", "dsv4-v1-attention-prep-eager", "model.layers.1.attn")}
    assert all(f["capture_frame"]["file"].endswith("dsv4/attention.py") for f in doc["findings"])
    assert "replay equivalence was NOT checked" in doc["configurations"][0]["note"]
    assert "replay equivalence was NOT checked" in err


def test_static_per_runner_passes_and_says_what_it_did_not_check(_memo, capsys):
    code, doc, err = static(capsys, "--runner", "v1", "--eager-region", "per-runner")
    assert code == 0 and doc["findings"] == []
    assert {i["id"]: i["selected_ops"] > 0 for i in doc["invariants"]} == {
        "dsv4-sparse-attention-eager": True, "dsv4-v1-attention-prep-eager": True}
    assert "replay equivalence was NOT checked" in err and "replay matches eager" not in err


def test_an_invariant_that_selects_nothing_warns_and_strict_fails(_memo, tmp_path, capsys):
    path = write(tmp_path, '[tool.capturelint.invariants.typo]\nrequire = "eager"\nscope = "model.layer.*"\n')
    code, _, err = static(capsys, "--runner", "v2", "--eager-region", "narrow", "--config", str(path))
    assert code == 0 and "warning: invariant(s) typo applied to captured graphs but selected no op" in err
    assert main(["check", "--static", "--strict", "--mode", "PIECEWISE", "--layers", "2", "--runner", "v2",
                 "--eager-region", "narrow", "--config", str(path)]) == 2
    assert "--strict" in capsys.readouterr().err


def test_moe_captured_under_v2_passes_and_fails_when_the_moe_is_an_eager_break(_memo, capsys):
    code, doc, _ = static(capsys, "--runner", "v2", "--eager-region", "narrow", "--config", str(MOE))
    assert code == 0 and {i["id"]: i["selected_ops"] for i in doc["invariants"]}["moe-captured"] > 0
    target = f"{ROOT / 'tests' / 'moe_eager_engine.py'}:targets"
    assert main(["check", "--static", "--target", target, "--config", str(MOE), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert {(f["code"], f["invariant"], f["scope"]) for f in finding_entries(doc)} == {
        ("CL202", "moe-captured", "model.layers.0.ffn"), ("CL202", "moe-captured", "model.layers.1.ffn")}
    f = doc["findings"][0]
    assert f["op"].startswith("aten.") and f["capture_frame"]["file"].endswith("dsv4/moe.py")
    assert "MoE.forward" in f["segment"] and "the MoE is the bulk of every step" in f["message"]


def test_explain_shows_the_query_and_what_it_selects(_memo, capsys):
    assert main(["invariants", "--explain", "dsv4-v1-attention-prep-eager", "--runner", "v1", "--mode", "PIECEWISE",
                 "--layers", "2", "--eager-region", "narrow", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["query"].startswith("find_ops(G, scope ~ model.layers.*.attn.wq_b)")
    ops = doc["configurations"][0]["selections"][0]["ops"]
    assert {"scope": "model.layers.0.attn.wq_b", "op": "aten.mm.default", "placement": "captured", "count": 1} in ops
    assert main(["invariants", "--explain", "nope"]) == 2
