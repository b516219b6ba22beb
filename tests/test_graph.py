"""The region graph: schema, queries and domain errors, on hand-made engines."""

from __future__ import annotations

import pytest

from capturelint import graph as rg
from capturelint.runtime.breakable import SegmentKind
from capturelint.graph import Access, NodeKind, RegionGraphError, build_region_graph
from toy_engine import check_toy


@pytest.fixture(scope="module")
def stream():
    """Toy "escaped_output" fixed: captured #0 (inp), eager break Toy.route, captured #2."""
    result, _ = check_toy("escaped_output", fixed=True, steps=2)
    return result.captures[0]


@pytest.fixture(scope="module")
def G(stream):
    return build_region_graph(stream)


def test_node_keys_are_ops_and_sequential_storages(G, stream):
    ops = sorted(n for n in G if n[0] == "op")
    storages = sorted(n for n in G if n[0] == "storage")
    assert ops == [("op", i) for i in range(len(stream.ops))]
    assert storages == [("storage", i) for i in range(len(storages))]
    # never addresses: no storage identity survives anywhere in the graph
    ids = set(stream.origins)
    for _, d in G.nodes(data=True):
        assert not ids & {v for v in d.values() if isinstance(v, int)}


def test_op_attributes(G, stream):
    d = G.nodes[("op", 2)]
    rec = stream.ops[2]
    assert d["kind"] is NodeKind.OP
    assert (d["op"], d["scope"], d["file"], d["line"], d["function"]) == (
        rec.op, rec.scope, rec.frame.file, rec.frame.line, rec.frame.function)
    assert d["segment"] == 1 and d["segment_kind"] is SegmentKind.EAGER and d["break_name"] == "Toy.route"
    first = G.nodes[("op", 0)]
    assert first["segment_kind"] is SegmentKind.CAPTURED and first["break_name"] is None and first["scope"] == "inp"


def test_storage_attributes(G):
    names = {d["name"]: d["external"] for _, d in G.nodes(data=True) if d["kind"] is NodeKind.STORAGE}
    assert names["model.inp.weight"] is True
    assert names["model.gate"] is True
    assert names["aten.addmm.default output (inp)"] is False


def test_edge_direction(G):
    rg.check_graph(G)
    for u, v, a in G.edges(data="access"):
        if a is Access.READ:
            assert (u[0], v[0]) == ("storage", "op")
        else:
            assert (u[0], v[0]) == ("op", "storage")
    # copy_ into the persistent gate: a WRITE, not a PRODUCE; sigmoid's output: a PRODUCE
    gate = next(n for n, d in G.nodes(data=True) if d.get("name") == "model.gate")
    assert [(u, a) for u, _, a in G.in_edges(gate, data="access")] == [(("op", 3), Access.WRITE)]
    assert any(a is Access.PRODUCE for _, _, a in G.out_edges(("op", 2), data="access"))
    # the edge key is the argument name
    assert ("storage", 0) in G.pred[("op", 1)] and "mat2" in G[("storage", 0)][("op", 1)]


def test_segments_in_order_with_scope_counts(G):
    ov = rg.segment_overview(G)
    assert [(o.segment.kind, o.segment.name, o.ops) for o in ov] == [
        (SegmentKind.CAPTURED, None, 2), (SegmentKind.EAGER, "Toy.route", 2), (SegmentKind.CAPTURED, None, 3)]
    assert [o.segment.label for o in ov] == ["captured #0", "eager break Toy.route", "captured #2"]
    assert [(s.scope, s.ops) for s in ov[2].scopes] == [("", 1), ("out", 2)]
    assert ov[0].scopes[0].by_op == (("aten.addmm.default", 1), ("aten.t.default", 1))
    assert rg.eager_ops(G) == 2 and rg.captured_ops(G) == 5


def test_scope_dataflow_crosses_segment_boundaries(G):
    flows = {(f.src_segment, f.src_scope, f.dst_segment, f.dst_scope): f.tensors for f in rg.scope_dataflow(G)}
    # inp's output feeds the break and the next captured segment; the break's write of
    # the gate feeds the captured multiply
    assert flows == {(0, "inp", 1, ""): 1, (0, "inp", 2, ""): 1, (1, "", 2, ""): 1}
    ops = {(f.src, f.dst): f.tensors for f in rg.op_dataflow(G)}
    assert ops == {(1, 2): 1, (1, 4): 1, (3, 4): 1}


