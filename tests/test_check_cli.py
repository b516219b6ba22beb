"""`capturelint check` on the bundled engine: the acceptance cases of the checker.

Each configuration runs once per test session (``cached_configurations`` memoizes the
bundled adapter); the determinism test runs its command twice for real.
"""

import json

import pytest

from capturelint.cli import main
from capturelint.report import finding_entries


@pytest.fixture(autouse=True)
def _memo(cached_configurations):
    yield


def run(capsys, *args):
    code = main(["check", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_v1_narrow_region_is_caught_as_baked_control_flow(capsys):
    # every mode, 8 of the default 24 steps (the suite's time); the default size's PIECEWISE is the tests' below
    code, out, _ = run(capsys, "--runner", "v1", "--eager-region", "narrow", "--steps", "8", "--format", "json")
    assert code == 1
    doc = json.loads(out)
    r1 = [f for f in doc["findings"] if f["condition"] == "R1"]
    assert r1, doc["findings"]
    f = r1[0]
    assert f["code"] == "CL101" and f["runner"] == "v1" and f["mode"] in ("PIECEWISE", "FULL_AND_PIECEWISE")
    assert ".attn" in f["scope"] and "layers." in f["scope"]
    assert "recorded another branch than the step runs" in f["message"]
    assert "forward context differed at capture: attn_metadata was None" in f["message"]
    assert f["capture_frame"]["file"].endswith("dsv4/attention.py")
    assert f["capture_frame"]["line"] != f["shadow_frame"]["line"]
    for key in ("segment", "op", "scope", "capture_frame", "shadow_frame", "message"):
        assert f[key]
    # every finding is R1 in a PIECEWISE graph; FULL graphs of the same run are clean
    assert {x["mode"] for x in finding_entries(doc)} == {"PIECEWISE", "FULL_AND_PIECEWISE"}
    numerical = {n["mode"]: n for n in doc["numerical"]}
    assert numerical["PIECEWISE"]["token_agreement"] < 0.5 and numerical["PIECEWISE"]["max_step_error"] > 1.0
    assert numerical["FULL"]["token_agreement"] == 1.0


def test_v1_narrow_rich_report_shows_the_finding_and_a_summary(capsys):
    code, out, _ = run(capsys, "--runner", "v1", "--eager-region", "narrow", "--mode", "PIECEWISE")
    assert code == 1
    # one line per problem, as ruff prints: the four layers' CL101 once
    (line,) = [t for t in out.splitlines() if ": CL101 " in t]
    # located at the branch condition (`if _is_profile_run(attn_metadata):`), not the op recorded inside it
    assert line.startswith("capturelint/engine/dsv4/attention.py:302: CL101 ")
    assert "[4 findings: model.layers.{0..3}.attn; mixed/32 in v1/PIECEWISE]" in line
    assert out.splitlines()[0].startswith("replay DIFFERS from eager execution in v1/PIECEWISE (token agreement ")
    lines = out.rstrip().splitlines()
    assert lines[-2].startswith("8 findings (CL101 x4, CL201 x4) in 1 configuration")
    assert lines[-1].startswith("hint: run `capturelint suggest --runner v1 --mode PIECEWISE --eager-region narrow`")
    # --verbose: the evidence, every finding with its segment, both sides' source lines and the graphs' segments
    code, out, _ = run(capsys, "--runner", "v1", "--eager-region", "narrow", "--mode", "PIECEWISE", "--verbose")
    assert code == 1
    assert "CL101 baked-control-flow [R1]" in out
    assert "capture: capturelint/engine/dsv4/attention.py:" in out
    assert "step:    capturelint/engine/dsv4/attention.py:" in out
    assert "runner v1 · mode PIECEWISE · eager region narrow" in out
    assert "C:" in out and "E _sparse_indexer_and_attn:" in out  # per-segment op counts
    lines = out.rstrip().splitlines()
    assert lines[-2].startswith("8 findings (CL101 x4, CL201 x4) in 1 configuration")
    # a failing report ends with the command that finds the fix, with the same options
    assert lines[-1].startswith("hint: run `capturelint suggest --runner v1 --mode PIECEWISE --eager-region narrow`")


@pytest.mark.parametrize("args", [["--runner", "v1"], ["--runner", "v2", "--eager-region", "narrow"]])
def test_the_fixes_pass_over_every_mode(capsys, args):
    code, out, _ = run(capsys, *args, "--steps", "8", "--format", "json")  # 8 of the default 24 steps: the suite's time
    doc = json.loads(out)
    assert code == 0, doc["findings"]
    assert doc["findings"] == []
    assert sorted(n["mode"] for n in doc["numerical"]) == ["FULL", "FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "PIECEWISE"]
    assert all(n["token_agreement"] == 1.0 and n["max_step_error"] < 1e-4 for n in doc["numerical"])


def test_fresh_metadata_under_full_graphs_names_the_moved_tensor(capsys):
    code, out, _ = run(capsys, "--runner", "v1", "--mode", "FULL", "--fresh-metadata", "--format", "json")
    assert code == 1
    doc = json.loads(out)
    r4 = [f for f in doc["findings"] if f["condition"] == "R4"]
    assert r4 and all(f["code"] == "CL104" for f in r4)
    names = {f["tensor"] for f in r4}
    assert "attn_metadata['layers.0.swa'].slot_mapping" in names
    assert all(n.startswith("attn_metadata[") for n in names)
    assert "re-allocated after capture" in r4[0]["message"]


def test_select_ignore_and_exit_zero(capsys):
    code, out, _ = run(capsys, "--runner", "v1", "--eager-region", "narrow", "--mode", "PIECEWISE", "--ignore", "CL101", "--format", "json")
    doc = json.loads(out)
    # with R1 ignored the divergence is unexplained: the coverage gap is reported, never swallowed
    # (CL201: the captured V1 attention preparation breaks the bundled engine's invariant)
    assert code == 1 and [f["code"] for f in doc["findings"] if f["code"] != "CL201"] == ["CL901"]
    code, _, _ = run(capsys, "--runner", "v1", "--eager-region", "narrow", "--mode", "PIECEWISE", "--exit-zero")
    assert code == 0


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--runner", "v3"], "unknown runner 'v3'"),
        (["--mode", "SOMETIMES"], "unknown CUDA-graph mode 'SOMETIMES'"),
        (["--layers", "0"], "--layers must be an integer from 1 to 256, got 0"),
        (["--steps", "-2"], "--steps must be an integer from 1 to 4096, got -2"),
        (["--steps", "1000000000"], "--steps must be an integer from 1 to 4096, got 1000000000"),
        (["--seed", "18446744073709551616"], "--seed must be an integer from 0 to 18446744073709551615 (64 bits)"),
        (["--mode", ""], "Invalid value for '--mode': '' names nothing"),
        (["--select", ""], "Invalid value for '--select': '' names nothing"),
        (["--mode", "NONE"], "mode NONE captures no CUDA graph, so there is no replay to compare"),
        (["--max-eager-growth", "nan"], "--max-eager-growth must be a percentage (a number >= 0), got nan"),
        (["--select", "CL999"], "--select has 'CL999', which matches no rule code"),
        (["--eager-region", "medium"], "unknown eager region 'medium'"),
        (["--format", "xml"], "Invalid value for '--format'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, needle):
    code, out, err = run(capsys, *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err
    assert err.startswith("capturelint: error: ")


def test_json_is_byte_identical_across_runs(capsys, real_configurations):
    args = ["--runner", "v1", "--eager-region", "narrow", "--mode", "PIECEWISE", "--layers", "2", "--steps", "6", "--format", "json"]
    first = run(capsys, *args)
    second = run(capsys, *args)
    assert first[0] == second[0] == 1
    assert first[1] == second[1]


def test_rules_command_lists_every_rule_and_prints_docs(capsys):
    assert main(["rules", "--format", "markdown"]) == 0
    table = capsys.readouterr().out
    for code in ("CL101", "CL102", "CL103", "CL104", "CL105", "CL106", "CL107", "CL901"):
        assert f"| {code} |" in table
    assert main(["rules", "CL104", "--format", "markdown"]) == 0
    doc = capsys.readouterr().out
    for section in ("## What it does", "## Why is this bad?", "## Example", "## Use instead", "## Limitations"):
        assert section in doc
    assert main(["rules", "CL000"]) == 2


def test_readme_rule_table_is_the_generated_one():
    from pathlib import Path

    from capturelint.commands.rules import rules_table_markdown

    page = (Path(__file__).resolve().parent.parent / "docs" / "rules.md").read_text()
    assert rules_table_markdown() in page, "regenerate the table in docs/rules.md with: capturelint rules --format markdown"


def test_sarif_report_of_a_real_check_validates_against_the_schema(capsys, tmp_path):
    from pathlib import Path

    import jsonschema

    out = tmp_path / "report.sarif"
    code, _, err = run(capsys, "--runner", "v1", "--eager-region", "narrow", "--mode", "PIECEWISE", "--format", "sarif", "-o", str(out))
    assert code == 1 and "findings (CL101" in err
    log = json.loads(out.read_text())
    schema = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())
    jsonschema.Draft4Validator(schema).validate(log)
    results = log["runs"][0]["results"]
    assert {r["ruleId"] for r in results} == {"CL101", "CL201"}
    assert {r["properties"].get("invariant") for r in results if r["ruleId"] == "CL201"} == {"dsv4-v1-attention-prep-eager"}
    location = results[0]["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == "capturelint/engine/dsv4/attention.py"
    assert location["region"]["startLine"] > 0


def test_github_annotations_point_at_the_engine_line(capsys):
    code, out, _ = run(capsys, "--runner", "v1", "--eager-region", "narrow", "--mode", "PIECEWISE", "--format", "github")
    assert code == 1
    lines = out.splitlines()
    # one annotation per problem: the four layers' findings of each cause once, saying where else it was seen
    assert len(lines) == 2 and all(line.startswith("::error file=capturelint/engine/dsv4/attention.py,line=") for line in lines)
    assert sum("title=CL101 baked-control-flow::" in line for line in lines) == 1
    assert sum("title=CL201 declared-eager-captured::invariant dsv4-v1-attention-prep-eager" in line for line in lines) == 1
    assert all(line.endswith("%0A%0ASame cause in 4 findings: model.layers.{0..3}.attn; mixed/32 in v1/PIECEWISE")
               for line in lines)
