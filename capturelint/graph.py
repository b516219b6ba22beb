"""The region graph: one capture stream as a data-flow graph of ops and storages.

A capture records which ops ran in which segment (captured, or an eager break) and which
storages each op read and wrote. ``build_region_graph`` turns that record into a
``networkx.MultiDiGraph`` so that questions about regions are graph queries: what runs
in each segment, grouped by module scope; which tensors cross from one segment into
another; what an op depends on. ``capturelint show`` draws it, ``capturelint snapshot``
summarises it.

The graph is built from records only (``capturelint.records.Stream``): no engine, no
dispatch mode, no GPU. Storage identities never appear in it; storages are numbered in
order of first appearance, so the same capture gives the same graph on every run.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import fnmatch
from collections import Counter, defaultdict
from typing import Sequence

import networkx as nx

from capturelint.runtime.protocol import SegmentKind
from capturelint.errors import CapturelintError
from capturelint.records import Stream

OpNode = tuple[str, int]  # ("op", op index in the stream)
StorageNode = tuple[str, int]  # ("storage", n): n-th storage by first appearance
Node = tuple[str, int]

OP = "op"
STORAGE = "storage"


class RegionGraphError(CapturelintError):
    """A query on a region graph asked for something the graph does not hold."""


class NodeKind(enum.Enum):
    OP = OP
    STORAGE = STORAGE

    def __str__(self) -> str:
        return self.value


class Access(enum.Enum):
    """How an op touches a storage; the edge attribute ``access``."""

    READ = "read"  # storage -> op: the op reads it and does not write it
    WRITE = "write"  # op -> storage: the op writes a storage that existed before it (in place, out=)
    PRODUCE = "produce"  # op -> storage: the op allocated the storage (its output)

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class RegionSegment:
    """One segment of the capture, as kept in ``G.graph["segments"]``.

    ``name`` is the eager break's qualified name (``None`` for captured segments),
    ``scope`` the module scope the segment opened in, ops are ``[first_op, end_op)``.
    """

    index: int
    kind: SegmentKind
    name: str | None
    scope: str
    first_op: int
    end_op: int

    @property
    def label(self) -> str:
        """``captured #0`` or ``eager break DeepseekV4Attention._sparse_indexer_and_attn``."""
        if self.kind is SegmentKind.EAGER:
            return f"eager break {self.name}" if self.name else f"eager #{self.index}"
        return f"captured #{self.index}"


@dataclasses.dataclass(frozen=True)
class ScopeCount:
    """How many ops of one module scope ran in a segment, and which ops."""

    scope: str
    ops: int
    by_op: tuple[tuple[str, int], ...]  # (op name, count), sorted by op name


@dataclasses.dataclass(frozen=True)
class SegmentOverview:
    """A segment with its ops grouped by module scope (scopes in order of first op)."""

    segment: RegionSegment
    ops: int
    scopes: tuple[ScopeCount, ...]


@dataclasses.dataclass(frozen=True)
class ScopeFlow:
    """Tensors that one scope's ops wrote in one segment and another segment read.

    ``tensors`` counts distinct storages: a storage read by the destination scope whose
    latest write (or allocation) before that read was by the source scope.
    """

    src_segment: int
    src_scope: str
    dst_segment: int
    dst_scope: str
    tensors: int


