"""``capturelint show``: Rich trees and Graphviz diagrams of the regions.

The bundled engine runs with 2 layers and 4 steps in PIECEWISE mode (layer 0 has no
indexer, layer 1 has one). Runs of the same plan are shared between tests (a memo on
``run_check``) except where a test is about two runs being identical.
"""

from __future__ import annotations

import re
import shutil

import dot_layout

import pytest
from rich.console import Console

from capturelint.cli import main
from capturelint.regions import graph_map
from capturelint.report import ConfigReport, Report
from capturelint.render.dot import report_dot
from capturelint.render.tree import render_tree
from capturelint.render.view import report_views
from toy_engine import check_toy

ENGINE = ["--runner", "v1", "--mode", "PIECEWISE", "--layers", "2", "--steps", "4"]
PREPARE_BREAK = "eager break DeepseekV4Attention._prepare_and_attn_eager"


def run(args, capsys) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------ DOT parsing

def node_clusters(dot: str) -> list[tuple[str, str]]:
    """``(node label with its full scope, segment piece holding it)`` for every node, in
    execution order."""
    return [("\n".join((n.scope, *n.lines[1:])), n.piece) for n in dot_layout.nodes(dot)]


def clusters_holding(dot: str, text: str) -> set[str]:
    return {piece for label, piece in node_clusters(dot) if text in label}


# ------------------------------------------------------------------------ tests

def test_narrow_v1_prepares_attention_in_a_captured_cluster(memo_runs, tmp_path, capsys):
    out = tmp_path / "narrow.dot"
    rc, _, err = run(["show", *ENGINE, "--eager-region", "narrow", "--format", "dot", "--ops", "-o", str(out)], capsys)
    assert rc == 0, err
    dot = out.read_text()
    # the profile-run pad of the fused q-norm/RoPE/KV-insert and the indexer's q path
    for prep in ("aten.constant_pad_nd", "model.layers.1.attn.indexer.wq_b", "model.layers.0.attn.wq_b"):
        holders = clusters_holding(dot, prep)
        assert holders and all(h.startswith("captured #") for h in holders), (prep, holders)
    assert "_prepare_and_attn_eager" not in dot
    # the CL101 finding is drawn in red on the op it concerns, with its source line
    red = [label for label, _ in node_clusters(dot) if "CL101 R1" in label]
    assert any("aten.constant_pad_nd" in label and "capturelint/engine/dsv4/attention.py:" in label for label in red)
    assert 'color="#d62728"' in dot


def test_per_runner_v1_prepares_attention_in_the_eager_cluster(memo_runs, tmp_path, capsys):
    out = tmp_path / "wide.dot"
    rc, _, err = run(["show", *ENGINE, "--eager-region", "per-runner", "--no-check", "--format", "dot", "--ops", "-o", str(out)], capsys)
    assert rc == 0, err
    dot = out.read_text()
    for prep in ("aten.constant_pad_nd", "model.layers.1.attn.indexer.wq_b", "model.layers.0.attn.wq_b"):
        assert clusters_holding(dot, prep) == {PREPARE_BREAK}, prep
    # captured and eager clusters look different
    assert 'style="filled,dashed,bold"' in dot and 'style="filled,rounded"' in dot


def test_dot_is_deterministic_and_collapsed_to_scopes(capsys):
    args = ["show", *ENGINE, "--eager-region", "per-runner", "--no-check", "--format", "dot"]
    rc1, first, _ = run(args, capsys)
    rc2, second, _ = run(args, capsys)
    assert rc1 == rc2 == 0
    assert first == second
    assert clusters_holding(first, "model.layers.1.attn.indexer.wq_b") == {PREPARE_BREAK}
    assert "aten.mm" not in first  # scopes, not ops, by default
    assert re.search(r'n\d+ -> n\d+ \[label="\d+ tensors?"', first)  # data flow between segments


NEEDS_DOT = pytest.mark.skipif(
    shutil.which("dot") is None, reason="needs Graphviz's 'dot' (Debian package graphviz; .ci/run installs it)"
)


