"""CL104: a captured op reads a storage that was re-allocated after capture."""

from capturelint.runtime.forward_context import CUDAGraphMode
from toy_engine import check_toy


def test_metadata_tensor_reallocated_per_step_is_named():
    result, runner = check_toy("stale_input", mode=CUDAGraphMode.FULL)
    assert [f.code for f in result.findings] == ["CL104"]
    f = result.findings[0]
    assert f.condition.value == "R4"
    assert f.tensor == "attn_metadata['bias']"
    assert "re-allocated" in f.message and f.capture_frame.line == 47
    # the line to change: where the runner re-allocates the tensor every step (`bias = values.clone()`)
    assert (f.location.line, str(f.location_role)) == (126, "allocation") and f.location == f.allocation_frame
    assert runner.max_error() > 0.1


def test_persistent_buffer_refreshed_in_place_passes():
    result, runner = check_toy("stale_input", fixed=True, mode=CUDAGraphMode.FULL)
    assert result.findings == []
    assert runner.max_error() == 0.0


def test_fresh_tensor_read_inside_an_eager_break_is_exempt():
    # break_arg's fixed twin reads md["bias"] (persistent) as a break argument; a fresh
    # tensor read *inside* a break re-runs live: the control-flow twin's break reads the
    # step's metadata, and nothing is reported.
    result, runner = check_toy("control_flow", fixed=True)
    assert [f.code for f in result.findings] == []
    assert runner.max_error() == 0.0
