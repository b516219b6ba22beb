"""The Graphviz form of ``capturelint show`` (and of ``capturelint diff``).

**Layout.** Left to right in execution order. One outer cluster per shown graph
(runner, mode, eager region, batch descriptor); inside it one cluster per segment:

- captured segments: label ``captured #i · N ops``, light blue fill, solid rounded
  border;
- eager breaks: label ``eager break <qualified name> · N ops``, light orange fill,
  dashed bold border.

Nodes are module scopes with their op count (``--ops``: one node per op run, with its
source line). Edges are data flow across segment boundaries (``graph.scope_dataflow``),
labelled with the number of tensors. Findings are red nodes (or red cluster labels)
carrying ``CODE condition``.

**Stability.** Node ids are sequential in drawing order; fill colours come from a fixed
palette indexed by ``zlib.crc32`` of the scope with layer numbers replaced by ``*`` (the
same module has the same colour in every layer, run and machine). The same report gives
byte-identical DOT text.
"""

from __future__ import annotations

import shutil
import zlib

import graphviz

from capturelint.runtime.protocol import SegmentKind
from capturelint.errors import CapturelintError
from capturelint.graph import op_dataflow, scope_group
from capturelint.render.view import ConfigView, GraphView, op_runs, scope_label

FONT = "Helvetica"
CAPTURED = {"style": "filled,rounded", "fillcolor": "#e6f0fb", "color": "#3f6fa8", "penwidth": "1.5", "fontcolor": "#1f3f66"}
EAGER = {"style": "filled,dashed,bold", "fillcolor": "#fde7c9", "color": "#c8701e", "penwidth": "2.5", "fontcolor": "#7a3d00"}
FINDING_COLOR = "#d62728"
COLUMN_ROWS = 14  # a long segment wraps into several columns (FULL graphs hold every scope)
PALETTE = (
    "#ffffff", "#f2f2f2", "#e8f5e9", "#fff8e1", "#f3e5f5", "#e0f7fa", "#fce4ec", "#f1f8e9",
    "#ede7f6", "#e3f2fd", "#fbe9e7", "#f9fbe7",
)


class DotMissing(CapturelintError):
    """The Graphviz ``dot`` executable is not installed."""


def scope_color(scope: str) -> str:
    """A fill colour for a scope, the same in every layer and on every run."""
    return PALETTE[zlib.crc32(scope_group(scope).encode()) % len(PALETTE)]


def _label(*lines: str) -> str:
    # graphviz quotes the string; "\n" must reach dot as the two characters \ and n
    return "\\n".join(line.replace("\\", "\\\\").replace('"', '\\"') for line in lines)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


class _Ids:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> str:
        self.n += 1
        return f"n{self.n}"


def _graph_cluster(dot: graphviz.Digraph, cfg: ConfigView, view: GraphView, gi: int, ids: _Ids, ops: bool) -> str:
    stands = f"; stands for {view.stands_for} graphs" if view.stands_for > 1 else ""
    title = f"{cfg.title} · graph {view.graph} ({view.runtime_mode}{stands})"
    node_of: dict[tuple[int, str], str] = {}  # (segment, scope) or (segment, "#op") -> node id
    op_node: dict[int, str] = {}
    anchors: list[tuple[str, str]] = []
    with dot.subgraph(name=f"cluster_g{gi}") as outer:
        outer.attr(label=_label(title, cfg.totals_line()), labeljust="l", style="rounded", color="#999999", fontsize="14")
        for ov in view.overview:
            seg = ov.segment
            eager = seg.kind is SegmentKind.EAGER
            style = dict(EAGER if eager else CAPTURED)
            head = f"{seg.label} · {_plural(ov.ops, 'op')}"
            seg_tags = view.marks.segment(seg.index)
            lines = [head] + ([" ".join(seg_tags)] if seg_tags else [])
            if seg_tags:
                style["color"] = FINDING_COLOR
                style["fontcolor"] = FINDING_COLOR
            with outer.subgraph(name=f"cluster_g{gi}_s{seg.index}") as c:
                c.attr(label=_label(*lines), labeljust="l", fontsize="12", **style)
                members: list[str] = []
                if not ov.scopes:
                    nid = ids()
                    c.node(nid, label="(no ops)", shape="plaintext", style="", fillcolor="")
                    members.append(nid)
                for sc in ov.scopes:
                    if ops:
                        for d, indices in op_runs(view.G, seg.index, sc.scope):
                            nid = ids()
                            tags = tuple(sorted({t for i in indices for t in view.marks.op(i)}))
                            times = f" ×{len(indices)}" if len(indices) > 1 else ""
                            text = [scope_label(sc.scope), d["op"] + times, f"{d['file']}:{d['line']}"]
                            c.node(nid, label=_label(*text, *([" ".join(tags)] if tags else [])), **_node_style(sc.scope, tags))
                            for i in indices:
                                op_node[i] = nid
                            members.append(nid)
                    else:
                        nid = ids()
                        tags = view.marks.scope(seg.index, sc.scope)
                        text = [scope_label(sc.scope), _plural(sc.ops, "op")]
                        c.node(nid, label=_label(*text, *([" ".join(tags)] if tags else [])), **_node_style(sc.scope, tags))
                        node_of[(seg.index, sc.scope)] = nid
                        members.append(nid)
                anchors.append(_columns(c, dot, members))
    _chain(dot, anchors)
    head = anchors[0][0]
    if ops:
        for flow in op_dataflow(view.G):
            src, dst = op_node.get(flow.src), op_node.get(flow.dst)
            if src and dst and src != dst:
                dot.edge(src, dst, label=str(flow.tensors))
    else:
        for flow in view.flows:
            src = node_of.get((flow.src_segment, flow.src_scope))
            dst = node_of.get((flow.dst_segment, flow.dst_scope))
            if src and dst:
                dot.edge(src, dst, label=str(flow.tensors))
    return head


