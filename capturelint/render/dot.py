"""The Graphviz form of ``capturelint show`` (and of ``capturelint diff``).

**Layout.** Top to bottom in execution order, one row per layer
(``capturelint.render.fold``): a row holds the pieces of the segments that run in that
layer, left to right (captured: blue, solid; eager break: orange, dashed), and each
piece its module scopes top to bottom, in columns of at most ``COLUMN_ROWS``. Scope
names are shown below the layer (``attn.wq_a`` in row ``model.layers.3``). Consecutive
layers of the same structure are folded into one row, ``model.layers.0-3 (×4)``, or a
repeated pattern, ``model.layers.0-59 (layers 0-3 ×15)``; ``fold=False`` draws every
layer. One outer cluster per shown graph, stacked top to bottom (a diff's before and
after side by side, before on the left: ``_Canvas.side_by_side``). Invisible edges fix
the order (a chain down each column, same-rank edges across pieces, and from each row
to the next), so dot cannot reorder it; data-flow edges do not constrain the layout.

**Emphasis.** Everything is muted (white scopes, grey text, pale segments) except what
a reviewer looks for: findings (red: code, condition, op and source line), ops a diff
moved between captured and eager (purple), and tensors that cross a segment boundary
(green arrows, ``graph.scope_dataflow``). A legend heads the diagram.

**Stability.** Node ids are sequential in drawing order; the same report gives
byte-identical DOT text.
"""

from __future__ import annotations

import functools
import math
import shutil
from typing import Callable, Hashable, Sequence

import graphviz

from capturelint.errors import CapturelintError
from capturelint.lists import and_more, cut_list
from capturelint.render.fold import Item, Layer, Piece, Row, Segment, item_rows, rows, split_layer
from capturelint.render.view import ConfigView, GraphView, scope_label, short_op, view_segments

FONT = "Helvetica"
CAPTURED = {"style": "filled,rounded", "fillcolor": "#eef4fb", "color": "#7a9cc6", "penwidth": "1.2", "fontcolor": "#3f5f86"}
EAGER = {"style": "filled,dashed,bold", "fillcolor": "#fdf0dc", "color": "#d08a3a", "penwidth": "2", "fontcolor": "#8a4a08"}
ROW = {"style": "rounded,dotted", "color": "#9a9a9a", "fontcolor": "#555555", "penwidth": "1"}
FOLDED_ROW = {"style": "rounded,bold", "fillcolor": "#ffffff", "color": "#555555", "fontcolor": "#222222", "penwidth": "1.5"}
MUTED = {"fillcolor": "#ffffff", "color": "#b5b5b5", "fontcolor": "#555555"}
FINDING = {"fillcolor": "#fde0e0", "color": "#d62728", "fontcolor": "#a50f15", "penwidth": "2.5"}
MOVED = {"fillcolor": "#efe3f7", "color": "#7b3fb0", "fontcolor": "#5a2a86", "penwidth": "2.5"}
FLOW_COLOR = "#1b8a5a"
COLUMN_ROWS = 6  # a piece with more scopes wraps into columns, so a row stays short
LINE_COLUMNS = 5  # ... but a band has about this many columns at most (with --ops, taller ones)


class DotMissing(CapturelintError):
    """The Graphviz ``dot`` executable is not installed."""


def _label(*lines: str) -> str:
    # graphviz quotes the string; "\n" must reach dot as the two characters \ and n
    return "\\n".join(line.replace("\\", "\\\\").replace('"', '\\"') for line in lines)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class _Ids:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> str:
        self.n += 1
        return f"n{self.n}"


