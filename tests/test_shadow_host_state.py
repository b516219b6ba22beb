"""The checker must not change what it checks: host state an eager break keeps (a
counter advanced per call) evolves under the tracer exactly as in an untraced run,
because the replay reuses the shadow's call of each break instead of running it again
(``protocol.run_or_reuse``). A replay that really differs is still reported. The same on vLLM:
``tests/vllm/test_vllm_host_state.py``."""

from __future__ import annotations

import json

import torch

import shadow_engines
from capturelint.cli import main

ENGINES = "shadow_engines"  # imported as a module, so the test reads back the engines it made


def check(capsys, target: str) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["check", "--target", f"{ENGINES}:{target}", "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def test_a_counter_in_a_break_advances_once_per_step_under_the_tracer(capsys):
    untraced = shadow_engines.Counting()
    expected = untraced.run(True)
    assert untraced.calls == 5  # the capture pass and four replayed steps

    code, doc = check(capsys, "counting")
    assert code == 0 and doc["findings"] == []
    assert doc["numerical"][0]["max_step_error"] == 0.0 and doc["numerical"][0]["replay_steps"] == 4
    traced = shadow_engines.ENGINES[0]
    assert traced.calls == untraced.calls
    assert len(traced.outputs) == len(expected)
    assert all(torch.equal(a, b) for a, b in zip(traced.outputs, expected))


def test_host_state_that_makes_the_replay_differ_is_still_reported(capsys):
    untraced = shadow_engines.Rebinding()
    expected, eager = untraced.run(True), shadow_engines.Rebinding()
    eager.calls = 1
    assert not all(torch.equal(a, b) for a, b in zip(expected, eager.run(False)))  # the bug is real

    code, doc = check(capsys, "rebinding")
    assert code == 1 and [f["code"] for f in doc["findings"]] == ["CL105"]  # the stale stamp, explained
    traced = shadow_engines.ENGINES[0]
    assert traced.calls == untraced.calls
    assert all(torch.equal(a, b) for a, b in zip(traced.outputs, expected))



def test_generators_a_break_draws_from_continue_as_in_an_untraced_run(capsys):
    torch.manual_seed(11)
    expected = shadow_engines.Drawing(shadow_engines.CUDAGraphMode.PIECEWISE).run(True)
    torch.manual_seed(11)
    code, doc = check(capsys, "drawing")
    assert code == 0 and doc["findings"] == []
    traced = shadow_engines.ENGINES[0].outputs
    assert len(traced) == len(expected) == 4
    assert all(torch.equal(a, b) for a, b in zip(traced, expected))
    assert not torch.equal(traced[0], traced[1])  # the noise differs per step


def test_a_buffer_reached_through_a_view_a_break_returns_is_restored_after_the_shadow(capsys):
    # The shadow's writes through the view (rows.add_ in the captured segment) used to
    # survive into the replay, which then added again: the traced run computed what the
    # program never does, and reported the replay as differing from its shadow.
    for factory, cls in (("windowed", shadow_engines.Windowed), ("windowed_write", shadow_engines.WindowedWrite)):
        expected = cls().run(True)
        code, doc = check(capsys, factory)
        assert code == 0 and doc["findings"] == [], (factory, doc["findings"])
        (numerical,) = doc["numerical"]
        assert numerical["max_step_error"] == 0.0 and numerical["replay_steps"] == 4, (factory, numerical)
        traced = shadow_engines.ENGINES[0]
        assert all(torch.equal(a, b) for a, b in zip(traced.outputs, expected)), factory


def test_a_break_inside_an_opaque_op_that_fills_its_out_argument_replays_what_it_filled(capsys):
    # The break runs inside the op's dispatch, where torch has taken the tracer's mode
    # off its stack: the shadow used to see none of the break's writes, so its replay
    # reused a call that wrote nothing and read the capture's unwritten output (CL901).
    expected = shadow_engines.Opaque().run(True)
    code, doc = check(capsys, "opaque")
    assert code == 0 and doc["findings"] == [], doc["findings"]
    (numerical,) = doc["numerical"]
    assert numerical["max_step_error"] == 0.0 and numerical["replay_steps"] == 4, numerical
    traced = shadow_engines.ENGINES[0]
    assert all(torch.equal(a, b) for a, b in zip(traced.outputs, expected))


def test_a_break_handed_the_captures_host_value_replays_with_it(capsys):
    # The replay hands the break the capture's metadata object (rows=1), the shadow the
    # step's: reusing the shadow's call gave the replay the step's result, so the traced
    # run computed what the program does not (its replays equal to their shadows).
    expected = shadow_engines.Stamped().run(True)
    eager = shadow_engines.Stamped().run(False)
    assert not all(torch.equal(a, b) for a, b in zip(expected, eager))  # the bug is real
    code, doc = check(capsys, "stamped")
    assert code == 1 and {f["code"] for f in doc["findings"]} == {"CL107"}, doc["findings"]  # the baked argument
    (numerical,) = doc["numerical"]
    assert numerical["max_step_error"] > 0.1, numerical
    traced = shadow_engines.ENGINES[0]
    assert all(torch.equal(a, b) for a, b in zip(traced.outputs, expected))
