"""Training graphs as plain programs write them, under ``capturelint run``: autograd runs
as the program sets it, PyTorch's documented whole-network capture and a
``make_graphed_callables`` training loop run unmodified and are clean, capturable
optimizers take the emulated device's tensors, and the shadows leave training exactly
where an untraced run leaves it. A failure that comes from a limit of capturelint says
so and names the limit, never blaming the program."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from capturelint.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "plain"


def run(capsys, *args: str) -> tuple[int, dict, str]:
    capsys.readouterr()
    code = main(["run", "--format", "json", *args])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out else {}, err


def write(tmp_path: Path, text: str, name: str = "prog.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize("args", [(), ("--adam",)], ids=["sgd", "adam-capturable"])
def test_pytorchs_whole_network_capture_runs_unmodified_and_is_clean(capsys, args):
    code, doc, err = run(capsys, str(EXAMPLES / "whole_network_training.py"), *args)
    assert code == 0, err
    assert doc["findings"] == []
    losses = [float(line.split()[1]) for line in err.splitlines() if line.startswith("loss ")]
    assert len(losses) == 10 and losses[-1] < losses[0]  # the replays trained the network
    checked = doc["configurations"][0]["checked"]
    assert checked["bare_replays"] == 10


def test_a_make_graphed_callables_training_loop_runs_unmodified_and_is_clean(capsys):
    code, doc, err = run(capsys, str(EXAMPLES / "graphed_training_loop.py"))
    assert code == 0, err
    assert doc["findings"] == []
    checked = doc["configurations"][0]["checked"]
    # 10 steps: module1 and one of module2/module3 each, forwards shadowed, backwards bare
    assert checked["shadowed_steps"] == 20 and checked["bare_replays"] == 20


# Trains the same network graphed and ungraphed and fails (exit 2) unless every
# parameter ends equal: the emulated graphs, and the shadows capturelint runs beside
# the forward replays, must leave parameters, gradients and optimizer state exactly as
# eager training does.
AGREEMENT = """\
import torch

def train(graphed, whole):
    torch.manual_seed(0)
    m1, m2 = torch.nn.Linear(8, 6).cuda(), torch.nn.Linear(6, 4).cuda()
    params = list(m1.parameters()) + list(m2.parameters())
    opt = torch.optim.{optimizer}(params, lr=0.01, capturable=True)
    x = torch.randn(5, 8, device="cuda")
    h = torch.randn(5, 6, device="cuda", requires_grad=True)
    gen = torch.Generator().manual_seed(3)
    batches = [torch.randn(5, 8, generator=gen).cuda() for _ in range(4)]
    if graphed and whole:
        for _ in range(3):  # warm-up: the optimizer's state exists before the capture
            opt.zero_grad(set_to_none=True)
            ((m2(m1(x)) - 1) ** 2).mean().backward()
            opt.step()
        torch.manual_seed(0)
        m1, m2 = torch.nn.Linear(8, 6).cuda(), torch.nn.Linear(6, 4).cuda()
        with torch.no_grad():
            for p, q in zip(params, list(m1.parameters()) + list(m2.parameters())):
                p.copy_(q)
        for state in opt.state.values():
            for v in state.values():
                v.zero_()
        m1, m2 = None, None
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            loss = ((torch.nn.functional.linear(torch.nn.functional.linear(x, params[0], params[1]), params[2], params[3]) - 1) ** 2).mean()
            loss.backward()
            opt.step()
        for b in batches:
            x.copy_(b)
            g.replay()
        return [p.detach().clone() for p in params]
    if graphed:
        m1, m2 = torch.cuda.make_graphed_callables((m1, m2), ((x,), (h,)))
    for b in batches:
        opt.zero_grad(set_to_none=True)
        loss = ((m2(m1(b)) - 1) ** 2).mean()
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in params]

eager = train(False, False)
for whole in (False, True):
    got = train(True, whole)
    err = max((a - b).abs().max().item() for a, b in zip(eager, got))
    print("max parameter difference", whole, err)
    assert err < 1e-6, err
"""


@pytest.mark.parametrize("optimizer", ["Adam", "AdamW"])
def test_graphed_training_ends_where_eager_training_ends(capsys, tmp_path, monkeypatch, optimizer):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, AGREEMENT.replace("{optimizer}", optimizer))
    code, doc, err = run(capsys, "prog.py")
    assert code == 0, err
    assert doc["findings"] == []
    assert err.count("max parameter difference") == 2


def test_a_call_the_emulated_device_does_not_cover_names_the_limit_not_the_script(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, """\
        import torch
        g = torch.Generator(device="cuda")
    """)
    code, doc, err = run(capsys, "prog.py")
    assert code == 2 and doc == {}
    (line,) = err.splitlines()
    assert line == ("capturelint: error: the script prog.py met a limit of capturelint, not a bug of the script: the "
                    "emulated CUDA device does not cover the call at prog.py:2 (Cannot get CUDA generator without "
                    "ATen_cuda library); docs/emulation.md lists what it emulates")


def test_an_error_of_capturelints_own_code_never_blames_the_script(capsys, tmp_path, monkeypatch):
    from capturelint.runtime import cudagraph

    monkeypatch.chdir(tmp_path)
    # A fault inside the emulated runtime's own code (compiled as its file's code)
    broken = eval(compile("lambda *args, **kwargs: {}['boom']", cudagraph.__file__, "eval"))
    monkeypatch.setattr(cudagraph, "poison_freed", broken)
    write(tmp_path, """\
        import torch
        x = torch.zeros(4, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x * 2
        g.replay()
    """)
    code, doc, err = run(capsys, "prog.py")
    assert code == 2
    (line,) = err.splitlines()
    assert line.startswith("capturelint: error: the script prog.py met a limit of capturelint, not a bug of the script: "
                           "capturelint's own code raised KeyError at capturelint/runtime/cudagraph.py:")
    assert "bug of the script" not in line.replace("not a bug of the script", "")


def test_the_scripts_own_error_still_blames_the_script(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, """\
        import torch
        model = torch.nn.Linear(4, 4).cuda()
        model(torch.zeros(2, 5, device="cuda"))
    """)
    code, doc, err = run(capsys, "prog.py")
    assert code == 2
    assert "this is a bug of the script" in err and "limit of capturelint" not in err
