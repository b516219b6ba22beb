"""The Rich form of ``capturelint show``: one tree per runner and mode.

Printed form, layer by layer as the diagram (``capturelint.render.fold``; ``--ops``
adds the ops under each scope)::

    runner v1 · PIECEWISE · eager region narrow
    ├── graph mixed/32 (PIECEWISE; stands for 6 graphs)
    │   ├── captured #0 · 28 ops
    │   │   └── model.embed · 1 op
    │   ├── model.layers.0
    │   │   ├── captured #0, continued
    │   │   │   ├── attn_norm · 6 ops
    │   │   │   └── attn · 3 ops  CL101 R1: aten.constant_pad_nd at .../attention.py:305
    │   │   ├── eager break DeepseekV4Attention._sparse_indexer_and_attn (#1) · 1 op
    │   │   │   └── attn · 1 op
    │   │   └── ...
    │   ├── model.layers.4-7 (×4)
    │   └── ...
    └── 6 graphs; per step: 2 eager breaks, 299 captured ops, 4 eager ops

Findings are marked in red with their code and condition (and the op and source line
where known) on the op, scope or segment they concern (see ``capturelint.render.view``).
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from capturelint.lists import cut
from capturelint.render.fold import Layer, Piece, Row, rows, split_layer
from capturelint.render.view import ConfigView, GraphView, finding_tag, num, op_runs, scope_label, view_segments

CAPTURED_STYLE = "cyan"
EAGER_STYLE = "yellow"
FINDING_STYLE = "bold red"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _tags(text: Text, tags: tuple[str, ...]) -> None:
    if tags:
        text.append("  " + ", ".join(tags), style=FINDING_STYLE)


def _piece_head(piece: Piece, row: Row) -> Text:
    seg = piece.segment
    eager = seg.kind == "eager"
    title = seg.label if not eager or row.folded else f"{seg.label} (#{seg.index})"
    if row.folded and not eager:
        title = "captured"
    head = Text(title, style=EAGER_STYLE if eager else CAPTURED_STYLE)
    if not piece.starts:
        head.append(", continued", style="dim")
    elif not row.folded:
        head.append(f" · {_plural(seg.ops, 'op')}", style="dim")
    if row.folded:
        head.append(f" (×{row.repeats})", style="dim")
    if piece.starts:
        _tags(head, seg.marks)
    return head


def _layer_branch(branch: Tree, view: GraphView, layer: Layer, row: Row, ops: bool) -> None:
    for piece in layer.pieces:
        node = branch.add(_piece_head(piece, row))
        for item in piece.items:
            name = scope_label(item.scope) if layer.prefix is None else (split_layer(item.scope)[2] or "<layer>")
            line = Text(name, style=FINDING_STYLE if item.marks else "")
            line.append(f" · {_plural(item.ops, 'op')}", style="dim")
            _tags(line, item.marks)
            leaf = node.add(line)
            if ops:
                segment, scope = item.key
                for d, indices in op_runs(view.G, segment, scope):
                    op_tags = tuple(sorted({t for i in indices for t in view.marks.op(i)}))
                    t = Text(d["op"], style=FINDING_STYLE if op_tags else "")
                    if len(indices) > 1:
                        t.append(f" ×{len(indices)}")
                    t.append(f"  {d['file']}:{d['line']} in {d['function']}", style="dim")
                    _tags(t, op_tags)
                    leaf.add(t)


def graph_tree(view: GraphView, ops: bool = False, fold: bool = True) -> Tree:
    """One graph, layer by layer; ``fold``: consecutive layers alike shown once."""
    stands = f"; stands for {view.stands_for} graphs" if view.stands_for > 1 else ""
    root = Tree(Text(f"graph {view.graph} ({view.runtime_mode}{stands})", style="bold"))
    segs, _ = view_segments(view)
    for row in rows(segs, fold):
        if row.layers[0].prefix is None:
            _layer_branch(root, view, row.layers[0], row, ops)
            continue
        branch = root.add(Text(row.label, style="bold" if row.folded else ""))
        for k, layer in enumerate(row.shown):
            _layer_branch(branch if row.period == 1 else branch.add(Text(row.member_label(k))), view, layer, row, ops)
    return root


def config_tree(view: ConfigView, ops: bool = False) -> Tree:
    tree = Tree(Text(view.title, style="bold red" if view.findings else "bold"))
    if view.note:
        tree.add(Text(view.note, style="yellow"))
    if not view.graphs:
        tree.add(Text("no graph captured: every step ran eagerly", style="dim"))
    for g in view.graphs:
        tree.add(graph_tree(g, ops, view.fold))
    if view.unplaced:
        for f in view.unplaced:
            tree.add(Text(f"{finding_tag(f)} {f.scope} · {f.op} in {f.segment} (not in the shown graphs)", style=FINDING_STYLE))
    totals = Text(view.totals_line(), style="bold")
    if view.findings:
        totals.append(f"; {_plural(len(view.findings), 'finding')} (run `capturelint check` for details)", style=FINDING_STYLE)
    tree.add(totals)
    return tree


def render_tree(views: list[ConfigView], console: Console, ops: bool = False) -> None:
    """Every configuration's tree, then a one-line summary."""
    for v in views:
        console.print(config_tree(v, ops))
    console.print(Text(summary_line(views), style="bold"))


def summary_line(views: list[ConfigView]) -> str:
    n = len(views)
    shown = sum(len(v.graphs) for v in views)
    total = sum(v.total_graphs for v in views)
    findings = sum(len(v.findings) for v in views)
    eager = cut([f"{v.runner}/{v.mode} {num(v.eager_ops_per_step)}" for v in views])
    line = f"{_plural(n, 'configuration')}, {shown} of {_plural(total, 'graph')} shown"
    if n:
        line += f"; eager ops per step: {eager}"
    return line + f"; {_plural(findings, 'finding')}"


__all__ = ["config_tree", "graph_tree", "render_tree", "summary_line"]
