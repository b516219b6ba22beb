"""CL101: the capture recorded another branch than the step runs."""

from capturelint.runtime.forward_context import CUDAGraphMode
from toy_engine import check_toy


def codes(result):
    return [f.code for f in result.findings]


def test_branch_on_missing_metadata_in_a_captured_segment_is_reported_at_both_lines():
    result, runner = check_toy("control_flow")
    assert codes(result) == ["CL101"]
    f = result.findings[0]
    assert f.condition.value == "R1"
    assert f.op == "aten.mul.Tensor"  # what the capture recorded (the dummy-run branch)
    assert (f.capture_frame.file, f.capture_frame.line) == ("tests/toy_engine.py", 43)
    assert (f.shadow_frame.file, f.shadow_frame.line) == ("tests/toy_engine.py", 45)
    # the line to change: the condition that chose the dummy-run branch (`elif md is None:`)
    assert (f.location.file, f.location.line, str(f.location_role)) == ("tests/toy_engine.py", 42, "branch")
    assert f.segment == "mixed/4 #0 captured"
    assert "attn_metadata was None" in f.message  # the context that explains it
    assert f.steps[0] == 1 and f.occurrences == runner.steps - 1
    assert runner.max_error() > 0.1  # and the hazard is real


def test_the_same_branch_inside_an_eager_break_passes():
    result, runner = check_toy("control_flow", fixed=True)
    assert codes(result) == []
    assert result.replay_steps == runner.steps - 1
    assert runner.max_error() == 0.0


def test_a_full_graph_runs_the_break_inline_so_the_branch_is_baked_again():
    result, runner = check_toy("control_flow", fixed=True, mode=CUDAGraphMode.FULL)
    assert codes(result) == ["CL101"]
    assert result.findings[0].capture_frame.function == "branch"
    assert result.findings[0].runtime_mode == "FULL"
    assert runner.max_error() > 0.1