class _Canvas:
    """A diagram being drawn: node ids, the invisible edges and same-rank groups that
    fix the order (emitted last, after every node is declared in its cluster), the foot
    of the band drawn last (the next one goes below it), and what the legend explains."""

    def __init__(self, dot: graphviz.Digraph) -> None:
        self.dot = dot
        self.ids = _Ids()
        self.same_rank: list[list[str]] = []
        self.edges: list[tuple[str, str, str, str]] = []  # invisible (tail, head, weight, minlen)
        self.feet: list[str] = []  # the bottom of what was drawn last: the next band goes below all of them
        self.heads: list[str] = []  # the first node of every band, in drawing order
        self.spacers = 0
        self.folded = False  # some row stands for several layers
        self.flows = False  # some tensor crosses a segment boundary

    def below(self, head: str, foot: str) -> None:
        """A band starts at ``head``: under the previous band and left-aligned with it,
        by one edge from the previous band's ``foot``, the bottom of its first column
        (padded to the band's depth: a longer edge would be routed, and pull the band,
        around the clusters beside it). The rank between holds the band's cluster
        labels: a cluster whose label shares a rank with the band above is put beside
        that band, not under it."""
        self.edges.extend((f, head, "5", "2") for f in self.feet)
        self.feet = [foot]
        self.heads.append(head)

    def side_by_side(self, draws: Sequence[Callable[[], None]]) -> None:
        """Draw each of ``draws`` (a column of bands) under what was drawn before, next to
        each other, left to right in that order; what comes next goes below all of them."""
        above, feet, heads = self.feet, [], []
        for draw in draws:
            self.feet = above
            first = len(self.heads)
            draw()
            if len(self.heads) > first:
                heads.append(self.heads[first])
            feet.extend(self.feet)
        self.feet = feet
        if len(heads) > 1:
            self.same_rank.append(heads)
            self.edges.extend((a, b, "1", "1") for a, b in zip(heads, heads[1:]))
    def finish(self, title: str, legend: Sequence[tuple[dict[str, str], str]]) -> str:
        """The DOT text, headed by ``title`` and a legend of what the diagram shows."""
        legend = [*legend, *([(FLOW_KEY, "→ tensor into or out of an eager break"),
                              (GREY_FLOW_KEY, "→ tensor from one captured segment to a later one")] if self.flows else []),
                  *([(FOLDED_ROW, "(×N): N layers alike, drawn once")] if self.folded else [])]
        cells = [
            f'<td bgcolor="{s["fillcolor"]}" color="{s["color"]}" border="1"><font color="{s["fontcolor"]}">{_html(text)}</font></td>'
            for s, text in legend
        ]
        width = math.ceil(len(cells) / 2)  # two rows of keys: the legend is never the widest thing drawn
        keys = "".join(f"<tr>{''.join(cells[i:i + width])}</tr>" for i in range(0, len(cells), width))
        self.dot.attr(label=f'<<table border="0" cellspacing="4" cellpadding="3"><tr><td colspan="{width}" align="left">'
                            f'<b>{_html(title)}</b></td></tr>{keys}</table>>')
        for a, b, weight, minlen in self.edges:
            self.dot.edge(a, b, style="invis", weight=weight, **({"minlen": minlen} if minlen != "1" else {}))
        for group in self.same_rank:
            self.dot.body.append("\t{rank=same; " + "; ".join(group) + "}\n")
        return self.dot.source


ItemLabel = Callable[[Item, Layer], tuple[list[str], dict[str, str]]]


def _columns(ids: list[str], rows: int) -> list[list[str]]:
    """Ids in balanced columns of at most ``rows``, in order."""
    per = math.ceil(len(ids) / math.ceil(len(ids) / rows))
    return [ids[i:i + per] for i in range(0, len(ids), per)]


def _draw_line(c: graphviz.Digraph, canvas: _Canvas, layer: Layer, row: Row, name: str,
               item_label: ItemLabel, mark: dict[str, str], node_of: dict[Hashable, str]) -> None:
    """One layer's pieces, left to right, each a cluster of columns of its items; a
    segment with marks has its border in the ``mark`` style.

    Sibling clusters ignore same-rank edges under ``newrank``: dot 2.43 places them
    right to left in the order they are declared, so the pieces are declared last
    first (node ids stay in execution order). ``tests/test_dot_order.py`` checks the
    drawn order with ``dot -Tplain``."""
    # columns of COLUMN_ROWS, taller where a band holds many items (ops), so it stays narrow
    rows = max(COLUMN_ROWS, math.ceil(sum(len(p.items) for p in layer.pieces) / LINE_COLUMNS))
    pieces = []
    for piece in layer.pieces:
        members = [(canvas.ids(), item) for item in piece.items] or [(canvas.ids(), None)]
        pieces.append((piece, members, _columns([nid for nid, _ in members], rows)))
    depth = max(len(col) for _, _, columns in pieces for col in columns)
    first = pieces[0][2][0]
    pad = []
    for _ in range(depth - len(first)):  # invisible, so the first column reaches the band's foot
        canvas.spacers += 1
        pad.append(f"s{canvas.spacers}")
    first.extend(pad)
    for pi, (piece, members, _) in reversed(list(enumerate(pieces))):
        style = EAGER if piece.segment.kind == "eager" else CAPTURED
        if piece.starts and piece.segment.marks:
            style = {**style, "color": mark["color"], "fontcolor": mark["color"]}
        with c.subgraph(name=f"{name}_p{pi}") as p:
            p.attr(label=_label(*_piece_label(piece, row).split("\n")), labeljust="l", fontsize="10", margin="6", **style)
            for nid, item in members:
                if item is None:
                    p.node(nid, label="(no ops)", shape="plaintext", style="")
                    continue
                lines, attrs = item_label(item, layer)
                p.node(nid, label=_label(*lines), **attrs)
                node_of.setdefault(item.key, nid)
            for sid in pad if pi == 0 else ():
                p.node(sid, label="", style="invis")
    heads = [col[0] for _, _, columns in pieces for col in columns]
    for _, _, columns in pieces:
        for col in columns:
            canvas.edges.extend((a, b, "10", "1") for a, b in zip(col, col[1:]))
    canvas.edges.extend((a, b, "1", "1") for a, b in zip(heads, heads[1:]))
    canvas.same_rank.append(heads)
    canvas.below(heads[0], first[-1])


