"""CL113 baked-learning-rate, CL114 grad-rebound, CL115 autocast-cache: captured training
steps as plain programs write them, run with ``capturelint run`` (rules only), each with
its hazard, its fixed twin and an edge case; and the worked examples of examples/plain."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from capturelint.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples" / "plain"

STEP = """\
import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 4).cuda()
optimizer = torch.optim.{optimizer}
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
x, y = torch.randn(4, 8, device="cuda"), torch.randn(4, 4, device="cuda")
for _ in range(2):
    optimizer.zero_grad(set_to_none=True)
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
g = torch.cuda.CUDAGraph()
optimizer.zero_grad(set_to_none=True)
with torch.cuda.graph(g):  # CAPTURE
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()  # STEP
for _ in range(3):
{loop}
    g.replay()  # REPLAY
"""


def run(capsys, tmp_path: Path, optimizer: str, loop: str) -> tuple[int, dict, list[str]]:
    path = tmp_path / "prog.py"
    path.write_text(STEP.format(optimizer=optimizer, loop=textwrap.indent(textwrap.dedent(loop), "    ")))
    capsys.readouterr()
    code = main(["run", "--format", "json", str(path)])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out else {"error": err}), path.read_text().splitlines()


def line(lines: list[str], marker: str) -> int:
    return next(i for i, t in enumerate(lines, 1) if marker in t)


FLOAT_LR = "Adam(model.parameters(), lr=0.01, capturable=True)"
TENSOR_LR = "Adam(model.parameters(), lr=torch.tensor(0.01), capturable=True)"


def test_cl113_a_scheduler_changing_a_float_learning_rate_after_capture(capsys, tmp_path):
    code, doc, lines = run(capsys, tmp_path, FLOAT_LR, "scheduler.step()  # SCHEDULE")
    assert code == 1, doc
    (f,) = doc["findings"]
    assert f["code"] == "CL113" and f["tensor"] == "Adam.param_groups[0]['lr']"
    assert f["capture_frame"]["line"] == line(lines, "# STEP")
    assert f["shadow_frame"]["line"] == line(lines, "# SCHEDULE")
    assert "was 0.01 when optimizer.step()" in f["message"] and "is 0.005" in f["message"]
    assert "changed by StepLR.step()" in f["message"]


def test_cl113_a_tensor_learning_rate_is_read_by_every_replay_and_is_clean(capsys, tmp_path):
    code, doc, _ = run(capsys, tmp_path, TENSOR_LR, "scheduler.step()")
    assert code == 0, doc
    assert doc["findings"] == []


def test_cl113_edge_a_rate_set_by_hand_is_found_at_the_replay_and_a_rate_set_back_is_clean(capsys, tmp_path):
    code, doc, lines = run(capsys, tmp_path, FLOAT_LR, "optimizer.param_groups[0]['lr'] = 0.02")
    assert code == 1
    (f,) = doc["findings"]
    assert f["code"] == "CL113" and f["shadow_frame"]["line"] == line(lines, "# REPLAY")
    code, doc, _ = run(capsys, tmp_path, FLOAT_LR, """\
        optimizer.param_groups[0]['lr'] = 0.02
        optimizer.param_groups[0]['lr'] = 0.01""")
    assert code == 0 and doc["findings"] == []


SGD = "SGD(model.parameters(), lr=0.1)"


def test_cl114_zero_grad_after_capture_re_binds_the_captured_grads(capsys, tmp_path):
    code, doc, lines = run(capsys, tmp_path, SGD, "optimizer.zero_grad()  # ZERO")
    assert code == 1, doc
    (f,) = doc["findings"]
    assert f["code"] == "CL114" and f["tensor"] == "model.weight.grad"
    assert f["location"]["line"] == f["shadow_frame"]["line"] == line(lines, "# ZERO")
    assert f["capture_frame"]["line"] == line(lines, "# CAPTURE")
    assert "(and those of 1 more parameter)" in f["message"] and "sees None" in f["message"]


def test_cl114_zero_grad_keeping_the_tensors_is_clean(capsys, tmp_path):
    code, doc, _ = run(capsys, tmp_path, SGD, "optimizer.zero_grad(set_to_none=False)")
    assert code == 0, doc
    assert doc["findings"] == []


def test_cl114_edge_a_grad_set_to_none_by_hand_is_found_at_the_replay(capsys, tmp_path):
    code, doc, lines = run(capsys, tmp_path, SGD, "model.bias.grad = None")
    assert code == 1
    (f,) = doc["findings"]
    assert f["code"] == "CL114" and f["tensor"] == "model.bias.grad"
    assert f["shadow_frame"]["line"] == line(lines, "# REPLAY") and "(and those" not in f["message"]


AUTOCAST = """\
import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 4).cuda()
x = torch.randn(4, 8, device="cuda")
model(x)
g = torch.cuda.CUDAGraph()
{capture}
for _ in range(2):
    x.copy_(torch.randn(4, 8, device="cuda"))
    g.replay()
