"""CL102: a non-tensor argument of a captured op differs in the step."""

from capturelint.runtime.forward_context import CUDAGraphMode
from toy_engine import check_toy


def test_python_float_from_the_forward_context_is_baked():
    result, runner = check_toy("host_value")
    assert [f.code for f in result.findings] == ["CL102"]
    f = result.findings[0]
    assert f.condition.value == "R2" and f.op == "aten.mul.Tensor" and f.tensor == "argument other"
    assert f.capture_frame.line == 52
    assert "other=1.0" in f.message and "other=2.0" in f.message
    assert runner.max_error() > 0.1


def test_value_in_a_persistent_tensor_passes():
    result, runner = check_toy("host_value", fixed=True)
    assert result.findings == []
    assert runner.max_error() == 0.0


def test_full_graph_bakes_it_too_and_one_finding_covers_all_steps():
    result, _ = check_toy("host_value", mode=CUDAGraphMode.FULL, steps=5)
    assert [f.code for f in result.findings] == ["CL102"]
    assert result.findings[0].steps == (1, 2, 3, 4) and result.findings[0].occurrences == 4
