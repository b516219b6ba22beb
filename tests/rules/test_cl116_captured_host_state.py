"""CL116 captured-host-state: a captured forward that stores a tensor it computed on a
Python attribute or container (``self.hidden = h``, ``cache.append(k)``), run as a plain
program with ``capturelint run`` (rules only): the hazard, its fixed twins and the edges
(a container the program empties; a slot only read after replays, not reported)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from capturelint.cli import main

PROGRAM = """\
import torch

torch.manual_seed(0)
cache = []


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.hidden = None

    def forward(self, x):
        h = torch.tanh(self.lin(x))
{store}
        return h * 2


net = Net().cuda()
static_x = torch.randn(4, 8, device="cuda")
seen = []
with torch.no_grad():
    net(static_x)
    cache.clear()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):  # CAPTURE
        static_y = net(static_x)
    for _ in range(3):
{loop}
        static_x.copy_(torch.randn(4, 8, device="cuda"))
        g.replay()  # REPLAY
{read}
"""


def run(capsys, tmp_path: Path, store: str, loop: str = "pass", read: str = "seen.append(static_y.clone())"):
    path = tmp_path / "prog.py"
    path.write_text(PROGRAM.format(store=textwrap.indent(store, " " * 8), loop=textwrap.indent(loop, " " * 8),
                                   read=textwrap.indent(read, " " * 8)))
    capsys.readouterr()
    code = main(["run", "--format", "json", str(path)])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out else {"error": err}), path.read_text().splitlines()


def line(lines: list[str], marker: str) -> int:
    return next(i for i, t in enumerate(lines, 1) if marker in t)


def cl116(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["code"] == "CL116"]


def test_an_attribute_the_captured_forward_stored_then_re_bound_and_read_after_a_replay(capsys, tmp_path):
    code, doc, lines = run(capsys, tmp_path, "self.hidden = h  # STORE",
                           loop='net.hidden = torch.zeros(4, 8, device="cuda")  # REBIND',
                           read="seen.append(net.hidden.clone())")
    assert code == 1, doc
    (f,) = doc["findings"]
    assert f["code"] == "CL116" and f["tensor"] == "net.hidden"
    assert (f["capture_frame"]["function"], f["capture_frame"]["line"]) == ("forward", line(lines, "# STORE"))
    assert f["shadow_frame"]["line"] == line(lines, "# REBIND")
    assert f"net.hidden was filled at {f['capture_frame']['file']}:{line(lines, '# STORE')} by" in f["message"]
    assert f"re-bound at {f['shadow_frame']['file']}:{line(lines, '# REBIND')} (before replay 1)" in f["message"]


def test_fixed_twins_refresh_in_place_or_read_the_static_output_are_clean(capsys, tmp_path):
    # the captured tensor kept and reset in place: the graph writes what the program reads
    code, doc, _ = run(capsys, tmp_path, "self.hidden = h", loop="net.hidden.zero_()",
                       read="seen.append(net.hidden.clone())")
    assert code == 0 and cl116(doc) == [], doc
    # the value copied out inside the capture is still the capture's tensor, but it is only read: clean
    code, doc, _ = run(capsys, tmp_path, "self.hidden = h.clone()", read="seen.append(net.hidden.clone())")
    assert code == 0 and cl116(doc) == [], doc
    # the program's own handle (static_y, bound in the with block) re-bound after use is not the captured code's
    code, doc, _ = run(capsys, tmp_path, "pass", read="seen.append(static_y.clone())\nstatic_y = static_y * 1")
    assert cl116(doc) == [], doc


def test_edge_a_container_the_captured_forward_appended_to_and_the_program_emptied(capsys, tmp_path):
    code, doc, lines = run(capsys, tmp_path, "cache.append(h)  # STORE", loop="cache.clear()  # EMPTY",
                           read="seen.append(len(cache))")
    assert code == 1, doc
    (f,) = cl116(doc)
    assert f["tensor"] == "cache[0]" and "was removed at" in f["message"]
    assert f["capture_frame"]["line"] == line(lines, "# STORE")
    # no assignment re-bound a list slot: the finding points at the replay that followed
    assert f["shadow_frame"]["line"] == line(lines, "# REPLAY")


def test_edge_a_slot_only_read_after_replays_is_not_reported(capsys, tmp_path):
    # each read sees the latest replay's values, as eager execution would: not CL116's hazard
    code, doc, _ = run(capsys, tmp_path, "cache.append(h)\nself.hidden = h",
                       read="seen.append(net.hidden.clone())\nseen.append(cache[0].clone())")
    assert code == 0 and cl116(doc) == [], doc