def build_region_graph(stream: Stream) -> nx.MultiDiGraph:
    """The data-flow graph of one capture stream.

    **Node keys.** ``("op", i)`` for the op at index ``i`` of ``stream.ops``;
    ``("storage", n)`` for the ``n``-th distinct storage the stream touched, numbered
    from 0 in order of first appearance (inputs of an op before its outputs, in argument
    order). Storage addresses and identities never appear: the numbering is stable from
    run to run.

    **Node kinds and attributes.** Every node has ``kind`` (a ``NodeKind``).

    - op nodes: ``op`` (dispatcher name, ``aten.mm.default``), ``index``, ``segment``
      (segment index), ``segment_kind`` (``SegmentKind``), ``break_name`` (qualified
      name of the eager break the op ran in, ``None`` in captured segments), ``scope``
      (module scope, ``layers.2.attn``; ``""`` at the top level), ``file``, ``line``,
      ``function`` (the engine source line that issued the op).
    - storage nodes: ``name`` (a parameter, runner buffer or metadata field name; for
      in-step storages ``"<op> output (<scope>)"``) and ``external`` (``True`` when it
      existed before the forward began, ``False`` when an op of the stream allocated it).

    **Edges** (``access`` is an ``Access``; the edge key is the argument name, so an
    op reading one storage through two arguments has two edges):

    - ``storage -> op``: ``READ``, the op reads the storage;
    - ``op -> storage``: ``WRITE``, the op writes a storage that existed before it
      (in-place or ``out=``; from the op schema), or ``PRODUCE``, the op allocated it.

    A view's output shares its input's storage, so a view adds no storage node.

    **Graph attributes.** ``graph`` (batch descriptor, ``decode/8``), ``runtime_mode``,
    ``stream_kind``, ``segments`` (tuple of ``RegionSegment`` in execution order).

    Printed form of a two-op capture (``print(*G.edges(data="access"), sep="\\n")``)::

        (('storage', 0), ('op', 0), <Access.READ: 'read'>)
        (('op', 0), ('storage', 1), <Access.PRODUCE: 'produce'>)
        (('storage', 1), ('op', 1), <Access.READ: 'read'>)
    """
    G = nx.MultiDiGraph()
    segments = tuple(
        RegionSegment(s.index, s.kind, s.name, s.scope, s.first_op, s.end_op if s.end_op >= 0 else len(stream.ops))
        for s in stream.segments
    )
    G.graph.update(graph=stream.graph, runtime_mode=stream.runtime_mode, stream_kind=str(stream.kind), segments=segments)
    seg_by_index = {s.index: s for s in segments}
    numbers: dict[int, int] = {}

    def storage_node(sid: int, scope: str) -> StorageNode:
        n = numbers.get(sid)
        if n is None:
            n = numbers[sid] = len(numbers)
            origin = stream.origins.get(sid)
            external = origin is None or origin.external
            name = stream.name_of(sid, scope)
            if name is None:
                if not external and origin.producer is not None and origin.producer < len(stream.ops):
                    producer = stream.ops[origin.producer]
                    name = f"{producer.op} output ({producer.scope or '<top>'})"
                else:
                    name = f"storage {n}"
            G.add_node((STORAGE, n), kind=NodeKind.STORAGE, name=name, external=external)
        return (STORAGE, n)

    for rec in stream.ops:
        seg = seg_by_index.get(rec.segment)
        kind = seg.kind if seg is not None else SegmentKind.CAPTURED
        node = (OP, rec.index)
        G.add_node(
            node, kind=NodeKind.OP, op=rec.op, index=rec.index, segment=rec.segment, segment_kind=kind,
            break_name=seg.name if seg is not None and kind is SegmentKind.EAGER else None, scope=rec.scope,
            file=rec.frame.file, line=rec.frame.line, function=rec.frame.function,
        )
        for use in rec.inputs:
            s = storage_node(use.storage, rec.scope)
            if use.write:
                G.add_edge(node, s, key=use.arg, access=Access.WRITE)
            else:
                G.add_edge(s, node, key=use.arg, access=Access.READ)
        for use in rec.outputs:
            s = storage_node(use.storage, rec.scope)
            origin = stream.origins.get(use.storage)
            if origin is not None and not origin.external and origin.producer == rec.index:
                G.add_edge(node, s, key=use.arg, access=Access.PRODUCE)
    return G


# ----------------------------------------------------------------------- queries

def segments(G: nx.MultiDiGraph) -> tuple[RegionSegment, ...]:
    """The segments of the capture in execution order."""
    return G.graph.get("segments", ())


def segment(G: nx.MultiDiGraph, index: int) -> RegionSegment:
    for s in segments(G):
        if s.index == index:
            return s
    raise RegionGraphError(
        f"graph {G.graph.get('graph', '?')} has no segment #{index} (it has {len(segments(G))}); "
        "take segment indices from segments(G)"
    )


def op_nodes(G: nx.MultiDiGraph, segment_index: int | None = None) -> list[OpNode]:
    """Op nodes in execution order, all of them or those of one segment."""
    nodes = [n for n, d in G.nodes(data=True) if d["kind"] is NodeKind.OP and (segment_index is None or d["segment"] == segment_index)]
    return sorted(nodes, key=lambda n: n[1])


def op_attrs(G: nx.MultiDiGraph, index: int) -> dict:
    """The attributes of op node ``("op", index)``."""
    try:
        return G.nodes[(OP, index)]
    except KeyError:
        raise RegionGraphError(
            f"graph {G.graph.get('graph', '?')} has no op #{index}; take op indices from op_nodes(G)"
        ) from None


def segment_overview(G: nx.MultiDiGraph) -> list[SegmentOverview]:
    """Segments in execution order, each with its module scopes and their op counts."""
    per_segment: dict[int, dict[str, Counter]] = defaultdict(dict)
    for node in op_nodes(G):
        d = G.nodes[node]
        per_segment[d["segment"]].setdefault(d["scope"], Counter())[d["op"]] += 1
    out = []
    for s in segments(G):
        scopes = tuple(
            ScopeCount(scope, sum(c.values()), tuple(sorted(c.items())))
            for scope, c in per_segment.get(s.index, {}).items()
        )
        out.append(SegmentOverview(s, sum(sc.ops for sc in scopes), scopes))
    return out


