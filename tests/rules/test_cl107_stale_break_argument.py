"""CL107: an eager break replayed with a frozen capture-time argument."""

from toy_engine import check_toy


def test_per_step_tensor_passed_to_a_break_is_frozen():
    result, runner = check_toy("break_arg")
    assert [f.code for f in result.findings] == ["CL107"]
    f = result.findings[0]
    assert f.condition.value == "R6" and f.op == "break Toy.scaled"
    assert f.capture_frame.line == 59 and f.segment == "mixed/4 #1 eager Toy.scaled"
    assert "re-allocated" in f.message
    assert runner.max_error() > 0.1


def test_persistent_tensor_argument_passes():
    result, runner = check_toy("break_arg", fixed=True)
    assert result.findings == []
    assert runner.max_error() == 0.0


def test_python_scalar_argument_that_changes_per_step():
    result, runner = check_toy("break_scalar")
    assert [f.code for f in result.findings] == ["CL107"]
    assert result.findings[0].tensor == "argument value"  # the parameter's name
    fixed, _ = check_toy("break_scalar", fixed=True)
    assert fixed.findings == []