def _draw_rows(outer: graphviz.Digraph, canvas: _Canvas, rows_: Sequence[Row], name: str,
               item_label: ItemLabel, mark: dict[str, str]) -> dict[Hashable, str]:
    """Every row of one graph; returns the node drawn for each item key (the items of a
    folded row map to the node of the layer drawn for them)."""
    node_of: dict[Hashable, str] = {}
    for ri, row in enumerate(rows_):
        if row.layers[0].prefix is None:
            _draw_line(outer, canvas, row.layers[0], row, f"cluster_{name}_r{ri}", item_label, mark, node_of)
            continue
        canvas.folded |= row.folded
        with outer.subgraph(name=f"cluster_{name}_r{ri}") as r:
            r.attr(label=_label(row.label), labeljust="l", fontsize="11", **(FOLDED_ROW if row.folded else ROW))
            for k, layer in enumerate(row.shown):
                if row.period == 1:
                    _draw_line(r, canvas, layer, row, f"cluster_{name}_r{ri}", item_label, mark, node_of)
                    continue
                with r.subgraph(name=f"cluster_{name}_r{ri}_l{k}") as sub:
                    sub.attr(label=_label(row.member_label(k)), labeljust="l", fontsize="10", **ROW)
                    _draw_line(sub, canvas, layer, row, f"cluster_{name}_r{ri}_l{k}", item_label, mark, node_of)
    for key, (ri, k, pi, ii) in item_rows(rows_).items():
        if key not in node_of:
            node_of[key] = node_of[rows_[ri].shown[k].pieces[pi].items[ii].key]
    return node_of


def _flow_edges(dot: graphviz.Digraph, node_of: dict[Hashable, str], flows: Sequence[tuple[Hashable, Hashable, int]],
                eager: set[Hashable]) -> None:
    """Tensors crossing a segment boundary: into or out of an eager break in green, from
    one captured segment to a later one (across a break) in thin grey; a folded row's
    flows are drawn once, between its shown layers."""
    drawn: set[tuple[str, str]] = set()
    for src, dst, n in flows:
        a, b = node_of.get(src), node_of.get(dst)
        # ids follow execution order: a flow that maps backwards runs from one repeat of a
        # folded pattern into the next, which the shown layers cannot draw
        if a and b and int(a[1:]) < int(b[1:]) and (a, b) not in drawn:
            drawn.add((a, b))
            if src in eager or dst in eager:
                dot.edge(a, b, label=_plural(n, "tensor"), color=FLOW_COLOR, fontcolor=FLOW_COLOR, penwidth="1.6", constraint="false")
            else:
                dot.edge(a, b, color="#c4c4c4", penwidth="0.8", arrowsize="0.4", constraint="false")


def _piece_label(piece: Piece, row: Row) -> str:
    """``captured #2 · 157 ops`` where the segment starts, ``captured #0, continued``
    after, ``eager break #1 · 3 ops`` and the break's name; in a folded row ``captured
    (×4)``, without the index: the piece stands for one per layer."""
    seg = piece.segment
    eager = seg.kind == "eager"
    if row.folded:
        head = "eager break" if eager else "captured"
    else:
        head = f"eager break #{seg.index}" if eager else seg.label
    if not piece.starts:
        head += ", continued"
    elif not row.folded:
        head += f" · {_plural(seg.ops, 'op')}"
    if row.folded:
        head += f" (×{row.repeats})"
    if piece.starts and seg.marks:
        head += "\n" + " ".join(seg.marks)
    if eager:
        head += "\n" + seg.label.removeprefix("eager break ")
    return head


