"""Region diagrams read in execution order, fold repeated layers and emphasise findings.

Folding is tested on plain segment data (``capturelint.render.fold``); the drawing on
the bundled engine's seed case (V1, PIECEWISE, narrow region, 4 layers) through
``dot -Tplain``: where dot actually put each node, not only what the DOT text says.
The 61-layer model is the seed's four layer kinds cycled to DeepSeek V4's depth (as
the engine cycles them), so that no test runs 61 layers; ``docs/gallery/layers-61``
is the real run.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import shutil

import pytest

import dot_layout
from capturelint import api
from capturelint.cli import main
from capturelint.graph import RegionSegment, ScopeCount, SegmentOverview
from capturelint.render.dot import FINDING, MOVED, report_dot
from capturelint.render.fold import Item, Segment, fold_runs, layers_of, rows, split_layer
from capturelint.render.view import GraphView, Marks, report_views
from capturelint.runtime.protocol import SegmentKind

pytestmark = pytest.mark.skipif(shutil.which("dot") is None,
                                reason="needs Graphviz's 'dot' (Debian package graphviz; .ci/run installs it)")

SEED = dict(runner="v1", modes="PIECEWISE", eager_region="narrow", steps=2)
MAX_WIDTH = 1440  # px at 96 dpi: a 1440x900 screen shows the picture without horizontal scrolling
MAX_HEIGHT_61 = 3000  # px: 61 layers stay about as tall as the seed's 4


# ------------------------------------------------------------- folding, no dot

def model(n: int, eager_ops=lambda i: 1, marks: dict[int, tuple[str, ...]] | None = None) -> list[Segment]:
    """Segments shaped as the engine's: each captured segment holds the end of one layer
    and the start of the next; layer ``i``'s attention breaks out with ``eager_ops(i)`` ops."""
    marks = marks or {}

    def item(scope: str, ops: int, mark: tuple[str, ...] = ()) -> Item:
        return Item((len(segs), scope), scope, ops, (), mark)

    segs: list[Segment] = []
    pending = [item("model.embed", 1)]
    for i in range(n):
        pending += [item(f"model.layers.{i}.attn_norm", 6), item(f"model.layers.{i}.attn", 3, marks.get(i, ()))]
        segs.append(Segment(len(segs), "captured", f"captured #{len(segs)}", 0, tuple(pending)))
        segs.append(Segment(len(segs), "eager", "eager break Attn.core", 0, (item(f"model.layers.{i}.attn", eager_ops(i)),)))
        pending = [item(f"model.layers.{i}.attn", 20), item(f"model.layers.{i}.ffn", 58)]
    segs.append(Segment(len(segs), "captured", f"captured #{len(segs)}", 0, tuple(pending + [item("model.norm", 6)])))
    return segs


def test_layers_are_cut_from_segments_that_straddle_them():
    layers = layers_of(model(2))
    assert [layer.prefix for layer in layers] == [None, "model.layers.0", "model.layers.1", None]
    first = layers[1]
    assert [(p.segment.index, p.starts) for p in first.pieces] == [(0, False), (1, True), (2, True)]
    assert [split_layer(i.scope)[2] for i in first.pieces[0].items] == ["attn_norm", "attn"]
    assert split_layer("model.layers.12") == ("model.layers.12", 12, "")
    assert split_layer("Sequential.Linear") == (None, None, "Sequential.Linear")


def test_identical_layers_fold_into_one_row():
    rs = rows(model(4))
    assert [r.label for r in rs] == ["", "model.layers.0-3 (×4)", ""]
    folded = rs[1]
    assert folded.repeats == 4 and len(folded.shown) == 1
    assert [r.label for r in rows(model(4), fold=False)] == ["", *(f"model.layers.{i}" for i in range(4)), ""]


def test_a_layer_with_a_finding_or_other_ops_is_drawn_on_its_own():
    assert [r.label for r in rows(model(4, marks={2: ("CL101 R1",)}))] == \
        ["", "model.layers.0-1 (×2)", "model.layers.2", "model.layers.3", ""]
    assert [r.label for r in rows(model(4, eager_ops=lambda i: 5 if i == 0 else 1))] == \
        ["", "model.layers.0", "model.layers.1-3 (×3)", ""]


def test_a_repeated_pattern_of_layers_folds():
    kinds = (1, 3, 11, 3)  # the eager ops of DeepSeek V4's four attention kinds, cycled
    rs = rows(model(61, eager_ops=lambda i: kinds[i % 4]))
    assert [r.label for r in rs] == ["", "model.layers.0-59 (layers 0-3 ×15)", "model.layers.60", ""]
    assert rs[1].member_label(1) == "model.layers.1, 5, …, 57 (×15)"


