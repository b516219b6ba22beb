"""What ``capturelint show`` draws: graphs chosen from a report, with findings placed.

A report holds every graph each configuration captured; most of them differ only in
batch size. By default one graph per runtime mode stands for the others (the first one
captured in that mode); ``all_graphs`` keeps every graph. Findings are placed on the
shown graph they concern, as precisely as the graph allows: on the op (same segment,
scope and op), else on its scope within the segment, else on the segment; a finding
that fits none of the shown graphs stays with its configuration.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Hashable, Iterable

import networkx as nx

from capturelint.findings import Finding
from capturelint.graph import (
    RegionSegment,
    ScopeFlow,
    SegmentOverview,
    build_region_graph,
    op_dataflow,
    op_nodes,
    scope_dataflow,
    segment_overview,
)
from capturelint.render.fold import Item, Segment
from capturelint.report import ConfigReport, Report
from capturelint.snapshot import config_map


TOP_SCOPE = "<top>"  # how findings name the top-level scope


def finding_tag(f: Finding) -> str:
    """``CL101 R1``: the code and the condition it violates."""
    return f"{f.code} {f.condition}"


@dataclasses.dataclass(frozen=True)
class Marks:
    """Finding tags placed on one graph, by op index, by (segment, scope), by segment;
    ``sites`` says per (segment, scope) which op and source line each tag concerns
    (``CL101 R1: aten.constant_pad_nd at attention.py:305``)."""

    ops: dict[int, tuple[str, ...]]
    scopes: dict[tuple[int, str], tuple[str, ...]]
    segments: dict[int, tuple[str, ...]]
    sites: dict[tuple[int, str], tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def op(self, index: int) -> tuple[str, ...]:
        return self.ops.get(index, ())

    def scope(self, segment: int, scope: str) -> tuple[str, ...]:
        return self.scopes.get((segment, scope), ())

    def segment(self, segment: int) -> tuple[str, ...]:
        return self.segments.get(segment, ())

    def site(self, segment: int, scope: str) -> tuple[str, ...]:
        """The scope's tags with the op and source line each concerns, where known."""
        return self.sites.get((segment, scope), ())


@dataclasses.dataclass(frozen=True)
class GraphView:
    """One shown graph: its region graph, overview, cross-segment flows and marks.

    ``stands_for`` counts the graphs of the same runtime mode it represents (itself
    included; 1 with ``all_graphs``).
    """

    graph: str
    runtime_mode: str
    stands_for: int
    G: nx.MultiDiGraph
    overview: tuple[SegmentOverview, ...]
    flows: tuple[ScopeFlow, ...]
    marks: Marks


@dataclasses.dataclass(frozen=True)
class ConfigView:
    """One runner and mode: shown graphs, totals per step, findings not placed.
    ``eager_region`` is as titled: ``narrow``, or ``per-runner (wide under v1)``;
    ``fold``: whether renderers fold repeated layers (``show --no-fold`` draws each)."""

    runner: str
    mode: str
    eager_region: str
    graphs: tuple[GraphView, ...]
    total_graphs: int
    eager_breaks_per_step: float
    captured_ops_per_step: float
    eager_ops_per_step: float
    findings: tuple[Finding, ...]
    unplaced: tuple[Finding, ...]
    note: str | None
    fold: bool = True  # draw consecutive layers of the same structure once (``capturelint.render.fold``)

    @property
    def title(self) -> str:
        return f"runner {self.runner} · {self.mode} · eager region {self.eager_region}"

    def totals_line(self) -> str:
        n = self.total_graphs
        return (
            f"{n} graph{'s' * (n != 1)}; per step: {num(self.eager_breaks_per_step)} eager "
            f"break{'s' * (self.eager_breaks_per_step != 1)}, {num(self.captured_ops_per_step)} captured ops, "
            f"{num(self.eager_ops_per_step)} eager ops"
        )


def num(x: float) -> str:
    return str(int(x)) if x == int(x) else f"{x:.2f}".rstrip("0")


def _place(G: nx.MultiDiGraph, findings: Iterable[Finding]) -> tuple[Marks, list[Finding]]:
    ops: dict[int, list[str]] = {}
    scopes: dict[tuple[int, str], list[str]] = {}
    segs: dict[int, list[str]] = {}
    sites: dict[tuple[int, str], list[str]] = {}
    unplaced: list[Finding] = []
    seg_index = {s.index: s for s in G.graph["segments"]}
    by_segment: dict[int, list] = {}
    for n in op_nodes(G):
        by_segment.setdefault(G.nodes[n]["segment"], []).append(G.nodes[n])
    for f in findings:
        tag = finding_tag(f)
        if f.segment_index not in seg_index:
            unplaced.append(f)
            continue
        seg_ops = by_segment.get(f.segment_index, [])
        scope = "" if f.scope == TOP_SCOPE else f.scope
        site = (f.capture_frame.file, f.capture_frame.line) if f.capture_frame else None
        op_hit = next((d for d in seg_ops if d["op"] == f.op and d["scope"] == scope and (d["file"], d["line"]) == site), None)
        op_hit = op_hit or next((d for d in seg_ops if d["op"] == f.op and d["scope"] == scope), None)
        if op_hit is not None:
            _add(ops, op_hit["index"], tag)
            _add(scopes, (f.segment_index, scope), tag)
            _add(sites, (f.segment_index, scope), f"{tag}: {short_op(f.op)} at {op_hit['file']}:{op_hit['line']}")
        elif any(d["scope"] == scope for d in seg_ops):
            _add(scopes, (f.segment_index, scope), tag)
            _add(sites, (f.segment_index, scope), tag)
        else:
            _add(segs, f.segment_index, tag)
    freeze = lambda m: {k: tuple(sorted(set(v))) for k, v in m.items()}  # noqa: E731
    return Marks(freeze(ops), freeze(scopes), freeze(segs), freeze(sites)), unplaced


