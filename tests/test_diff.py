"""``capturelint diff``: two region recordings compared (two plans, or snapshot files)."""

from __future__ import annotations

import json

import pytest

from capturelint.cli import main
from capturelint.runtime.breakable import SegmentKind
from capturelint.options import BreakOutputs
from capturelint.region_changes import compare_maps
from capturelint.snapshot import ConfigMap, EngineParams, GraphMap, RegionMap, SegmentMap

ENGINE = ["--runner", "v1", "--mode", "PIECEWISE", "--layers", "2", "--steps", "4"]
PARAMS = EngineParams(2, 4, 0, "torch", False, BreakOutputs.COPY)


def run(args, capsys) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_narrow_against_wide_moves_the_attention_preparation_to_eager(capsys):
    rc, out, err = run(["diff", *ENGINE, "--eager-region", "narrow", "--against-eager-region", "wide", "--format", "json"], capsys)
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["before"] == "--runner v1 --eager-region narrow --mode PIECEWISE"
    assert doc["after"] == "--runner v1 --eager-region wide --mode PIECEWISE"
    [change] = doc["region_changes"]["configurations"]
    assert change["eager_region"] == {"before": "narrow", "after": "wide"}
    moved = {(m["scope"], m["op"]): m for m in change["moved"]}
    # the profile-run pad of the fused q-norm/RoPE/KV insert, q's projection and the
    # indexer's q path, in every layer and every one of the 6 graphs
    for key in [
        ("model.layers.0.attn", "aten.constant_pad_nd.default"),
        ("model.layers.1.attn", "aten.constant_pad_nd.default"),
        ("model.layers.0.attn.wq_b", "aten.mm.default"),
        ("model.layers.1.attn.indexer.wq_b", "aten.mm.default"),
    ]:
        assert moved[key]["direction"] == "to eager"
        assert moved[key]["count"] == 6 and moved[key]["graphs"] == 6
    assert all(m["direction"] == "to eager" for m in change["moved"])
    assert change["segments_added"] == [
        {"break": "DeepseekV4Attention._prepare_and_attn_eager", "count": 12, "graphs": 6, "kind": "eager"}]
    assert change["segments_removed"] == [
        {"break": "DeepseekV4Attention._sparse_indexer_and_attn", "count": 12, "graphs": 6, "kind": "eager"}]
    ops = change["eager_ops_per_step"]
    assert ops["after"] > ops["before"] > 0
    assert change["growth_pct"] == round((ops["after"] - ops["before"]) * 100 / ops["before"], 2)
    assert doc["region_changes"]["failed"] is False  # diff reports, it does not gate
    assert err.count("\n") == 1 and "ops moved to eager" in err


def gm(graph: str, *segments: tuple) -> GraphMap:
    segs = []
    for kind, name, ops in segments:
        segs.append(SegmentMap(SegmentKind(kind), name, tuple((s, tuple(sorted(by.items()))) for s, by in sorted(ops.items()))))
    return GraphMap(graph, "PIECEWISE", tuple(segs))


NARROW = gm("decode/4",
            ("captured", None, {"attn": {"aten.mm.default": 2, "aten.pad.default": 1}}),
            ("eager", "Attn.sparse", {"attn": {"aten.zero_.default": 1}}),
            ("captured", None, {"ffn": {"aten.mm.default": 3}}))
WIDE = gm("decode/4",
          ("captured", None, {"attn": {"aten.mm.default": 1}}),
          ("eager", "Attn.prepare", {"attn": {"aten.mm.default": 1, "aten.pad.default": 1, "aten.zero_.default": 1}}),
          ("captured", None, {"ffn": {"aten.mm.default": 3}}))


def write(tmp_path, name: str, *configs: ConfigMap) -> str:
    path = tmp_path / name
    path.write_text(RegionMap(PARAMS, configs).dumps())
    return str(path)


def test_two_snapshot_files(tmp_path, capsys):
    old = write(tmp_path, "old.json", ConfigMap("v1", "PIECEWISE", "narrow", (NARROW,)))
    new = write(tmp_path, "new.json", ConfigMap("v1", "PIECEWISE", "wide", (WIDE,)), ConfigMap("v2", "FULL", "narrow", ()))
    rc, out, _ = run(["diff", old, new, "--format", "json"], capsys)
    assert rc == 0
    doc = json.loads(out)["region_changes"]
    [c] = doc["configurations"]
    assert c["moved"] == [
        {"scope": "attn", "op": "aten.mm.default", "direction": "to eager", "count": 1, "graphs": 1},
        {"scope": "attn", "op": "aten.pad.default", "direction": "to eager", "count": 1, "graphs": 1},
    ]
    assert c["eager_ops_per_step"] == {"before": 1.0, "after": 3.0} and c["growth_pct"] == 200.0
    assert doc["new_configurations"] == ["v2/FULL"]
    rc, out, _ = run(["diff", old, new], capsys)
    assert rc == 0
    assert "v1/PIECEWISE (eager region narrow -> wide): eager ops per step 1 -> 3 (+200.0%)" in out
    assert "moved to eager: 2 ops" in out
    assert "attn: 2 ops in 1 graph (aten.mm.default ×1, aten.pad.default ×1)" in out
    assert "eager break Attn.prepare ×1 in 1 graph" in out
    rc, out, _ = run(["diff", old, new, "--format", "dot"], capsys)
    assert rc == 0 and out.startswith("digraph capturelint_diff {")
    assert "aten.pad ×1 moved to eager" in out and "before: v1/PIECEWISE" in out and "after: v1/PIECEWISE" in out