def test_fold_runs():
    assert fold_runs("aaab") == [(0, 1, 3), (3, 1, 1)]
    assert fold_runs("ababa") == [(0, 2, 2), (4, 1, 1)]
    assert fold_runs("abc") == [(0, 1, 1), (1, 1, 1), (2, 1, 1)]
    assert fold_runs("aabaab") == [(0, 3, 2)]  # the pattern covering most, not the first repeat
    assert fold_runs("") == []


# --------------------------------------------------------- the seed, drawn by dot

@pytest.fixture
def seed(memo_runs):
    return report_views(api.show(**SEED))


def test_segments_and_scopes_are_drawn_in_execution_order(seed):
    dot = report_dot(seed)
    nodes = dot_layout.nodes(dot)
    pos = dot_layout.positions(dot)
    view = seed[0].graphs[0]
    # ids follow execution order: segment by segment, scopes as they first ran
    expected = [(ov.segment.index, sc.scope) for ov in view.overview for sc in ov.scopes]
    assert [(n.segment, n.scope) for n in nodes] == expected
    lines = [list(g) for _, g in itertools.groupby(nodes, key=lambda n: n.line)]
    assert len(lines) == len({n.line for n in nodes}) == 6  # embed, four layers, norm: each band once
    for above, below in zip(lines, lines[1:]):  # bands top to bottom (y grows upwards)
        assert min(pos[n.id][1] for n in above) > max(pos[n.id][1] for n in below), (above[0].line, below[0].line)
    for line in lines:  # pieces left to right
        pieces = [list(g) for _, g in itertools.groupby(line, key=lambda n: n.piece_cluster)]
        for left, right in zip(pieces, pieces[1:]):
            assert max(pos[n.id][0] for n in left) < min(pos[n.id][0] for n in right), (left[0].label, right[0].label)
        for piece in pieces:  # scopes down each column, columns left to right
            for a, b in zip(piece, piece[1:]):
                (xa, ya), (xb, yb) = pos[a.id], pos[b.id]
                assert yb < ya or xb > xa, (a.label, b.label)


def test_findings_and_boundary_tensors_stand_out(seed):
    dot = report_dot(seed)
    red = [n for n in dot_layout.nodes(dot) if "CL101 R1: aten.constant_pad_nd" in n.label]
    assert [n.scope for n in red] == [f"model.layers.{i}.attn" for i in range(4)]
    assert all(re.fullmatch(r"capturelint/engine/dsv4/attention\.py:\d+", n.lines[2]) for n in red)
    styled = re.findall(r"\tn(\d+) \[label=\"[^\"]*\" color=\"([^\"]+)\"", dot)
    assert {int(i) for i, c in styled if c == FINDING["color"]} == {n.id for n in red}  # nothing else is red
    # tensors out of each eager break, green, drawn without moving the layout
    assert len(re.findall(r'n\d+ -> n\d+ \[label="1 tensor" color="#1b8a5a" constraint=false', dot)) >= 4
    assert "finding: code, op, source line" in dot and "tensor into or out of an eager break" in dot


def test_the_seed_picture_fits_a_screen_and_unfold_changes_nothing_there(seed):
    w, h = dot_layout.size_px(report_dot(seed))
    assert w <= MAX_WIDTH, (w, h)
    # the seed's layers are four attention kinds: nothing to fold
    assert report_dot(seed) == report_dot([dataclasses.replace(v, fold=False) for v in seed])


