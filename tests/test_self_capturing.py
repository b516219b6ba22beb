"""Runtimes that capture CUDA graphs on their own (``torch.compile(mode="reduce-overhead")``
and its kin): a program that uses one gets one line naming the call and its line, the
verdict never says "matches", and a program whose only graphs are theirs is an error
that says so (exit 2), never a clean check."""

from __future__ import annotations

import json
import textwrap

import pytest

from capturelint.cli import main
from capturelint.runtime.unchecked import describe


@pytest.mark.parametrize("kwargs, said", [
    ({"mode": "reduce-overhead"}, "torch.compile(mode='reduce-overhead')"),
    ({"mode": "max-autotune"}, "torch.compile(mode='max-autotune')"),
    ({"options": {"triton.cudagraphs": True}}, "torch.compile(options={'triton.cudagraphs': True})"),
    ({"backend": "cudagraphs"}, "torch.compile(backend='cudagraphs')"),
    ({"mode": "default"}, None),
    ({"mode": "max-autotune-no-cudagraphs"}, None),
    ({"backend": "inductor"}, None),
])
def test_which_compile_calls_capture_on_their_own(kwargs, said):
    assert describe(kwargs.get("mode"), kwargs.get("options"), kwargs.get("backend", "inductor")) == said


PROGRAM = """\
import torch
model = torch.nn.Linear(8, 8).cuda()
fast = torch.compile(torch.nn.Linear(8, 8).cuda(), mode="reduce-overhead")  # COMPILE
{graphs}
"""

GRAPHED = """\
with torch.no_grad():
    g = torch.cuda.make_graphed_callables(model, (torch.zeros(4, 8, device="cuda"),))
    for _ in range(2):
        g(torch.randn(4, 8, device="cuda"))
"""


def run(capsys, tmp_path, monkeypatch, graphs: str) -> tuple[int, str, str]:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prog.py").write_text(PROGRAM.format(graphs=textwrap.dedent(graphs)))
    capsys.readouterr()
    code = main(["run", "prog.py"])
    out, err = capsys.readouterr()
    return code, out, err


def test_graphs_torch_compile_captures_are_named_and_never_called_matching(capsys, tmp_path, monkeypatch):
    code, out, err = run(capsys, tmp_path, monkeypatch, GRAPHED)
    assert code == 0, err
    assert ("script/prog.py: graphs NOT checked: torch.compile(mode='reduce-overhead') at prog.py:3 captures CUDA "
            "graphs on its own") in out
    assert "matches" not in out
    assert out.splitlines()[0].startswith("replay NOT compared with eager in script/prog.py (graphs of 1 "
                                          "self-capturing call not checked)")
    capsys.readouterr()
    assert main(["run", "--format", "json", "prog.py"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["configurations"][0]["checked"]["unchecked_graphs"] == [
        "torch.compile(mode='reduce-overhead') at prog.py:3"]


def test_the_same_program_without_torch_compile_matches(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prog.py").write_text("import torch\nmodel = torch.nn.Linear(8, 8).cuda()\n" + GRAPHED)
    capsys.readouterr()
    assert main(["run", "prog.py"]) == 0
    out = capsys.readouterr().out
    assert "NOT checked" not in out and "replay matches eager execution" in out


def test_a_program_whose_only_graphs_are_torch_compiles_is_an_error_saying_so(capsys, tmp_path, monkeypatch):
    code, out, err = run(capsys, tmp_path, monkeypatch, "")
    assert code == 2 and out == ""
    (line,) = err.splitlines()
    assert line.startswith("capturelint: error: the script prog.py captured no CUDA graph capturelint can check: "
                           "graphs NOT checked: torch.compile(mode='reduce-overhead') at prog.py:3")