@NEEDS_DOT
def test_svg_and_png_are_drawn_by_dot(memo_runs, tmp_path, capsys):
    svg, png = tmp_path / "r.svg", tmp_path / "r.png"
    base = ["show", *ENGINE, "--eager-region", "per-runner", "--no-check"]
    assert run([*base, "--format", "svg", "-o", str(svg)], capsys)[0] == 0
    assert run([*base, "--format", "png", "-o", str(png)], capsys)[0] == 0
    text = svg.read_text()
    assert "<svg" in text and "_prepare_and_attn_eager" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_dot_is_an_error_before_the_run_and_writes_nothing(tmp_path, capsys, monkeypatch):
    # it once wrote FILE.dot instead, a file the user did not name (tests/test_io_faults.py, N12)
    import capturelint.adapters.bundled.plan as bundled

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(bundled, "run_check", lambda *a, **k: pytest.fail("the engine ran before the error"))
    out = tmp_path / "r.png"
    rc, _, err = run(["show", *ENGINE, "--format", "png", "-o", str(out)], capsys)
    assert rc == 2 and err.startswith("capturelint: error: Graphviz 'dot' was not found") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_png_needs_a_file(capsys):
    rc, out, err = run(["show", *ENGINE, "--format", "png"], capsys)
    assert rc == 2 and out == ""
    assert err.startswith("capturelint: error: PNG output is binary") and err.count("\n") == 1


def test_rich_tree(memo_runs, capsys):
    rc, out, _ = run(["show", *ENGINE, "--eager-region", "narrow"], capsys)
    assert rc == 0
    assert "runner v1 · PIECEWISE · eager region narrow" in out
    assert "graph mixed/32 (PIECEWISE; stands for 6 graphs)" in out
    assert "captured #0 · " in out
    assert "eager break DeepseekV4Attention._sparse_indexer_and_attn (#1)" in out
    # layer by layer: the indexer's q projection under its layer, captured under narrow
    layer1 = out[out.index("── model.layers.1"):]
    assert layer1.index("captured #2, continued") < layer1.index("attn.indexer.wq_b · 2 ops") < layer1.index("eager break")
    assert "CL101 R1: aten.constant_pad_nd at capturelint/engine/dsv4/attention.py:" in out
    assert "6 graphs; per step: 2 eager breaks, " in out and " eager ops" in out
    rc, out, _ = run(["show", *ENGINE, "--eager-region", "narrow", "--ops"], capsys)
    assert "aten.constant_pad_nd.default  capturelint/engine/dsv4/attention.py:" in out


def test_all_graphs(memo_runs, capsys):
    rc, out, _ = run(["show", *ENGINE, "--eager-region", "per-runner", "--no-check", "--all-graphs"], capsys)
    assert rc == 0
    assert [g for g in ("mixed/1 ", "mixed/2 ", "mixed/32 ") if f"graph {g}" in out] == ["mixed/1 ", "mixed/2 ", "mixed/32 "]


# ----------------------------------------------------------- toy engine, no bundle

def toy_report(hazard: str, fixed: bool = False) -> Report:
    result, _ = check_toy(hazard, fixed=fixed, steps=3)
    cfg = ConfigReport("toy", "PIECEWISE", "toy", result.findings, None,
                       [graph_map(c) for c in result.captures], captures=result.captures)
    return Report([cfg])


def test_findings_are_marked_on_the_op_and_scope():
    report = toy_report("control_flow")
    assert [f.code for f in report.findings] == ["CL101"]
    views = report_views(report)
    marks = views[0].graphs[0].marks
    assert marks.ops and marks.scopes and not views[0].unplaced
    console = Console(width=120, record=True)
    render_tree(views, console, ops=True)
    text = console.export_text()
    assert "CL101 R1" in text and "graph mixed/4 (PIECEWISE)" in text
    assert "1 graph; per step: 0 eager breaks, " in text
    dot = report_dot(views, ops=True)
    assert any("CL101 R1" in label for label, _ in node_clusters(dot))
    assert report_dot(views, ops=True) == dot


def test_toy_clusters_follow_execution_order():
    views = report_views(toy_report("escaped_output", fixed=True))
    dot = report_dot(views)
    order = list(dict.fromkeys(piece for _, piece in node_clusters(dot)))
    assert order == ["captured #0", "eager break Toy.route", "captured #2"]
