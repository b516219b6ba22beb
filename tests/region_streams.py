"""A hand-built capture stream for the region-graph queries and the invariant rules
(CL2xx): no engine, no dispatch mode, every op and storage written out.

One layer: the q projection and the KV insert captured (segment #0), an eager break
``Attn.sparse`` (segment #1) that reads the cache and runs an eager MoE op, and a
captured FFN matmul (segment #2)::

    op0 aten.mm.default       captured  model.layers.0.attn.wq_b  _prepare_and_attn      reads wq_b.weight -> s200
    op1 dsv4.kv_insert.default captured model.layers.0.attn       _fused_qnorm_rope_kv_insert reads s200, slot_mapping; writes kv_cache
    op2 aten.add.Tensor       eager     model.layers.0.attn       _sparse_indexer_and_attn reads kv_cache -> s201
    op3 aten.mul.Tensor       eager     model.layers.0.ffn        forward                 reads s201 -> s202
    op4 aten.mm.default       captured  model.layers.0.ffn.w1     forward                 reads s202 -> s203
"""

from __future__ import annotations

from capturelint.analyzer import Analyzer, RunLabel
from capturelint.records import ContextSummary, OpRecord, Origin, Segment, Stream, StreamKind, TensorUse
from capturelint.runtime.protocol import Frame, SegmentKind

KV, SLOTS, WEIGHT = 100, 101, 102
NAMES = {KV: ("kv_cache.layers.0.swa",), SLOTS: ("attn_metadata['layers.0.swa'].slot_mapping",),
         WEIGHT: ("model.layers.0.attn.wq_b.weight",)}


def _use(arg: str, storage: int, write: bool = False) -> TensorUse:
    return TensorUse(arg, storage, (4,), (1,), 0, "float32", write)


def _op(index: int, op: str, segment: int, scope: str, function: str, line: int, inputs, outputs) -> OpRecord:
    return OpRecord(index, op, segment, scope, Frame("engine/attn.py", line, function), (), tuple(inputs), tuple(outputs))


def stream(context: str = "none", runtime_mode: str = "PIECEWISE") -> Stream:
    ops = [
        _op(0, "aten.mm.default", 0, "model.layers.0.attn.wq_b", "_prepare_and_attn", 10, [_use("mat2", WEIGHT)], [_use("out", 200)]),
        _op(1, "dsv4.kv_insert.default", 0, "model.layers.0.attn", "_fused_qnorm_rope_kv_insert", 20,
            [_use("q", 200), _use("slot_mapping", SLOTS), _use("cache", KV, write=True)], []),
        _op(2, "aten.add.Tensor", 1, "model.layers.0.attn", "_sparse_indexer_and_attn", 30, [_use("self", KV)], [_use("out", 201)]),
        _op(3, "aten.mul.Tensor", 1, "model.layers.0.ffn", "forward", 40, [_use("self", 201)], [_use("out", 202)]),
        _op(4, "aten.mm.default", 2, "model.layers.0.ffn.w1", "forward", 50, [_use("self", 202)], [_use("out", 203)]),
    ]
    segments = [
        Segment(0, SegmentKind.CAPTURED, None, "model", 0, 2),
        Segment(1, SegmentKind.EAGER, "Attn.sparse", "model.layers.0.attn", 2, 4),
        Segment(2, SegmentKind.CAPTURED, None, "model.layers.0", 4, 5),
    ]
    origins = {KV: Origin(True, None), SLOTS: Origin(True, None), WEIGHT: Origin(True, None),
               200: Origin(False, 0), 201: Origin(False, 2), 202: Origin(False, 3), 203: Origin(False, 4)}
    s = Stream(StreamKind.CAPTURE, 7, "mixed/4", runtime_mode, 0, ContextSummary(context, context), ops, segments,
               origins, dict(NAMES))
    return s


def check(rule: type, invariants, runner: str = "v1", mode: str = "PIECEWISE", **kw):
    """The findings of ``rule`` on the hand-built stream, and the analyzer (its counts)."""
    analyzer = Analyzer(RunLabel(runner, mode), [rule], invariants)
    analyzer.check_capture(stream(**kw))
    return analyzer.findings.sorted(), analyzer


def invariant(inv_id: str = "t", **table):
    from capturelint.invariants import parse_invariant

    return parse_invariant("pyproject.toml", "tool.capturelint.invariants", inv_id, table, "settings (pyproject.toml)")