def test_moved_lists_are_cut_at_five_in_rich(tmp_path, capsys):
    many_c = gm("decode/4", ("captured", None, {f"s{i}": {"aten.mm.default": 1} for i in range(8)}))
    many_e = gm("decode/4", ("eager", "B.f", {f"s{i}": {"aten.mm.default": 1} for i in range(8)}))
    old = write(tmp_path, "a.json", ConfigMap("v1", "PIECEWISE", "narrow", (many_c,)))
    new = write(tmp_path, "b.json", ConfigMap("v1", "PIECEWISE", "wide", (many_e,)))
    rc, out, _ = run(["diff", old, new], capsys)
    assert "s4: 1 op in 1 graph (aten.mm.default ×1)" in out and "s5" not in out
    assert "... and 3 more" in out


def test_compare_maps_directions_and_unbounded_growth():
    full = gm("decode/4", ("captured", None, {"attn": {"aten.mm.default": 3}}))
    ch = compare_maps(RegionMap(PARAMS, (ConfigMap("v1", "FULL", "wide", (full,)),)),
                      RegionMap(PARAMS, (ConfigMap("v1", "FULL", "wide", (NARROW,)),)), max_growth_pct=50)
    [c] = ch.configs
    assert c.growth_pct is None and c.over_budget and ch.failed  # 0 -> 1 eager op: unbounded
    assert c.to_json()["growth_pct"] is None
    back = compare_maps(RegionMap(PARAMS, (ConfigMap("v1", "P", "wide", (WIDE,)),)),
                        RegionMap(PARAMS, (ConfigMap("v1", "P", "narrow", (NARROW,)),)))
    assert {(m.scope, m.op, str(m.direction)) for m in back.configs[0].moved} == {
        ("attn", "aten.mm.default", "to captured"), ("attn", "aten.pad.default", "to captured")}
    assert not back.failed  # no budget: a diff never fails


@pytest.mark.parametrize("args, message", [
    (["diff"], "nothing to compare"),
    (["diff", "a.json", "b.json", "c.json"], "at most two snapshot files"),
    (["diff", "a.json", "--against-runner", "v2"], "do not apply to snapshot files"),
    (["diff", "--runner", "all", "--against-runner", "v1", "--mode", "FULL"], "cannot be paired"),
    (["diff", "missing.json", "other.json"], "snapshot missing.json does not exist"),
])
def test_usage_errors_are_one_line(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(args, capsys)
    assert rc == 2 and out == ""
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


needs_dot = pytest.mark.skipif(__import__("shutil").which("dot") is None,
                               reason="needs Graphviz's 'dot' (Debian package graphviz; .ci/run installs it)")


@needs_dot
def test_the_two_sides_are_drawn_next_to_each_other(tmp_path, capsys):
    """Before on the left, after on the right, their first rows level (``dot -Tplain``
    gives each node's centre); not before above after."""
    import subprocess

    old = write(tmp_path, "old.json", ConfigMap("v1", "PIECEWISE", "narrow", (NARROW,)))
    new = write(tmp_path, "new.json", ConfigMap("v1", "PIECEWISE", "wide", (WIDE,)))
    rc, dot_text, _ = run(["diff", old, new, "--format", "dot"], capsys)
    assert rc == 0
    plain = subprocess.run(["dot", "-Tplain"], input=dot_text, capture_output=True, text=True, check=True).stdout
    centre = {f[1]: (float(f[2]), float(f[3])) for f in (line.split() for line in plain.splitlines()) if f[0] == "node"}
    import re

    start = dot_text.index("subgraph cluster_d1 {")  # the after side's cluster; the before side's comes first
    side = {m[1]: "before" if m.start() < start else "after"
            for m in re.finditer(r"^\s+(n\d+) \[", dot_text, re.M) if m[1] in centre}
    before = [centre[n] for n, s in side.items() if s == "before"]
    after = [centre[n] for n, s in side.items() if s == "after"]
    assert before and after
    assert max(x for x, _ in before) < min(x for x, _ in after)  # side by side, before on the left
    assert max(y for _, y in before) == pytest.approx(max(y for _, y in after), abs=0.5)  # tops level


@needs_dot
def test_diff_has_the_formats_show_has(tmp_path, capsys):
    from capturelint.reporters import formats

    assert set(formats("show")) - {"rich"} <= set(formats("diff"))
    old = write(tmp_path, "old.json", ConfigMap("v1", "PIECEWISE", "narrow", (NARROW,)))
    new = write(tmp_path, "new.json", ConfigMap("v1", "PIECEWISE", "wide", (WIDE,)))
    rc, out, _ = run(["diff", old, new, "--format", "svg"], capsys)
    assert rc == 0 and "<svg" in out and "moved to eager" in out
    png = tmp_path / "diff.png"
    rc, _, _ = run(["diff", old, new, "--format", "png", "-o", str(png)], capsys)
    assert rc == 0 and png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    rc, out, err = run(["diff", old, new, "--format", "png"], capsys)  # binary: never to a terminal or pipe
    assert rc == 2 and out == "" and err.splitlines() == [
        "capturelint: error: PNG output is binary: name a file with -o FILE (or use --format svg or dot for stdout)"]