def deepen(view: GraphView, n: int) -> GraphView:
    """The seed's graph with its four layer kinds cycled to ``n`` layers, as the engine
    cycles them: per kind, the scopes before, in and after the eager break."""
    ovs = view.overview

    def of(scopes, k):
        return tuple(sc for sc in scopes if split_layer(sc.scope)[1] == k)

    pre = {k: of(ovs[2 * k].scopes, k) for k in range(4)}
    eager = {k: ovs[2 * k + 1].scopes for k in range(4)}
    post = {k: of(ovs[2 * k + 2].scopes, k) for k in range(4)}
    marks = {k: {sc.scope: view.marks.site(2 * k, sc.scope) for sc in pre[k]} for k in range(4)}

    def relayer(scopes, k, i):
        return tuple(dataclasses.replace(sc, scope=sc.scope.replace(f"layers.{k}", f"layers.{i}", 1)) for sc in scopes)

    out, sites = [], {}

    def segment(kind: SegmentKind, scopes) -> None:
        index = len(out)
        out.append(SegmentOverview(RegionSegment(index, kind, "Attn.core" if kind is SegmentKind.EAGER else None, "", 0, 0),
                                   sum(sc.ops for sc in scopes), scopes))

    head = ovs[0].scopes[:1]
    for i in range(n):
        k = i % 4
        layer_pre = relayer(pre[k], k, i)
        sites.update({(len(out), sc.scope): marks[k][old.scope] for sc, old in zip(layer_pre, pre[k]) if marks[k][old.scope]})
        segment(SegmentKind.CAPTURED, head + layer_pre)
        segment(SegmentKind.EAGER, relayer(eager[k], k, i))
        head = relayer(post[k], k, i)
    segment(SegmentKind.CAPTURED, head + (ScopeCount("model.norm", 6, ()),))
    return dataclasses.replace(view, overview=tuple(out), flows=(), marks=Marks({}, {}, {}, sites))


def test_61_layers_fold_to_the_size_of_the_seed(seed):
    cfg = seed[0]
    deep = [dataclasses.replace(cfg, graphs=(deepen(cfg.graphs[0], 61),))]
    dot = report_dot(deep)
    nodes = dot_layout.nodes(dot)
    assert {n.row for n in nodes} >= {"model.layers.0-59 (layers 0-3 ×15)", "model.layers.60"}
    assert len(nodes) < 110  # 4 layers and one more, drawn once
    unfolded = dot_layout.nodes(report_dot([dataclasses.replace(deep[0], fold=False)]))
    assert len(unfolded) > 1000
    w, h = dot_layout.size_px(dot)
    assert w <= MAX_WIDTH and h <= MAX_HEIGHT_61, (w, h)
    # the finding of every layer stays on the layers drawn
    assert sum("CL101 R1" in n.label for n in nodes) == 5


# ------------------------------------------------------------------------- diff

def test_diff_marks_the_moved_ops_and_the_changed_segments(memo_runs, tmp_path, capsys):
    out = tmp_path / "d.dot"
    assert main(["diff", "--runner", "v1", "--mode", "PIECEWISE", "--steps", "2", "--eager-region", "narrow",
                 "--against-eager-region", "per-runner", "--format", "dot", "-o", str(out)]) == 0
    dot = out.read_text()
    nodes = dot_layout.nodes(dot)
    moved = [n for n in nodes if any(line.endswith("moved to eager") for line in n.lines)]
    assert {n.scope for n in moved} >= {f"model.layers.{i}.attn.wq_b" for i in range(4)}
    assert {n.piece for n in moved} == {"captured #0", "captured #2", "captured #4", "captured #6",
                                        "eager break DeepseekV4Attention._prepare_and_attn_eager"}
    styled = re.findall(r"\tn(\d+) \[label=\"[^\"]*\" color=\"([^\"]+)\"", dot)
    assert {int(i) for i, c in styled if c == MOVED["color"]} == {n.id for n in moved}
    assert re.search(r'label="eager break #1 · 1 op\\nremoved\\nDeepseekV4Attention._sparse_indexer_and_attn"', dot)
    width, height = dot_layout.size_px(dot)  # the two sides next to each other: each within the screen's width
    assert width <= 2 * 1100, (width, height)


def test_the_rich_tree_folds_the_same_way(seed):
    from rich.console import Console

    from capturelint.render.tree import render_tree

    cfg = seed[0]
    deep = dataclasses.replace(cfg, graphs=(deepen(cfg.graphs[0], 61),))
    for fold in (True, False):
        console = Console(width=200, record=True)
        render_tree([dataclasses.replace(deep, fold=fold)], console)
        text = console.export_text()
        assert ("model.layers.0-59 (layers 0-3 ×15)" in text) is fold
        assert ("── model.layers.5\n" in text) is not fold
        assert text.count("CL101 R1") == (5 if fold else 61)


def test_show_folds_the_engines_layers_unless_told_not_to(memo_runs, capsys):
    args = ["show", "--runner", "v1", "--mode", "PIECEWISE", "--steps", "2", "--layers", "8", "--no-check"]
    assert main(args) == 0
    folded = capsys.readouterr().out
    assert "model.layers.0-7 (layers 0-3 ×2)" in folded and "── model.layers.1, 5 (×2)\n" in folded
    assert main([*args, "--no-fold"]) == 0
    unfolded = capsys.readouterr().out
    assert "×2" not in unfolded and all(f"── model.layers.{i}\n" in unfolded for i in range(8))