def _writes_by_storage(G: nx.MultiDiGraph) -> dict[StorageNode, list[int]]:
    writes: dict[StorageNode, list[int]] = defaultdict(list)
    for u, v, access in G.edges(data="access"):
        if access is not Access.READ:
            writes[v].append(u[1])
    for w in writes.values():
        w.sort()
    return writes


def last_writer(G: nx.MultiDiGraph, storage: StorageNode, before_op: int) -> OpNode | None:
    """The op that last wrote or produced ``storage`` before op ``before_op`` (``None``:
    the value read is the one the storage held when the forward began)."""
    if storage not in G:
        raise RegionGraphError(f"no storage node {storage!r}; take storage nodes from the graph's READ edges")
    writers = sorted(u[1] for u, _, a in G.in_edges(storage, data="access") if a is not Access.READ)
    i = bisect.bisect_left(writers, before_op)
    return (OP, writers[i - 1]) if i else None


def scope_dataflow(G: nx.MultiDiGraph) -> list[ScopeFlow]:
    """Data flow between module scopes across segment boundaries, with counts.

    For every read of a storage, the op that last wrote it before the read is the
    source; when source and reader lie in different segments the pair of
    ``(segment, scope)`` gets the storage counted once. Sorted by source segment,
    destination segment, then scopes.
    """
    writes = _writes_by_storage(G)
    flows: dict[tuple[int, str, int, str], set[StorageNode]] = defaultdict(set)
    for u, v, access in G.edges(data="access"):
        if access is not Access.READ:
            continue
        writers = writes.get(u)
        if not writers:
            continue
        i = bisect.bisect_left(writers, v[1])
        if not i:
            continue
        src = G.nodes[(OP, writers[i - 1])]
        dst = G.nodes[v]
        if src["segment"] != dst["segment"]:
            flows[(src["segment"], src["scope"], dst["segment"], dst["scope"])].add(u)
    return [ScopeFlow(a, b, c, d, len(s)) for (a, b, c, d), s in sorted(flows.items())]


@dataclasses.dataclass(frozen=True)
class OpFlow:
    """Tensors op ``src`` wrote (last, before the read) that op ``dst`` in another
    segment read; ``tensors`` counts distinct storages."""

    src: int
    dst: int
    tensors: int


def op_dataflow(G: nx.MultiDiGraph) -> list[OpFlow]:
    """Like ``scope_dataflow`` at op granularity: flows across segment boundaries."""
    writes = _writes_by_storage(G)
    flows: dict[tuple[int, int], set[StorageNode]] = defaultdict(set)
    for u, v, access in G.edges(data="access"):
        if access is not Access.READ:
            continue
        writers = writes.get(u)
        i = bisect.bisect_left(writers, v[1]) if writers else 0
        if not i:
            continue
        src = writers[i - 1]
        if G.nodes[(OP, src)]["segment"] != G.nodes[v]["segment"]:
            flows[(src, v[1])].add(u)
    return [OpFlow(a, b, len(s)) for (a, b), s in sorted(flows.items())]


def upstream_ops(G: nx.MultiDiGraph, index: int) -> list[OpNode]:
    """Every op whose writes reach op ``index`` through storages, in execution order.

    Data flow only: an op that writes a storage after ``index`` read it still appears
    (storages are nodes, not versions); use ``last_writer`` for the value actually read.
    """
    try:
        anc = nx.ancestors(G, (OP, index))
    except nx.NetworkXError:
        raise RegionGraphError(
            f"graph {G.graph.get('graph', '?')} has no op #{index}; take op indices from op_nodes(G)"
        ) from None
    return sorted((n for n in anc if n[0] == OP), key=lambda n: n[1])


def eager_ops(G: nx.MultiDiGraph) -> int:
    """Ops that ran inside eager breaks (they re-run live on every replay)."""
    return sum(1 for n in op_nodes(G) if G.nodes[n]["segment_kind"] is SegmentKind.EAGER)


def captured_ops(G: nx.MultiDiGraph) -> int:
    return sum(1 for n in op_nodes(G) if G.nodes[n]["segment_kind"] is SegmentKind.CAPTURED)


def _globs(value: str | Sequence[str] | None) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value or ())


def _matches(text: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(text, p) for p in patterns)


