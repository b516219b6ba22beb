"""The analyzer on hand-built streams: alignment, extent, follow-ons, messages. No dispatch mode."""

import dataclasses
from types import MappingProxyType

import pytest

from capturelint.analyzer import RegionView, RunLabel, build_view, location_problem
from capturelint.runtime.protocol import SegmentKind
from capturelint.findings import Frame
from capturelint.records import ContextSummary, OpRecord, Origin, Segment, Stream, StreamKind, TensorUse
from capturelint.rules.cl101_baked_control_flow import BakedControlFlow
from capturelint.rules.cl102_baked_host_value import BakedHostValue
from capturelint.rules.cl103_baked_shape import BakedShape

LABEL = RunLabel("v1", "PIECEWISE")


def use(storage: int, arg: str = "self", shape=(4,)) -> TensorUse:
    return TensorUse(arg, storage, shape, (1,), 0, "float32", False)


def op(i: int, name: str, line: int, inputs=(), outputs=(), scope: str = "layers.0.attn", segment: int = 0,
       scalars=()) -> OpRecord:
    return OpRecord(i, name, segment, scope, Frame("model.py", line, "forward"), tuple(scalars), tuple(inputs), tuple(outputs))


def stream(kind: StreamKind, ops: list[OpRecord], has_md: bool, origins=None, step: int = 0) -> Stream:
    s = Stream(kind, 1, "decode/4", "PIECEWISE", step, ContextSummary("metadata", "attn_metadata held 3 entries") if has_md else ContextSummary("none", "attn_metadata was None"))
    s.ops = ops
    s.segments = [Segment(0, SegmentKind.CAPTURED, None, "layers.0.attn", 0, len(ops))]
    s.origins = origins or {}
    return s


def test_first_divergence_and_extent_not_a_cascade():
    cap = stream(StreamKind.CAPTURE, [op(0, "aten.mm", 10), op(1, "aten.pad", 11), op(2, "aten.add", 20), op(3, "aten.mul", 21)], False)
    sh = stream(StreamKind.SHADOW, [op(0, "aten.mm", 10), op(1, "dsv4.insert", 12), op(2, "dsv4.norm", 13),
                                    op(3, "aten.add", 20), op(4, "aten.mul", 21)], True, step=3)
    view = build_view(LABEL, cap, sh)
    (al,) = view.alignments
    assert al.divergence.capture_op.op == "aten.pad" and al.divergence.shadow_op.op == "dsv4.insert"
    assert (al.divergence.missing, al.divergence.extra) == (2, 1)
    assert [c.op for c, _ in al.pairs] == ["aten.mm"]  # only pairs before the divergence feed other rules
    assert view.op_map == {0: 0, 2: 3, 3: 4}  # but the producer map keeps every matched pair
    (f,) = list(BakedControlFlow().check(view))
    assert f.message == (
        "captured segment decode/4 #0 captured recorded aten.pad at model.py:11 where replay step 3 runs dsv4.insert at "
        "model.py:12: the capture recorded another branch than the step runs (2 ops of the step missing from the "
        "graph: dsv4.insert, dsv4.norm; 1 extra: aten.pad). The forward context differed at capture: attn_metadata was "
        "None, while at the step attn_metadata held 3 entries; code that branches on it took another path at capture. "
        "Replay re-issues the recorded ops, so the step's ops never run. Move the branching code into an eager "
        "break, or make the capture take the path real steps take."
    )
    assert (f.code, f.scope, f.segment, f.capture_frame.line, f.shadow_frame.line) == ("CL101", "layers.0.attn", "decode/4 #0 captured", 11, 12)


def test_identical_streams_give_no_divergence():
    ops = [op(0, "aten.mm", 10), op(1, "aten.add", 11)]
    view = build_view(LABEL, stream(StreamKind.CAPTURE, ops, True), stream(StreamKind.SHADOW, list(ops), True))
    assert view.alignments[0].divergence is None and list(BakedControlFlow().check(view)) == []


def test_location_compares_storage_identity_and_producers():
    cap = stream(StreamKind.CAPTURE, [op(0, "aten.empty", 1, outputs=[use(500)]), op(1, "aten.add", 2, [use(500), use(7)])], True,
                 origins={500: Origin(False, 0), 7: Origin(True, None)})
    cap.names = {7: ("runner.positions",)}
    same = stream(StreamKind.SHADOW, [op(0, "aten.empty", 1, outputs=[use(900)]), op(1, "aten.add", 2, [use(900), use(7)])], True,
                  origins={900: Origin(False, 0), 7: Origin(True, None)})
    view = build_view(LABEL, cap, same)
    assert location_problem(view, use(500), use(900), "") is None
    assert location_problem(view, use(7), use(7), "") is None
    moved = stream(StreamKind.SHADOW, list(same.ops), True, origins={900: Origin(False, 0), 8: Origin(True, None)})
    problem = location_problem(build_view(LABEL, cap, moved), use(7), use(8), "")
    assert problem is not None and not problem.escaped and problem.capture_name == "runner.positions"
    assert "re-allocated" in problem.reason


def test_a_mismatch_that_follows_from_a_failed_op_is_marked_in_the_view():
    # aten.zeros is recorded with size 4 and runs with size 3 (R2); the add that reads its
    # output sees another shape (R3) only because of that: a follow-on, decided while
    # building the view, so CL103 skips it whether or not CL102 runs, and before or after
    cap = stream(StreamKind.CAPTURE, [op(0, "aten.zeros", 1, outputs=[use(500)], scalars=[("size", (4,))]),
                                      op(1, "aten.add", 2, [use(500)])], True, origins={500: Origin(False, 0)})
    sh = stream(StreamKind.SHADOW, [op(0, "aten.zeros", 1, outputs=[use(900, shape=(3,))], scalars=[("size", (3,))]),
                                    op(1, "aten.add", 2, [use(900, shape=(3,))])], True, origins={900: Origin(False, 0)})
    view = build_view(LABEL, cap, sh)
    assert [m.capture_op.op for m in view.host_values] == ["aten.zeros"]
    (shape,) = view.geometries
    assert shape.capture_op.op == "aten.add" and shape.capture_use.shape == (4,) and shape.followon
    assert view.locations == ()  # the add reads the output of the aligned producer
    assert list(BakedShape().check(view)) == []
    (f,) = BakedHostValue().check(view)
    assert f.code == "CL102" and f.op == "aten.zeros" and "with size=[4], but replay step 0 passes size=[3]:" in f.message


def test_the_views_are_frozen():
    # a rule reads a view and returns findings: nothing it could write reaches another rule
    ops = [op(0, "aten.mm", 10), op(1, "aten.add", 11)]
    view = build_view(LABEL, stream(StreamKind.CAPTURE, ops, True), stream(StreamKind.SHADOW, list(ops), True))
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.geometries = ()
    with pytest.raises(TypeError):
        view.op_map[7] = 7
    with pytest.raises(AttributeError):
        view.alignments[0].pairs.append(view.alignments[0].pairs[0])
    region = RegionView(LABEL, view.capture, None, (), MappingProxyType({"inv": ()}))
    with pytest.raises(TypeError):
        region.selections["inv"] = (("op", 0),)
