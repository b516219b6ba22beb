"""CL103: a tensor argument's shape, stride, offset or dtype differs in the step."""

from capturelint.runtime.forward_context import CUDAGraphMode
from toy_engine import check_toy


def test_unpadded_graph_input_is_a_baked_shape_named_after_the_runner_buffer():
    result, _ = check_toy("shape")
    assert [f.code for f in result.findings] == ["CL103"]
    f = result.findings[0]
    assert f.condition.value == "R3"
    assert f.tensor == "runner.input" and f.scope == "inp" and f.op == "aten.addmm.default"
    assert "float32[4, 8]" in f.message and "float32[3, 8]" in f.message


def test_padded_input_passes():
    result, _ = check_toy("shape", fixed=True)
    assert result.findings == []


def test_follow_on_mismatches_are_not_repeated():
    # Every op downstream of the input sees a 3-row tensor; only the root is reported.
    result, _ = check_toy("shape", mode=CUDAGraphMode.FULL)
    assert [f.code for f in result.findings] == ["CL103"]
    assert result.findings[0].scope == "inp"


def test_a_shape_that_follows_from_a_baked_host_value_is_not_a_baked_shape():
    # zero padding sized by a Python int per step: the size is the cause (CL102), the
    # concatenation's other shape its consequence
    result, _ = check_toy("host_shape")
    assert [(f.code, f.op, f.tensor) for f in result.findings] == [("CL102", "aten.new_zeros.default", "argument size")]
    fixed, _ = check_toy("host_shape", fixed=True)
    assert fixed.findings == []