def _below_layer(scope: str, layer: Layer) -> str:
    """The scope as drawn in its row: below the layer (``attn.wq_a``), ``<layer>`` for the
    layer's own ops, or whole outside layers."""
    if layer.prefix is None:
        return scope_label(scope)
    return split_layer(scope)[2] or "<layer>"


def _digraph(name: str) -> graphviz.Digraph:
    """A diagram with the house layout, fonts, node and edge styles."""
    dot = graphviz.Digraph(name)
    dot.attr(newrank="true", fontname=FONT, nodesep="0.1", ranksep="0.12", labelloc="t", labeljust="l")
    dot.attr("node", shape="box", style="filled,rounded", fontname=FONT, fontsize="9", height="0.22", margin="0.06,0.02", **MUTED)
    dot.attr("edge", fontname=FONT, fontsize="8", color="#666666", arrowsize="0.6")
    return dot


FLOW_KEY = {"fillcolor": "#ffffff", "color": FLOW_COLOR, "fontcolor": FLOW_COLOR}
GREY_FLOW_KEY = {"fillcolor": "#ffffff", "color": "#c4c4c4", "fontcolor": "#777777"}
SHOW_LEGEND = (
    (CAPTURED, "captured segment: replays frozen"),
    (EAGER, "eager break: re-runs live"),
    (FINDING, "finding: code, op, source line"),
)


def _show_item(item: Item, layer: Layer) -> tuple[list[str], dict[str, str]]:
    name = _below_layer(item.scope, layer)
    if item.key[0] == "op":  # a run of one op (view_segments with ops)
        op, file, line, _ = item.detail
        lines = [name, short_op(op) + (f" ×{item.ops}" if item.ops > 1 else ""), f"{file}:{line}"]
    else:
        lines = [f"{name} · {_plural(item.ops, 'op')}"]
    for mark in item.marks:  # "CL101 R1: aten.constant_pad_nd at path:line": the source line on its own
        lines.extend(mark.split(" at ", 1))
    return lines, (FINDING if item.marks else {})


def _graph_cluster(canvas: _Canvas, cfg: ConfigView, view: GraphView, gi: int, ops: bool) -> None:
    stands = f"; stands for {view.stands_for} graphs" if view.stands_for > 1 else ""
    title = f"{cfg.title} · graph {view.graph} ({view.runtime_mode}{stands})"
    segs, flows = view_segments(view, ops)
    rows_ = rows(segs, cfg.fold)
    with canvas.dot.subgraph(name=f"cluster_g{gi}") as outer:
        outer.attr(label=_label(title, cfg.totals_line()), labeljust="l", style="rounded", color="#999999", fontsize="12", fontcolor="#222222")
        node_of = _draw_rows(outer, canvas, rows_, f"g{gi}", _show_item, FINDING)
    canvas.flows |= bool(flows)
    _flow_edges(canvas.dot, node_of, flows, {i.key for s in segs if s.kind == "eager" for i in s.items})


def report_dot(views: list[ConfigView], ops: bool = False) -> str:
    """The DOT text of every shown graph of every configuration, repeated layers folded
    unless the views say not to (``ConfigView.fold``)."""
    canvas = _Canvas(_digraph("capturelint"))
    gi = 0
    for cfg in views:
        for view in cfg.graphs:
            _graph_cluster(canvas, cfg, view, gi, ops)
            gi += 1
        if not cfg.graphs:
            nid = canvas.ids()
            canvas.dot.node(nid, label=_label(cfg.title, "no graph captured: every step ran eagerly"), shape="plaintext", style="")
            canvas.below(nid, nid)
    return canvas.finish("capturelint regions, top to bottom in execution order", SHOW_LEGEND)


DIFF_LEGEND = (
    (CAPTURED, "captured segment"),
    (EAGER, "eager break"),
    (MOVED, "ops moved between captured and eager; segments added or removed"),
)