def _columns(cluster: graphviz.Digraph, dot: graphviz.Digraph, members: list[str]) -> tuple[str, str]:
    """Lay a segment's nodes out in columns of at most ``COLUMN_ROWS``, in execution
    order; returns the heads of its first and last columns."""
    heads = []
    for start in range(0, len(members), COLUMN_ROWS):
        with cluster.subgraph() as same:
            same.attr(rank="same")
            for m in members[start:start + COLUMN_ROWS]:
                same.node(m)
        heads.append(members[start])
    for a, b in zip(heads, heads[1:]):
        dot.edge(a, b, style="invis", weight="20")
    return heads[0], heads[-1]


def _chain(dot: graphviz.Digraph, anchors: list[tuple[str, str]]) -> None:
    """Execution order: each segment's columns right of the previous segment's."""
    for (_, last), (first, _) in zip(anchors, anchors[1:]):
        dot.edge(last, first, style="invis", weight="20")


def _stack(dot: graphviz.Digraph, heads: list[str], at: int) -> None:
    """Graphs one below the other in drawing order. Under ``rankdir=LR`` dot stacks
    unconnected graphs bottom-up in the order their nodes first appear, so each graph's
    first node is declared up front (body position ``at``), last graph first."""
    dot.body[at:at] = [f"\t{h}\n" for h in reversed(heads)]


def _node_style(scope: str, tags: tuple[str, ...]) -> dict[str, str]:
    if tags:
        return {"fillcolor": "#fde0e0", "color": FINDING_COLOR, "fontcolor": FINDING_COLOR, "penwidth": "2.5"}
    return {"fillcolor": scope_color(scope)}


def _digraph(name: str, title: str, subtitle: str) -> graphviz.Digraph:
    """A diagram with the house layout, fonts and node and edge styles."""
    dot = graphviz.Digraph(name)
    dot.attr(rankdir="LR", newrank="true", fontname=FONT, nodesep="0.12", ranksep="0.9", labelloc="t",
             label=_label(title, subtitle))
    dot.attr("node", shape="box", style="filled,rounded", fontname=FONT, fontsize="10", color="#555555", margin="0.08,0.03")
    dot.attr("edge", fontname=FONT, fontsize="8", color="#666666", arrowsize="0.6")
    return dot


def report_dot(views: list[ConfigView], ops: bool = False) -> str:
    """The DOT text of every shown graph of every configuration."""
    dot = _digraph(
        "capturelint",
        "capturelint regions: captured segments (blue, solid) replay frozen; eager breaks (orange, dashed) re-run live",
        "edges: tensors written in one segment and read in another",
    )
    ids = _Ids()
    gi = 0
    heads = []
    top = len(dot.body)
    for cfg in views:
        for view in cfg.graphs:
            heads.append(_graph_cluster(dot, cfg, view, gi, ids, ops))
            gi += 1
        if not cfg.graphs:
            heads.append(ids())
            dot.node(heads[-1], label=_label(cfg.title, "no graph captured: every step ran eagerly"), shape="plaintext", style="")
    _stack(dot, heads, top)
    return dot.source


