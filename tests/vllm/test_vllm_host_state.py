"""A counter advanced inside vLLM's eager break (V1, PIECEWISE, one layer, four
steps): under ``capturelint check`` it advances once per decode step, as in an untraced run of
the same configuration, and the traced run computes the untraced run's logits. The
bundled engine's twin of this test: ``tests/test_shadow_host_state.py``."""

from __future__ import annotations

import json

import torch

from capturelint.cli import main
from vllm_required import require_vllm


class Counted:
    """FlashMLA's decode kernel with host state: ``calls`` advances on every call, and
    the output is scaled in place by the call's parity, so a second call of the eager break per
    step (the old shadow's) changes what the replay computes. The graph run calls it once
    per step (its capture does not call it), as its eager twin does, so the two agree."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        out, lse = self.kernel(*args, **kwargs)
        out.mul_(1 + self.calls % 2)  # vLLM reads the ``out=`` buffer, not the return
        return out, lse


def test_a_counter_in_vllms_eager_break_advances_once_per_step_under_the_tracer(tmp_path, monkeypatch, capsys):
    require_vllm()
    from capturelint.adapters.vllm.install import cpu_shim
    from capturelint.adapters.vllm.runners.reproduced import ReproducedLoop
    from capturelint.adapters.vllm.workload import RunSpec
    from capturelint.runtime.forward_context import CUDAGraphMode

    with cpu_shim():  # FlashMLA's interface imports its extension, which the shim stands in for
        from vllm.third_party.flashmla import flash_mla_interface

    counted = Counted(flash_mla_interface.flash_mla_with_kvcache)
    monkeypatch.setattr(flash_mla_interface, "flash_mla_with_kvcache", counted)
    with cpu_shim():  # the same configuration, untraced
        untraced = ReproducedLoop(RunSpec(mode=CUDAGraphMode.PIECEWISE, layers=1, steps=4)).generate()
    untraced_calls, counted.calls = counted.calls, 0
    runs = []
    # the check below runs the loop counted here: --vllm-runner-impl reproduced
    generate = ReproducedLoop.generate
    monkeypatch.setattr(ReproducedLoop, "generate", lambda self: runs.append(generate(self)) or runs[-1])

    out = tmp_path / "report.json"
    code = main(["check", "--engine", "vllm", "--vllm-runner-impl", "reproduced", "--runner", "v1", "--mode", "PIECEWISE",
                 "--layers", "1", "--steps", "4", "--format", "json", "-o", str(out)])
    doc = json.loads(out.read_text())
    assert code == 0 and doc["findings"] == [], doc["findings"]
    assert doc["numerical"][0]["max_step_error"] == 0.0
    # the traced run, then its eager twin; the twin's calls continue the count, so its
    # parities (and logits, not its tokens) differ, and the break probe makes an untraced
    # graph run to locate that (plan.configuration's twin)
    traced, twin, *probe = runs
    assert len(probe) <= 1
    # one per step with decodes: steps 2-4 (the first is a prefill, which takes FlashMLA's
    # prefill kernel; V1's capture takes the profile-run branch, without FlashMLA)
    assert untraced_calls == 3
    assert counted.calls == len(runs) * untraced_calls  # once per step in each run, the traced one included
    assert torch.equal(traced, untraced) and traced.shape[0] == 13  # the real tokens of the four steps: 2+4+4+3