def changes_dot(pairs, changes, fold: bool = True) -> str:
    """The DOT text of a region diff: for each pair of configurations and each runtime
    mode, the first graph both sides captured, before and after side by side (before on
    the left), each top to bottom in execution order; ops that moved and segments added
    or removed are purple.

    Region maps keep segments in execution order but a segment's scopes by name (a
    snapshot holds counts, not order), so scopes are drawn in natural order: layers in
    execution order (``layers.9`` before ``layers.10``), scopes within a layer by name."""
    from capturelint.region_changes import Direction, graph_diff

    from capturelint.snapshot import natural

    canvas = _Canvas(_digraph("capturelint_diff"))
    gi = 0
    for (old, new), change in zip(pairs, changes.configs):
        new_graphs = {g.key: g for g in new.graphs}
        seen: set[str] = set()
        for og in old.graphs:
            ng = new_graphs.get(og.key)
            if ng is None or og.runtime_mode in seen:
                continue
            seen.add(og.runtime_mode)
            gd = graph_diff(og, ng)
            draws = []
            for side, graph, word, changed, label in (
                ("before", og, "removed", set(gd.removed), f"{old.label} · eager region {old.eager_region}"),
                ("after", ng, "added", set(gd.added), f"{new.label} · eager region {new.eager_region}"),
            ):
                moved: dict[tuple[int, str], list[str]] = {}
                for (scope, op, direction), n in sorted(gd.moved.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2].value)):
                    # mark the scope on the side the ops sit: captured before / eager after, or the converse
                    want_eager = (direction is Direction.TO_EAGER) == (side == "after")
                    for si, seg in enumerate(graph.segments):
                        if (str(seg.kind) == "eager") == want_eager and any(sc == scope and any(o == op for o, _ in by) for sc, by in seg.ops):
                            moved.setdefault((si, scope), []).append(f"{short_op(op)} ×{n} moved {direction}")
                            break
                segs = [
                    Segment(si, str(seg.kind), ("eager break " + str(seg.name)) if str(seg.kind) == "eager" else f"captured #{si}",
                            seg.op_count,
                            tuple(Item((gi, si, scope), scope, sum(k for _, k in by_op), tuple(by_op), _cut(moved.get((si, scope), [])))
                                  for scope, by_op in sorted(seg.ops, key=lambda so: natural(so[0]))),
                            (word,) if si in changed else ())
                    for si, seg in enumerate(graph.segments)
                ]
                title = f"{side}: {label} · graph {og.graph} ({og.runtime_mode})"
                if side == "after":
                    title += f" · eager ops per step {change.describe_growth()}"
                draws.append(functools.partial(_diff_side, canvas, gi, title, rows(segs, fold)))
                gi += 1
            canvas.side_by_side(draws)
    return canvas.finish("capturelint region diff: segments and layers top to bottom in execution order, "
                         "scopes within a layer by name", DIFF_LEGEND)


def _diff_side(canvas: _Canvas, gi: int, title: str, rows_: Sequence[Row]) -> None:
    with canvas.dot.subgraph(name=f"cluster_d{gi}") as outer:
        outer.attr(label=_label(title), labeljust="l", style="rounded", color="#999999", fontsize="12", fontcolor="#222222")
        _draw_rows(outer, canvas, rows_, f"d{gi}", _diff_item, MOVED)


def _cut(notes: list[str]) -> tuple[str, ...]:
    return tuple(cut_list(notes, and_more))


def _diff_item(item: Item, layer: Layer) -> tuple[list[str], dict[str, str]]:
    return [f"{_below_layer(item.scope, layer)} · {_plural(item.ops, 'op')}", *item.marks], (MOVED if item.marks else {})


def require_dot(fmt: str) -> None:
    """Refuse, before a run, an image format that Graphviz's ``dot`` would draw when it
    is not installed (``DotMissing``)."""
    if shutil.which("dot") is None:
        raise DotMissing(_missing(fmt))


def _missing(fmt: str) -> str:
    return (f"Graphviz 'dot' was not found on PATH, so no {fmt.upper()} can be drawn; install Graphviz (e.g. apt install "
            "graphviz), or use --format dot for the DOT text")


def render_image(dot_text: str, fmt: str) -> bytes:
    """Run Graphviz ``dot`` on the text; ``DotMissing`` when it is not installed."""
    try:
        return graphviz.Source(dot_text).pipe(format=fmt)
    except graphviz.ExecutableNotFound:
        raise DotMissing(_missing(fmt)) from None
    except graphviz.CalledProcessError as e:
        err = (e.stderr or b"").decode(errors="replace").strip().splitlines()
        raise CapturelintError(f"Graphviz 'dot' failed: {err[0] if err else e}; report this with the DOT text (--format dot)") from None


__all__ = ["DotMissing", "changes_dot", "report_dot", "render_image", "require_dot"]
