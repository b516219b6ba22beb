"""GPU capture semantics on a CPU, end to end through ``capturelint check``: what a
capture does not compute, what a freed input becomes, what the shadow keeps equal
(random state, the capturing flag), and what break arguments inside containers are.
The small engines live in ``tests/capture_engines.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from capturelint.cli import main
from capturelint.report import finding_entries
from capturelint.runtime.breakable import BreakableGraph
from capturelint.runtime.forward_context import CUDAGraphMode
from test_engine_matrix import EQUAL_CASES, assert_equal, assert_wrong, run_engine

ENGINES = "tests/capture_engines.py"
EXAMPLE = "examples/torch_cuda_graph.py"


def check(capsys, *args: str) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["check", *args, "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def line_of(path: str, text: str) -> int:
    (line,) = [i for i, t in enumerate(Path(path).read_text().splitlines(), 1) if t.strip().startswith(text)]
    return line


def test_a_captured_write_does_not_take_effect_until_replay():
    kv = torch.zeros(4)
    x = torch.arange(4.0)
    graph = BreakableGraph(CUDAGraphMode.FULL)
    with torch.no_grad():
        out = graph.capture(lambda t: kv.add_(t) * 2, x)
        assert torch.equal(kv, torch.zeros(4))  # the buffer keeps its pre-capture value
        assert torch.isnan(out).all()  # a capture's own result is graph memory, not computed
        graph.replay()
    assert torch.equal(kv, x) and torch.equal(out, 2 * x)


@pytest.mark.parametrize("runner,mode,region", EQUAL_CASES)
def test_discarded_break_outputs_keep_the_matrix(capsys, runner, mode, region):
    """The bundled engine's breaks write in place, so vLLM 0.33.0's policy of discarding
    break return values gives the same outcome matrix."""
    report = run_engine(capsys, "--runner", runner, "--mode", mode, "--eager-region", region, "--no-copy-break-outputs")
    assert_equal(report)


def test_discarded_break_outputs_keep_the_wrong_case_wrong(capsys):
    report = run_engine(capsys, "--runner", "v1", "--mode", "PIECEWISE", "--eager-region", "narrow", "--no-copy-break-outputs")
    assert_wrong(report)


def test_check_with_discarded_break_outputs_gives_the_same_verdict(capsys):
    args = ("--runner", "v1", "--eager-region", "narrow", "--mode", "PIECEWISE", "--steps", "8", "--layers", "2")
    copy_code, copied = check(capsys, *args)
    discard_code, discarded = check(capsys, *args, "--break-outputs", "discard")
    assert copy_code == discard_code == 1
    key = lambda doc: [(f["code"], f["scope"], f["capture_frame"]["line"]) for f in doc["findings"]]
    assert key(copied) == key(discarded) and {f["code"] for f in copied["findings"]} == {"CL101", "CL201"}  # the replay hazard, and the V1 invariant it breaks


def test_a_graph_safe_branch_on_the_capturing_flag_is_not_a_finding(capsys):
    code, doc = check(capsys, "--target", f"{ENGINES}:capturing_branch_same")
    assert code == 0 and doc["findings"] == []
    assert all(n["max_step_error"] == 0.0 and n["max_logit_error"] < 1e-6 for n in doc["numerical"])


def test_a_capturing_branch_that_computes_other_values_is_caught_by_the_eager_twin(capsys):
    code, doc = check(capsys, "--target", f"{ENGINES}:capturing_branch_different")
    assert code == 1
    assert [(f["code"], f["mode"]) for f in finding_entries(doc)] == [("CL901", "FULL"), ("CL901", "PIECEWISE")]
    (problem,) = doc["findings"]  # one problem: the divergence, under both modes
    assert problem["count"] == 2
    # the shadow takes the capture's path, so replay equals it; only the twin differs
    assert all(n["max_step_error"] == 0.0 and n["max_logit_error"] > 0.1 for n in doc["numerical"])
    assert "eager-twin error" in doc["findings"][0]["message"]


def test_a_reallocated_input_with_the_same_values_diverges(capsys):
    code, doc = check(capsys, "--target", f"{ENGINES}:same_values")
    assert code == 1
    assert {f["code"] for f in doc["findings"]} == {"CL104"}
    # the graph reads the dropped tensor, which the emulated allocator poisons
    assert all(n["max_step_error"] == "inf" and n["max_logit_error"] == "inf" for n in doc["numerical"])


def test_a_sampler_inside_a_break_is_clean(capsys):
    code, doc = check(capsys, "--target", f"{ENGINES}:sampler")
    assert code == 0 and doc["findings"] == []
    assert doc["numerical"][0]["max_step_error"] == 0.0 and doc["numerical"][0]["replay_steps"] == 4


def test_a_generator_the_roots_do_not_reach_advances_once_per_step(capsys, monkeypatch):
    """The shadow restores only the generators it can see, but the replay reuses the
    shadow's break call instead of drawing again: a hidden generator, host state of the
    break, advances once per step, as in an untraced run."""
    import capture_engines

    def hidden():
        engine = capture_engines.Sampling(CUDAGraphMode.PIECEWISE)
        return [capture_engines.Target(lambda: engine.run(True), {}, runner="test", mode="PIECEWISE")]

    monkeypatch.setattr(capture_engines, "hidden_sampler", hidden, raising=False)
    code, doc = check(capsys, "--target", "capture_engines:hidden_sampler")
    assert code == 0 and doc["findings"] == []
    assert doc["numerical"][0]["max_step_error"] == 0.0 and doc["numerical"][0]["replay_steps"] == 4


def test_a_per_step_tensor_inside_a_dataclass_argument_is_a_stale_break_argument(capsys):
    code, doc = check(capsys, "--target", f"{ENGINES}:dataclass_argument")
    assert code == 1
    (f,) = doc["findings"]
    assert (f["code"], f["tensor"], f["op"]) == ("CL107", "argument meta.scale", "break DataclassArgument.scaled")
    assert f["capture_frame"]["line"] == line_of(ENGINES, "return self.scaled(h, self.meta)")
    fixed_code, fixed = check(capsys, "--target", f"{ENGINES}:dataclass_argument_fixed")
    assert fixed_code == 0 and fixed["findings"] == []


def test_a_plain_torch_program_with_a_reallocated_static_input_fails(capsys):
    code, doc = check(capsys, "--target", f"{EXAMPLE}:targets_stale")
    assert code == 1
    (f,) = doc["findings"]
    assert (f["code"], f["tensor"], f["scope"]) == ("CL104", "server.static_x", "server.model.0")
    assert f["allocation_frame"] == {"file": EXAMPLE, "function": "step",
                                     "line": line_of(EXAMPLE, "self.static_x = batch.clone()")}
    assert f["capture_frame"]["line"] == line_of(EXAMPLE, "self.static_y = self.model(self.static_x)")
    assert "re-allocat" in f["message"] or "allocated at" in f["message"]
    assert doc["numerical"][0]["max_logit_error"] == "inf"


def test_the_same_program_refreshing_in_place_passes(capsys):
    code, doc = check(capsys, "--target", f"{EXAMPLE}:targets_fixed")
    assert code == 0 and doc["findings"] == []
    (n,) = doc["numerical"]
    assert n["replay_steps"] == 4 and n["max_logit_error"] == 0.0


def test_replaying_a_graph_captured_before_tracing_is_an_error(tmp_path, capsys):
    target = tmp_path / "early.py"
    target.write_text(
        "import torch\n"
        "from capturelint.target import Target\n"
        "def targets():\n"
        "    x = torch.ones(2)\n"
        "    g = torch.cuda.CUDAGraph()\n"
        "    with torch.no_grad(), torch.cuda.graph(g):\n"
        "        y = x * 2\n"
        "    return Target(run=lambda: (g.replay(), y.clone())[1], roots={})\n"
    )
    capsys.readouterr()
    assert main(["check", "--target", f"{target}:targets"]) == 2
    err = capsys.readouterr().err
    assert "captured before tracing began" in err and len(err.strip().splitlines()) == 1