"""


def run_autocast(capsys, tmp_path: Path, capture: str) -> tuple[int, dict, list[str]]:
    path = tmp_path / "amp.py"
    path.write_text(AUTOCAST.format(capture=textwrap.dedent(capture)))
    capsys.readouterr()
    code = main(["run", "--format", "json", str(path)])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out else {"error": err}), path.read_text().splitlines()


def test_cl115_a_capture_inside_a_cached_autocast_region(capsys, tmp_path):
    code, doc, lines = run_autocast(capsys, tmp_path, """\
        with torch.autocast("cuda", dtype=torch.bfloat16):  # AUTOCAST
            with torch.cuda.graph(g):  # CAPTURE
                y = model(x)""")
    assert code == 1, doc
    assert "CL115" in [f["code"] for f in doc["findings"]]
    f = next(f for f in doc["findings"] if f["code"] == "CL115")
    assert f["capture_frame"]["line"] == line(lines, "# AUTOCAST")
    assert f["shadow_frame"]["line"] == line(lines, "# CAPTURE")
    assert "cache_enabled=False" in f["message"]


def test_cl115_autocast_without_its_cache_is_clean(capsys, tmp_path):
    code, doc, _ = run_autocast(capsys, tmp_path, """\
        with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
            with torch.cuda.graph(g):
                y = model(x)""")
    assert code == 0, doc
    assert doc["findings"] == []


def test_cl115_edge_a_cached_region_entered_inside_the_capture_and_one_closed_before_it(capsys, tmp_path):
    code, doc, lines = run_autocast(capsys, tmp_path, """\
        with torch.cuda.graph(g):
            with torch.autocast("cuda", dtype=torch.bfloat16):  # INSIDE
                y = model(x)""")
    assert code == 1
    assert [f["code"] for f in doc["findings"]] == ["CL115"]
    assert doc["findings"][0]["capture_frame"]["line"] == line(lines, "# INSIDE")
    code, doc, _ = run_autocast(capsys, tmp_path, """\
        with torch.autocast("cuda", dtype=torch.bfloat16):
            model(x)
        with torch.cuda.graph(g):
            y = model(x)""")
    assert code == 0 and doc["findings"] == []


@pytest.mark.parametrize("script, args, codes", [
    ("training_scheduler.py", ("--float-lr",), ["CL113"]),
    ("training_scheduler.py", ("--zero-grad",), ["CL114"]),
    ("training_scheduler.py", (), []),
    ("amp_graphed_step.py", ("--cached-autocast",), ["CL101", "CL104", "CL115"]),
    ("amp_graphed_step.py", (), []),
])
def test_the_worked_examples_exit_as_their_docstrings_say(capsys, script, args, codes):
    path = EXAMPLES / script
    text = path.read_text()
    expected = f"# exit {1 if codes else 0}" + (f", {codes[-1]}" if codes else "")
    assert any(f"{script} {' '.join(args)}".strip() in t and expected in t for t in text.splitlines())
    capsys.readouterr()
    code = main(["run", "--format", "json", str(path), *args])
    doc = json.loads(capsys.readouterr().out)
    assert code == (1 if codes else 0)
    assert sorted(f["code"] for f in doc["findings"]) == codes
