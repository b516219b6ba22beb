"""The worked examples of the bare-graph rules CL108-CL110 and CL116 (``examples/plain/``), each
checked both ways as its docstring says: the hazard exits 1 with its code and nothing
else (no eager twin is given: the rules alone find it), the fix exits 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from capturelint.cli import main

EXAMPLES = Path("examples/plain")
CASES = {
    "stale_holder": ("CL108", "runner.static_x", "self.static_x = batch.clone()"),
    "overwritten_output": ("CL109", "runner.static_y", "return torch.stack(outs)"),
    "capture_output": ("CL110", "lazyrunner.static_y", "return self.static_y.clone()  # the capture"),
    "host_state": ("CL116", "runner.cell.hidden", "self.cell.hidden = torch.zeros(BATCH, DIM, device=DEVICE)"),
}


def check(capsys, spec: str) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["check", "--target", spec, "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def line_of(path: Path, text: str) -> int:
    (line,) = [i for i, t in enumerate(path.read_text().splitlines(), 1) if t.strip().startswith(text)]
    return line


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_hazard_exits_1_with_its_code(capsys, name):
    code_expected, tensor, causing = CASES[name]
    path = EXAMPLES / f"{name}.py"
    assert f"targets_bug     # exit 1, {code_expected}" in path.read_text()  # what the docstring promises
    code, doc = check(capsys, f"{path}:targets_bug")
    assert code == 1
    (f,) = doc["findings"]
    assert (f["code"], f["tensor"]) == (code_expected, tensor)
    assert f["shadow_frame"] == {"file": str(path), "line": line_of(path, causing), "function": f["shadow_frame"]["function"]}
    assert f["capture_frame"]["file"] == str(path)
    assert doc["numerical"] == []  # rules only: nothing numerical compared


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_fix_exits_0(capsys, name):
    code, doc = check(capsys, f"{EXAMPLES / name}.py:targets_fixed")
    assert code == 0 and doc["findings"] == []
    assert doc["configurations"][0]["checked"]["bare_replays"] == 3


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_findings_do_not_depend_on_rule_order(name):
    import random

    from capturelint.adapters.target import configuration, load_targets
    from capturelint.harness import trace_run
    from capturelint.rules import RULES
    from capturelint.runtime.emulated import emulate_cuda

    def findings(rules):
        c = configuration(load_targets(f"{EXAMPLES / name}.py:targets_bug")[0])
        with emulate_cuda():
            return [f.to_json() for f in trace_run(c.run, c.roots, c.label, rules=rules).findings]

    base = findings(RULES)
    assert [f["code"] for f in base] == [CASES[name][0]]
    for order in [tuple(reversed(RULES)), tuple(random.Random(1).sample(RULES, len(RULES)))]:
        assert findings(order) == base
