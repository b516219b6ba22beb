"""A recorded stream prints as ``torch.fx.Graph`` prints its IR (``Stream.__str__``) and
checks its own invariants (``Stream.lint``): each broken invariant is caught, by name."""

from __future__ import annotations

import dataclasses

import pytest

from capturelint.records import BreakArg, MalformedStream, Origin, SegmentKind, TensorUse
from region_streams import KV, SLOTS, stream


def problems_of(s) -> str:
    with pytest.raises(MalformedStream) as raised:
        s.lint()
    return str(raised.value)


def test_a_recorded_stream_is_well_formed_and_prints_its_segments_and_ops():
    s = stream()
    s.segments[1].break_args = (BreakArg("metadata.slot_mapping", TensorUse("metadata.slot_mapping", SLOTS, (4,), (1,),
                                                                             0, "float32", False), None),
                                BreakArg("n", None, "3"))
    s.lint()  # nothing to say
    assert s.problems() == []
    text = str(s).splitlines()
    assert text[0] == "capture mixed/4 (PIECEWISE), step 0, context: none"
    assert text[1] == ("  inputs: %s0 model.layers.0.attn.wq_b.weight, %s2 attn_metadata['layers.0.swa'].slot_mapping, "
                       "%s3 kv_cache.layers.0.swa")  # %s1 is op 0's output
    assert text[2] == "  #0 captured in model (ops 0..2):"
    assert text[3] == ("    %0 = aten.mm.default(mat2=%s0) -> %s1 float32[4]  # model.layers.0.attn.wq_b at "
                       "engine/attn.py:10")
    assert text[5].startswith("  #1 eager Attn.sparse in model.layers.0.attn (ops 2..4): break(metadata.slot_mapping=%s")
    assert text[5].endswith(", n=3):")
    assert sum(line.startswith("    %") for line in text) == 5  # every op once, under its segment


def test_segments_that_leave_a_gap_are_caught():
    s = stream()
    s.segments[1].first_op = 3
    assert "segment #1 begins at op 3, not at op 2 where the one before it ended" in problems_of(s)


def test_segments_that_end_short_of_the_ops_are_caught():
    s = stream()
    s.segments.pop()
    assert "the segments end at op 4 but the stream has 5 ops" in problems_of(s)


def test_a_segment_never_closed_is_caught():
    s = stream()
    s.segments[2].end_op = -1
    message = problems_of(s)
    assert "segment #2 ends at op -1, before it begins (op 4): it was never closed" in message
    assert message.startswith("the capture stream of graph mixed/4 (step 0) is malformed: ")


def test_an_op_that_names_another_segment_is_caught():
    s = stream()
    s.ops[3] = s.ops[3]._replace(segment=2)
    assert "op 3 lies in segment #1 but names segment #2" in problems_of(s)


def test_an_op_out_of_place_is_caught():
    s = stream()
    s.ops[1] = s.ops[1]._replace(index=4)
    assert "op 1 has index 4" in problems_of(s)


def test_a_tensor_use_without_an_origin_is_caught():
    s = stream()
    del s.origins[KV]
    assert "op 1 (dsv4.kv_insert.default) cache uses a storage with no origin" in problems_of(s)


def test_a_use_made_by_a_later_op_is_caught():
    s = stream()
    s.origins[201] = Origin(False, 3)  # read by op 3, made by op 3: not before it
    assert "op 3 (aten.mul.Tensor) self uses a storage made by op 3, which does not come before it" in problems_of(s)


def test_break_arguments_out_of_range_are_caught():
    s = stream()
    made_in_break = TensorUse("x", 202, (4,), (1,), 0, "float32", False)  # op 3, inside the break itself
    s.segments[1].break_args = (BreakArg("x", made_in_break, None),)
    assert "break argument x of segment #1 was made by op 3, not before the break began (op 2)" in problems_of(s)


def test_break_arguments_of_a_captured_segment_or_of_neither_kind_are_caught():
    s = stream()
    s.segments[0].break_args = (BreakArg("n", None, "3"),)
    s.segments[1] = dataclasses.replace(s.segments[1], break_args=(BreakArg("y", None, None),))
    message = problems_of(s)
    assert "segment #0 is captured but has break arguments" in message
    assert "break argument y of segment #1 is neither a tensor nor a scalar" in message


def test_many_problems_are_cut_at_five():
    s = stream()
    s.origins.clear()
    assert problems_of(s).endswith(" ... and 6 more; print(stream) shows it")
    assert len(s.problems()) == 11 and s.segments[0].kind is SegmentKind.CAPTURED


@pytest.fixture
def lint_off():
    """As a user runs capturelint: no stream linted unless --debug."""
    from capturelint.records import lint_recorded, linting

    was = linting()
    lint_recorded(False)
    yield
    lint_recorded(was)


def test_debug_lints_every_recorded_stream_and_blames_the_tracer(monkeypatch, capsys, lint_off):
    from capturelint.cli import main
    from capturelint.records import Stream, linting

    monkeypatch.setattr(Stream, "problems", lambda self: ["op 0 has index 9"])
    target = ["check", "--target", "examples/torch_cuda_graph.py:targets_stale", "--format", "json"]
    assert main(target) == 1  # not linted: the findings as ever
    assert not linting()
    capsys.readouterr()
    assert main(["--debug", *target]) == 2
    err = capsys.readouterr().err
    assert "internal error: MalformedStream: the capture stream of graph" in err
    assert "is malformed: op 0 has index 9; print(stream) shows it" in err
    assert "this is a bug of the engine" not in err  # the tracer's, not the engine's
