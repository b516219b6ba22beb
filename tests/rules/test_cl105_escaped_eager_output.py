"""CL105: a tensor allocated in an eager break, read by a later captured op."""

from capturelint.runtime.protocol import BreakOutputs
from toy_engine import check_toy


def test_break_storing_a_fresh_tensor_on_self_escapes():
    result, runner = check_toy("escaped_output")
    assert [f.code for f in result.findings] == ["CL105"]
    f = result.findings[0]
    assert f.condition.value == "R4"
    assert f.op == "aten.mul.Tensor" and f.capture_frame.line == 50
    assert f.tensor.startswith("output of aten.sigmoid.default")
    assert "Toy.route" in f.message
    assert runner.max_error() > 0.1


def test_break_writing_in_place_into_a_buffer_passes():
    result, runner = check_toy("escaped_output", fixed=True)
    assert result.findings == []
    assert runner.max_error() == 0.0


def test_returned_tensor_is_safe_only_when_the_runtime_copies_returns_back():
    copied, runner = check_toy("returned_output", break_outputs=BreakOutputs.COPY)
    assert copied.findings == [] and runner.max_error() == 0.0
    discarded, runner = check_toy("returned_output", break_outputs=BreakOutputs.DISCARD)
    assert [f.code for f in discarded.findings] == ["CL105"]
    assert runner.max_error() > 0.1
