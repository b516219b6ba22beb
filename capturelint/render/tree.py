"""The Rich form of ``capturelint show``: one tree per runner and mode.

Printed form (``--ops`` adds the ops under each scope)::

    runner v1 · PIECEWISE · eager region narrow
    ├── graph mixed/32 (PIECEWISE; stands for 6 graphs)
    │   ├── captured #0 · 28 ops
    │   │   ├── model.embed · 1 op
    │   │   └── model.layers.0.attn · 3 ops  CL101 R1
    │   ├── eager break DeepseekV4Attention._sparse_indexer_and_attn (#1) · 1 op
    │   │   └── model.layers.0.attn · 1 op
    │   └── ...
    └── 6 graphs; per step: 2 eager breaks, 299 captured ops, 4 eager ops

Findings are marked in red with their code and condition on the op, scope or segment
they concern (see ``capturelint.render.view``).
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from capturelint.runtime.protocol import SegmentKind
from capturelint.render.view import ConfigView, GraphView, finding_tag, num, op_runs, scope_label, segment_title

CAPTURED_STYLE = "cyan"
EAGER_STYLE = "yellow"
FINDING_STYLE = "bold red"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _tags(text: Text, tags: tuple[str, ...]) -> None:
    if tags:
        text.append("  " + ", ".join(tags), style=FINDING_STYLE)


def graph_tree(view: GraphView, ops: bool = False) -> Tree:
    stands = f"; stands for {view.stands_for} graphs" if view.stands_for > 1 else ""
    root = Tree(Text(f"graph {view.graph} ({view.runtime_mode}{stands})", style="bold"))
    for ov in view.overview:
        seg = ov.segment
        eager = seg.kind is SegmentKind.EAGER
        head = Text(segment_title(seg), style=EAGER_STYLE if eager else CAPTURED_STYLE)
        head.append(f" · {_plural(ov.ops, 'op')}", style="dim")
        _tags(head, view.marks.segment(seg.index))
        branch = root.add(head)
        for sc in ov.scopes:
            tags = view.marks.scope(seg.index, sc.scope)
            line = Text(scope_label(sc.scope), style=FINDING_STYLE if tags else "")
            line.append(f" · {_plural(sc.ops, 'op')}", style="dim")
            _tags(line, tags)
            leaf = branch.add(line)
            if ops:
                for d, indices in op_runs(view.G, seg.index, sc.scope):
                    op_tags = tuple(sorted({t for i in indices for t in view.marks.op(i)}))
                    t = Text(d["op"], style=FINDING_STYLE if op_tags else "")
                    if len(indices) > 1:
                        t.append(f" ×{len(indices)}")
                    t.append(f"  {d['file']}:{d['line']} in {d['function']}", style="dim")
                    _tags(t, op_tags)
                    leaf.add(t)
    return root


def config_tree(view: ConfigView, ops: bool = False) -> Tree:
    tree = Tree(Text(view.title, style="bold red" if view.findings else "bold"))
    if view.note:
        tree.add(Text(view.note, style="yellow"))
    if not view.graphs:
        tree.add(Text("no graph captured: every step ran eagerly", style="dim"))
    for g in view.graphs:
        tree.add(graph_tree(g, ops))
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
    eager = ", ".join(f"{v.runner}/{v.mode} {num(v.eager_ops_per_step)}" for v in views[:5])
    if n > 5:
        eager += f" ... and {n - 5} more"
    line = f"{_plural(n, 'configuration')}, {shown} of {_plural(total, 'graph')} shown"
    if n:
        line += f"; eager ops per step: {eager}"
    return line + f"; {_plural(findings, 'finding')}"


__all__ = ["config_tree", "graph_tree", "render_tree", "summary_line"]
