"""CL106: a host synchronisation inside a captured segment."""

import pytest

from toy_engine import check_toy


def test_item_in_a_captured_segment_is_reported_with_its_line():
    result, _ = check_toy("host_sync")
    assert [f.code for f in result.findings] == ["CL106"]
    f = result.findings[0]
    assert f.condition.value == "R5"
    assert f.op == "aten._local_scalar_dense.default"
    assert (f.capture_frame.file, f.capture_frame.line) == ("tests/toy_engine.py", 57)
    assert f.graph == "mixed/4" and result.capture_failed


def test_item_inside_an_eager_break_passes():
    result, _ = check_toy("host_sync", fixed=True)
    assert result.findings == [] and not result.capture_failed


@pytest.mark.parametrize("hazard, op", [("tolist", "Tensor.tolist()"), ("bool_mask", "aten.index.Tensor with a boolean mask")])
def test_host_reads_that_bypass_the_dispatcher_or_hide_in_indexing(hazard, op):
    result, _ = check_toy(hazard)
    assert [(f.code, f.op) for f in result.findings] == [("CL106", op)]