def _add(m: dict, key, tag: str) -> None:
    m.setdefault(key, []).append(tag)


def config_view(cfg: ConfigReport, all_graphs: bool = False, fold: bool = True) -> ConfigView:
    streams = list(cfg.captures)
    per_mode = Counter(s.runtime_mode for s in streams)
    if all_graphs:
        shown = streams
    else:
        seen: set[str] = set()
        shown = []
        for s in streams:
            if s.runtime_mode not in seen:
                seen.add(s.runtime_mode)
                shown.append(s)
    views = []
    placed: set[int] = set()
    for s in shown:
        G = build_region_graph(s)
        # with representatives, a finding of any graph of the same runtime mode is shown
        # on the representative (the graphs differ only in batch size)
        fs = [
            (i, f) for i, f in enumerate(cfg.findings)
            if f.runtime_mode == s.runtime_mode and (not all_graphs or f.graph == s.graph)
        ]
        marks, unplaced = _place(G, [f for _, f in fs])
        left = {id(f) for f in unplaced}
        placed.update(i for i, f in fs if id(f) not in left)
        views.append(GraphView(
            s.graph, s.runtime_mode, 1 if all_graphs else per_mode[s.runtime_mode], G,
            tuple(segment_overview(G)), tuple(scope_dataflow(G)), marks,
        ))
    cmap = config_map(cfg)
    n = len(cmap.graphs)
    return ConfigView(
        cfg.runner, cfg.mode, cfg.region_title, tuple(views), n,
        sum(g.eager_breaks for g in cmap.graphs) / n if n else 0.0,
        sum(g.captured_ops for g in cmap.graphs) / n if n else 0.0,
        cmap.eager_ops_per_step,
        tuple(cfg.findings),
        tuple(f for i, f in enumerate(cfg.findings) if i not in placed),
        cfg.note,
        fold,
    )


def report_views(report: Report, all_graphs: bool = False, fold: bool = True) -> list[ConfigView]:
    return [config_view(c, all_graphs, fold) for c in report.configs]


def view_segments(view: GraphView, ops: bool = False) -> tuple[list[Segment], list[tuple[Hashable, Hashable, int]]]:
    """A shown graph as the segments that ``capturelint.render.fold`` cuts into rows, and
    its data flow across segments as ``(source key, destination key, tensors)``.

    Items are module scopes, keyed ``(segment, scope)`` and marked with the findings'
    sites; with ``ops``, runs of one op at one source line (``op_runs``), keyed
    ``("op", first op index)`` and marked with the findings' tags.
    """
    segs = []
    run_of: dict[int, Hashable] = {}
    for ov in view.overview:
        seg = ov.segment
        items = []
        for sc in ov.scopes:
            if not ops:
                marks = view.marks.site(seg.index, sc.scope) or view.marks.scope(seg.index, sc.scope)
                items.append(Item((seg.index, sc.scope), sc.scope, sc.ops, sc.by_op, marks))
                continue
            for d, indices in op_runs(view.G, seg.index, sc.scope):
                marks = tuple(sorted({t for i in indices for t in view.marks.op(i)}))
                key = ("op", indices[0])
                run_of.update((i, key) for i in indices)
                items.append(Item(key, sc.scope, len(indices), (d["op"], d["file"], d["line"], d["function"]), marks))
        segs.append(Segment(seg.index, seg.kind.value, seg.label, ov.ops, tuple(items), view.marks.segment(seg.index)))
    if ops:
        flows = [(run_of[f.src], run_of[f.dst], f.tensors) for f in op_dataflow(view.G)]
    else:
        flows = [((f.src_segment, f.src_scope), (f.dst_segment, f.dst_scope), f.tensors) for f in view.flows]
    return segs, flows


def segment_title(seg: RegionSegment) -> str:
    """``captured #0`` / ``eager break DeepseekV4Attention._prepare_and_attn_eager (#1)``."""
    return seg.label if seg.kind.value == "captured" else f"{seg.label} (#{seg.index})"


def short_op(op: str) -> str:
    """``aten.mm.default`` -> ``aten.mm`` (the overload adds nothing in a diagram)."""
    parts = op.split(".")
    return ".".join(parts[:-1]) if len(parts) >= 3 else op


def scope_label(scope: str) -> str:
    return scope or TOP_SCOPE


def op_runs(G: nx.MultiDiGraph, segment: int, scope: str) -> list[tuple[dict, tuple[int, ...]]]:
    """The ops of one scope in one segment, consecutive repeats of the same op at the
    same source line folded into ``(attrs of the first, op indices)``."""
    out: list[tuple[dict, tuple[int, ...]]] = []
    for n in op_nodes(G, segment):
        d = G.nodes[n]
        if d["scope"] != scope:
            continue
        if out and _same_site(out[-1][0], d):
            out[-1] = (out[-1][0], out[-1][1] + (d["index"],))
        else:
            out.append((d, (d["index"],)))
    return out


def _same_site(a: dict, b: dict) -> bool:
    return (a["op"], a["file"], a["line"], a["function"]) == (b["op"], b["file"], b["line"], b["function"])


__all__ = ["ConfigView", "GraphView", "Marks", "config_view", "report_views", "finding_tag", "op_runs", "view_segments"]