def storages_written(G: nx.MultiDiGraph, index: int) -> list[StorageNode]:
    """The storages op ``index`` writes in place (``WRITE`` edges; not its outputs)."""
    node = (OP, index)
    if node not in G:
        raise RegionGraphError(f"graph {G.graph.get('graph', '?')} has no op #{index}; take op indices from op_nodes(G)")
    return sorted({v for _, v, a in G.out_edges(node, data="access") if a is Access.WRITE}, key=lambda n: n[1])


def reads_initial(G: nx.MultiDiGraph, index: int) -> list[StorageNode]:
    """The storages op ``index`` reads with the value they held when the forward began:
    no op of the stream wrote them before the read (``last_writer`` is ``None``)."""
    node = (OP, index)
    if node not in G:
        raise RegionGraphError(f"graph {G.graph.get('graph', '?')} has no op #{index}; take op indices from op_nodes(G)")
    return sorted({u for u, _, a in G.in_edges(node, data="access") if a is Access.READ and last_writer(G, u, index) is None},
                  key=lambda n: n[1])


def find_ops(
    G: nx.MultiDiGraph,
    op: str | Sequence[str] | None = None,
    scope_prefix: str | None = None,
    *,
    scope: str | Sequence[str] | None = None,
    function: str | Sequence[str] | None = None,
    writes: str | Sequence[str] | None = None,
    reads: str | Sequence[str] | None = None,
) -> list[OpNode]:
    """Op nodes, in execution order, that match every criterion given.

    ``op``: a string is a substring of the dispatcher name (``"addmm"``), a list holds
    globs on it (``["aten.*mm*"]``); ``scope_prefix``: the scope starts with it;
    ``scope``, ``function``: globs on the module scope and on the source function;
    ``writes``: the op writes in place a storage whose name matches a glob;
    ``reads``: the op, or an op upstream of it (``upstream_ops``), reads the value that a
    storage whose name matches held when the forward began (``reads_initial``): data
    derived from it. Globs are ``fnmatch`` patterns, case-sensitive.
    """
    op_globs = () if op is None or isinstance(op, str) else tuple(op)
    scopes, functions, written, read = _globs(scope), _globs(function), _globs(writes), _globs(reads)
    out = []
    for n in op_nodes(G):
        d = G.nodes[n]
        if isinstance(op, str) and op not in d["op"]:
            continue
        if op_globs and not _matches(d["op"], op_globs):
            continue
        if scope_prefix is not None and not d["scope"].startswith(scope_prefix):
            continue
        if scopes and not _matches(d["scope"], scopes):
            continue
        if functions and not _matches(d["function"], functions):
            continue
        if written and not any(_matches(G.nodes[s]["name"], written) for s in storages_written(G, n[1])):
            continue
        out.append(n)
    if read:
        sources = {i for i in (n[1] for n in op_nodes(G))
                   if any(_matches(G.nodes[s]["name"], read) for s in reads_initial(G, i))}
        out = [n for n in out if n[1] in sources or any(u[1] in sources for u in upstream_ops(G, n[1]))]
    return out


def check_graph(G: nx.MultiDiGraph) -> None:
    """The schema's invariants; raises ``RegionGraphError`` naming the first broken one.

    Every node has a kind; edges join a storage and an op, READ edges point at the op and
    WRITE/PRODUCE edges away from it; each storage has at most one PRODUCE edge; every op
    lies in a segment of ``G.graph["segments"]`` and inside its op range.
    """
    segs = {s.index: s for s in segments(G)}
    for n, d in G.nodes(data=True):
        if "kind" not in d:
            raise RegionGraphError(f"node {n!r} has no kind; build graphs with build_region_graph")
        if d["kind"] is NodeKind.OP:
            s = segs.get(d["segment"])
            if s is None or not s.first_op <= d["index"] < s.end_op:
                raise RegionGraphError(f"op #{d['index']} lies outside its segment #{d['segment']}")
    for u, v, a in G.edges(data="access"):
        if a is Access.READ:
            ok = u[0] == STORAGE and v[0] == OP
        else:
            ok = u[0] == OP and v[0] == STORAGE
        if not ok:
            raise RegionGraphError(f"edge {u!r} -> {v!r} ({a}) has the wrong direction for its access")
    for n in G.nodes:
        if n[0] == STORAGE:
            producers = [u for u, _, a in G.in_edges(n, data="access") if a is Access.PRODUCE]
            if len(producers) > 1:
                raise RegionGraphError(f"storage {n!r} has {len(producers)} producers; a storage is allocated once")


def scope_group(scope: str) -> str:
    """The scope with layer indices replaced by ``*`` (``layers.*.attn.wq_a``): the same
    module in every layer, for styling."""
    return ".".join("*" if p.isdigit() else p for p in scope.split("."))

