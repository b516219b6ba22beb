"""The region gate: ``capturelint snapshot`` and ``capturelint check --baseline``.

One baseline of the per-runner eager regions (V1 wide, V2 narrow), PIECEWISE, 2 layers,
4 steps; then the changes the gate must catch and the update that accepts them.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from capturelint.cli import main
from capturelint.errors import CapturelintError
from capturelint.snapshot import FORMAT_MARKER, SNAPSHOT_VERSION, load_snapshot

SMALL = ["--mode", "PIECEWISE", "--layers", "2", "--steps", "4"]


def run(args, capsys) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("gate") / "baseline.json"
    assert main(["snapshot", "--runner", "all", *SMALL, "-o", str(path)]) == 0
    return str(path)


def test_snapshot_file_is_stable_and_complete(baseline):
    text = open(baseline).read()
    doc = json.loads(text)
    assert doc["format"] == FORMAT_MARKER and doc["version"] == SNAPSHOT_VERSION
    assert [(c["runner"], c["mode"], c["eager_region"]) for c in doc["configurations"]] == [
        ("v1", "PIECEWISE", "wide"), ("v2", "PIECEWISE", "narrow")]
    assert doc["engine"] == {"copy_break_outputs": True, "fresh_metadata": False, "kernels": "torch", "layers": 2, "seed": 0, "steps": 4}
    seg = doc["configurations"][0]["graphs"][0]["segments"][1]
    assert seg["kind"] == "eager" and seg["break"] == "DeepseekV4Attention._prepare_and_attn_eager"
    assert "aten.constant_pad_nd.default" in seg["ops"]["model.layers.0.attn"]
    assert text == json.dumps(doc, indent=2, sort_keys=True) + "\n"
    assert load_snapshot(baseline).dumps() == text  # the round trip is exact
    assert not re.search(r"0x[0-9a-f]{4,}|\d{4}-\d\d-\d\dT|timestamp", text)  # no addresses, no times


def test_unchanged_regions_pass(baseline, memo_runs, capsys):
    rc, out, err = run(["check", "--runner", "all", *SMALL, "--baseline", baseline, "--format", "json"], capsys)
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["findings"] == []
    changes = doc["region_changes"]
    assert changes["failed"] is False
    assert [c["moved"] for c in changes["configurations"]] == [[], []]
    assert "regions unchanged in 2 configurations" in err


def test_narrow_v1_fails_with_cl101_and_region_changes(baseline, memo_runs, capsys):
    args = ["check", "--runner", "v1", "--eager-region", "narrow", *SMALL, "--baseline", baseline]
    rc, out, err = run([*args, "--format", "json"], capsys)
    assert rc == 1
    doc = json.loads(out)
    assert "CL101" in {f["code"] for f in doc["findings"]}
    changes = doc["region_changes"]
    [c] = changes["configurations"]
    assert c["before"] == c["after"] == "v1/PIECEWISE"
    assert c["eager_region"] == {"before": "wide", "after": "narrow"}
    moved = {(m["scope"], m["op"]): m["direction"] for m in c["moved"]}
    assert moved[("model.layers.0.attn", "aten.constant_pad_nd.default")] == "to captured"
    assert moved[("model.layers.1.attn.indexer.wq_b", "aten.mm.default")] == "to captured"
    assert c["eager_ops_per_step"]["after"] < c["eager_ops_per_step"]["before"]
    assert changes["failed"] is False  # fewer eager ops: the finding fails the check, not the growth
    assert changes["missing_configurations"] == ["v2/PIECEWISE"]
    rc, out, _ = run(args, capsys)  # the Rich report carries the region-change panel
    assert rc == 1
    assert "region changes" in out and "v1/PIECEWISE (eager region wide -> narrow)" in out
    assert "moved to captured" in out and "CL101" in out


def test_widening_v2_beyond_the_budget_fails(baseline, memo_runs, capsys):
    args = ["check", "--runner", "v2", "--eager-region", "wide", *SMALL, "--baseline", baseline, "--max-eager-growth", "5"]
    rc, out, err = run([*args, "--format", "json"], capsys)
    assert rc == 1
    doc = json.loads(out)
    assert doc["findings"] == []
    [c] = doc["region_changes"]["configurations"]
    assert c["over_budget"] is True and c["growth_pct"] > 5
    assert {m["direction"] for m in c["moved"]} == {"to eager"}
    assert doc["region_changes"]["failed"] is True
    assert "eager growth over the 5% budget in v2/PIECEWISE" in err


def test_update_accepts_the_change(baseline, memo_runs, tmp_path, capsys):
    path = tmp_path / "baseline.json"
    shutil.copy(baseline, path)
    engine = ["--runner", "v2", "--eager-region", "wide", *SMALL]
    rc, out, err = run(["snapshot", *engine, "--update", str(path)], capsys)
    assert rc == 0
    assert "moved to eager" in out
    assert err.startswith(f"updated {path}: regions changed in 1 of 2 configurations")
    assert "kept from the old file (not run this time): v1/PIECEWISE" in err
    updated = load_snapshot(path)
    assert [(c.runner, c.eager_region) for c in updated.configs] == [("v1", "wide"), ("v2", "wide")]
    rc, out, err = run(["check", *engine, "--baseline", str(path), "--max-eager-growth", "5"], capsys)
    assert rc == 0, out


def test_new_configurations_are_listed_not_failed(baseline, memo_runs, capsys):
    rc, out, err = run(["check", "--runner", "v2", "--mode", "FULL", "--layers", "2", "--steps", "4",
                        "--baseline", baseline, "--format", "json"], capsys)
    assert rc == 0, err
    changes = json.loads(out)["region_changes"]
    assert changes["new_configurations"] == ["v2/FULL"] and changes["failed"] is False


def _corrupt(baseline: str, edit) -> str:
    doc = json.loads(open(baseline).read())
    edit(doc)
    return json.dumps(doc)


BAD = {
    "truncated": lambda b: open(b).read()[:200],
    "empty": lambda b: "",
    "malformed": lambda b: "{'format': 1}",
    "not-an-object": lambda b: "[1, 2]",
    "wrong-marker": lambda b: _corrupt(b, lambda d: d.update(format="other-tool")),
    "wrong-version": lambda b: _corrupt(b, lambda d: d.update(version=99)),
    "missing-field": lambda b: _corrupt(b, lambda d: d["configurations"][0]["graphs"][0].pop("segments")),
    "ill-typed": lambda b: _corrupt(b, lambda d: d["configurations"][1].update(graphs={"a": 1})),
    "bad-count": lambda b: _corrupt(b, lambda d: d["configurations"][0]["graphs"][0]["segments"][0]["ops"]["model.embed"].update(
        {"aten.embedding.default": "1"})),
    "inconsistent": lambda b: _corrupt(b, lambda d: d["configurations"][0]["graphs"][0].update(eager_ops=0)),
    "nan": lambda b: open(b).read().replace('"eager_ops_per_step": 4.0', '"eager_ops_per_step": NaN'),
}

EXPECTED = {
    "truncated": "is truncated",
    "empty": "is empty",
    "malformed": "is not valid JSON",
    "not-an-object": "is not a capturelint snapshot",
    "wrong-marker": "is not a capturelint snapshot (it has format 'other-tool'",
    "wrong-version": "has version 99; this capturelint reads version 1",
    "missing-field": "field configurations[0].graphs[0].segments is missing",
    "ill-typed": "field configurations[1].graphs must be a list, got an object",
    "bad-count": "must be an integer, got the string '1'",
    "inconsistent": "field configurations[0].graphs[0].eager_ops says 0 but its segments hold",
    "nan": "is not valid JSON",
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_baseline_is_one_line_and_exit_2(case, baseline, tmp_path, capsys):
    path = tmp_path / f"{case}.json"
    path.write_text(BAD[case](baseline))
    rc, out, err = run(["check", "--runner", "v1", *SMALL, "--baseline", str(path)], capsys)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"capturelint: error: snapshot {path}")
    assert EXPECTED[case] in err
    assert f"regenerate it with `capturelint snapshot -o {path}`" in err
    with pytest.raises(CapturelintError):
        load_snapshot(path)


def test_missing_baseline(tmp_path, capsys):
    rc, out, err = run(["check", "--baseline", str(tmp_path / "nope.json")], capsys)
    assert rc == 2 and err == f"capturelint: error: snapshot {tmp_path / 'nope.json'} does not exist; create it with `capturelint snapshot -o {tmp_path / 'nope.json'}`\n"


def test_update_replaces_an_unreadable_snapshot(baseline, memo_runs, tmp_path, capsys):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"format": FORMAT_MARKER, "version": 0, "configurations": "?"}))
    rc, out, err = run(["snapshot", "--runner", "v2", *SMALL, "--update", str(path)], capsys)
    assert rc == 0
    assert err.startswith(f"replaced {path}, which could not be read (has version 0")
    assert [c.label for c in load_snapshot(path).configs] == ["v2/PIECEWISE"]


def test_update_refuses_a_file_that_is_not_a_snapshot(tmp_path, capsys):
    path = tmp_path / "broken.json"
    path.write_text("{")  # a truncated file has lost its format marker: nothing says it is ours
    rc, out, err = run(["snapshot", "--runner", "v2", *SMALL, "--update", str(path)], capsys)
    assert rc == 2 and out == "" and path.read_text() == "{"
    assert err.startswith(f"capturelint: error: refusing to replace {path}: it is not a capturelint snapshot")