MOVED_COLOR = "#7b3fb0"


def _short_op(op: str) -> str:
    """``aten.mm.default`` -> ``aten.mm`` (the overload adds nothing in a diagram)."""
    parts = op.split(".")
    return ".".join(parts[:-1]) if len(parts) >= 3 else op


def _map_cluster(dot: graphviz.Digraph, title: str, graph, moved: dict[tuple[int, str], list[str]], changed_segments: set[int],
                 segment_word: str, gi: int, ids: _Ids) -> str:
    anchors: list[tuple[str, str]] = []
    with dot.subgraph(name=f"cluster_d{gi}") as outer:
        outer.attr(label=_label(title), labeljust="l", style="rounded", color="#999999", fontsize="14")
        for si, seg in enumerate(graph.segments):
            eager = seg.kind is SegmentKind.EAGER
            style = dict(EAGER if eager else CAPTURED)
            head = ("eager break " + str(seg.name)) if eager else f"captured #{si}"
            lines = [f"{head} · {_plural(seg.op_count, 'op')}"]
            if si in changed_segments:
                lines.append(segment_word)
                style["color"] = MOVED_COLOR
                style["fontcolor"] = MOVED_COLOR
            with outer.subgraph(name=f"cluster_d{gi}_s{si}") as c:
                c.attr(label=_label(*lines), labeljust="l", fontsize="12", **style)
                members = []
                for scope, by_op in seg.ops:
                    nid = ids()
                    n = sum(k for _, k in by_op)
                    notes = moved.get((si, scope), [])
                    if len(notes) > 5:
                        notes = notes[:5] + [f"... and {len(notes) - 5} more"]
                    attrs = {"fillcolor": scope_color(scope)}
                    if notes:
                        attrs.update(color=MOVED_COLOR, fontcolor=MOVED_COLOR, penwidth="2.5")
                    c.node(nid, label=_label(scope_label(scope), _plural(n, "op"), *notes), **attrs)
                    members.append(nid)
                if not members:
                    nid = ids()
                    c.node(nid, label="(no ops)", shape="plaintext", style="", fillcolor="")
                    members.append(nid)
                anchors.append(_columns(c, dot, members))
    _chain(dot, anchors)
    return anchors[0][0]


def changes_dot(pairs, changes) -> str:
    """The DOT text of a region diff: for each pair of configurations and each runtime
    mode, the first graph both sides captured, before above after; scopes whose ops
    moved and segments added or removed are purple."""
    from capturelint.region_changes import Direction, graph_diff

    dot = _digraph(
        "capturelint_diff",
        "capturelint region diff: captured segments (blue, solid), eager breaks (orange, dashed);",
        "purple: ops that moved between captured and eager, segments added or removed",
    )
    ids = _Ids()
    gi = 0
    heads: list[str] = []
    top = len(dot.body)
    for (old, new), change in zip(pairs, changes.configs):
        new_graphs = {g.key: g for g in new.graphs}
        seen: set[str] = set()
        for og in old.graphs:
            ng = new_graphs.get(og.key)
            if ng is None or og.runtime_mode in seen:
                continue
            seen.add(og.runtime_mode)
            gd = graph_diff(og, ng)
            for side, graph, word, segs, label in (
                ("before", og, "removed", set(gd.removed), f"{old.label} · eager region {old.eager_region}"),
                ("after", ng, "added", set(gd.added), f"{new.label} · eager region {new.eager_region}"),
            ):
                moved: dict[tuple[int, str], list[str]] = {}
                for (scope, op, direction), n in sorted(gd.moved.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2].value)):
                    # mark the scope on the side the ops sit: captured before / eager after, or the converse
                    want_eager = (direction is Direction.TO_EAGER) == (side == "after")
                    for si, seg in enumerate(graph.segments):
                        if (seg.kind is SegmentKind.EAGER) == want_eager and any(sc == scope and any(o == op for o, _ in by) for sc, by in seg.ops):
                            moved.setdefault((si, scope), []).append(f"{_short_op(op)} ×{n} moved {direction}")
                            break
                title = f"{side}: {label} · graph {og.graph} ({og.runtime_mode})"
                if side == "after":
                    title += f" · eager ops per step {change.describe_growth()}"
                heads.append(_map_cluster(dot, title, graph, moved, segs, word, gi, ids))
                gi += 1
    _stack(dot, heads, top)
    return dot.source


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


__all__ = ["DotMissing", "changes_dot", "report_dot", "render_image", "require_dot", "scope_color"]