def test_queries(G):
    assert rg.last_writer(G, next(iter(G.pred[("op", 4)])), 4) is not None
    assert rg.upstream_ops(G, 4) == [("op", 1), ("op", 2), ("op", 3)]
    assert rg.find_ops(G, "addmm") == [("op", 1), ("op", 6)]
    assert rg.find_ops(G, scope_prefix="out") == [("op", 5), ("op", 6)]
    assert [n[1] for n in rg.op_nodes(G, 1)] == [2, 3]
    assert rg.segment(G, 1).name == "Toy.route"
    assert rg.scope_group("model.layers.12.attn.wq_b") == "model.layers.*.attn.wq_b"


def test_networkx_errors_become_domain_errors(G):
    with pytest.raises(RegionGraphError, match="no op #99"):
        rg.upstream_ops(G, 99)
    with pytest.raises(RegionGraphError, match="no op #99"):
        rg.op_attrs(G, 99)
    with pytest.raises(RegionGraphError, match="no segment #7"):
        rg.segment(G, 7)
    with pytest.raises(RegionGraphError, match="no storage node"):
        rg.last_writer(G, ("storage", 999), 3)


def test_check_graph_reports_a_broken_invariant(G):
    H = G.copy()
    H.add_edge(("op", 0), ("op", 1), key="x", access=Access.READ)
    with pytest.raises(RegionGraphError, match="wrong direction"):
        rg.check_graph(H)


def test_same_engine_gives_the_same_graph():
    a, _ = check_toy("escaped_output", fixed=True, steps=2)
    b, _ = check_toy("escaped_output", fixed=True, steps=2)
    Ga, Gb = build_region_graph(a.captures[0]), build_region_graph(b.captures[0])
    assert list(Ga.nodes(data=True)) == list(Gb.nodes(data=True))
    assert list(Ga.edges(keys=True, data=True)) == list(Gb.edges(keys=True, data=True))


# ------------------------------------------------- queries on a hand-built stream

from region_streams import stream as hand_stream  # noqa: E402


@pytest.fixture(scope="module")
def H():
    G = build_region_graph(hand_stream())
    rg.check_graph(G)
    return G


def _storage(G, name):
    return next(n for n, d in G.nodes(data=True) if d.get("name") == name)


def test_find_ops_by_scope_function_op_and_writes(H):
    ops = lambda nodes: [n[1] for n in nodes]  # noqa: E731
    assert ops(rg.find_ops(H, scope="model.layers.*.attn*")) == [0, 1, 2]
    assert ops(rg.find_ops(H, scope="model.layers.*.attn", function="_fused*")) == [1]
    assert ops(rg.find_ops(H, op=["aten.mm*"])) == [0, 4] == ops(rg.find_ops(H, "mm"))
    assert ops(rg.find_ops(H, op=["aten.mm*"], scope=["*.ffn*"])) == [4]
    assert ops(rg.find_ops(H, writes="kv_cache.*")) == [1]
    assert rg.find_ops(H, scope="model.layers.1.*") == []


def test_find_ops_reads_follows_the_data_upstream(H):
    # op1 reads the slot mapping as the forward got it; ops 2-4 derive from op1's write
    assert [n[1] for n in rg.find_ops(H, reads="attn_metadata*")] == [1, 2, 3, 4]
    # op2 reads the cache after op1 wrote it: not the value the forward began with
    assert rg.find_ops(H, reads="kv_cache.*") == []
    assert [n[1] for n in rg.find_ops(H, reads="model.*.weight")] == [0, 1, 2, 3, 4]


def test_last_writer_and_upstream_ops_on_the_hand_built_stream(H):
    kv = _storage(H, "kv_cache.layers.0.swa")
    assert rg.last_writer(H, kv, 2) == ("op", 1)
    assert rg.last_writer(H, kv, 1) is None
    assert rg.upstream_ops(H, 3) == [("op", 0), ("op", 1), ("op", 2)]
    assert rg.upstream_ops(H, 0) == []
    assert rg.storages_written(H, 1) == [kv]
    assert rg.reads_initial(H, 2) == [] and rg.reads_initial(H, 1) == [_storage(H, "attn_metadata['layers.0.swa'].slot_mapping")]


def test_check_graph_on_the_hand_built_stream(H):
    rg.check_graph(H)
    broken = H.copy()
    broken.add_edge(("op", 4), _storage(H, "kv_cache.layers.0.swa"), key="x", access=Access.PRODUCE)
    with pytest.raises(RegionGraphError, match="2 producers|producers"):
        broken.add_edge(("op", 3), _storage(H, "kv_cache.layers.0.swa"), key="y", access=Access.PRODUCE)
        rg.check_graph(broken)
    with pytest.raises(RegionGraphError, match="no op #9"):
        rg.storages_written(H, 9)
