"""CL111 pool-memory-shared: graphs sharing a pool, rules only (no eager twin)."""

import json
import textwrap

from capturelint.cli import main

# PyTorch's "Sharing memory across captures" example, with workloads that free an
# intermediate during g1's capture; {pool} and {replays} vary per test.
DOCS_EXAMPLE = '''
import torch
from capturelint.target import Target

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def g1_workload(x):
    t = x * 2                                   # G1 INTERMEDIATE: freed during g1's capture
    return t + 1


def g2_workload(x):
    return x * 3                                # G2 OUTPUT


class Prog:
    def __init__(self):
        self.static_in_1 = torch.zeros(256, device=DEVICE)
        self.static_in_2 = torch.zeros(256, device=DEVICE)

    def run(self):
        g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(g1):
            self.static_out_1 = g1_workload(self.static_in_1)
        with torch.cuda.graph(g2{pool}):        # CAPTURE G2
            self.static_out_2 = g2_workload(self.static_in_2)
        gen = torch.Generator().manual_seed(0)
        outs = []
        for _ in range(3):
            self.static_in_1.copy_(torch.randn(256, generator=gen))
            self.static_in_2.copy_(torch.randn(256, generator=gen))
{replays}
        return outs


def targets():
    prog = Prog()
    return [Target(run=prog.run, roots={{"prog": prog}}, runner="torch", mode="cudagraph")]
'''

IN_ORDER = '''\
            g1.replay()
            g2.replay()
            outs.append(self.static_out_1 + self.static_out_2)'''
OUT_OF_ORDER = '''\
            g2.replay()
            g1.replay()                                          # REPLAY G1
            outs.append(self.static_out_1 + self.static_out_2)   # READ'''


def check(tmp_path, capsys, source: str):
    path = tmp_path / "prog.py"
    path.write_text(textwrap.dedent(source))
    code = main(["check", "--target", f"{path}:targets", "--format", "json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out else None), err, path.read_text().splitlines()


def line_of(lines, needle):
    return next(i for i, text in enumerate(lines, 1) if needle in text)


def test_docs_example_replayed_out_of_capture_order(tmp_path, capsys):
    code, doc, err, lines = check(tmp_path, capsys, DOCS_EXAMPLE.format(pool=", pool=g1.pool()", replays=OUT_OF_ORDER))
    assert code == 1, err
    assert [f["code"] for f in doc["findings"]] == ["CL111"]
    f = doc["findings"][0]
    assert f["tensor"] == "prog.static_out_2" and f["op"] == "aten.mul.Tensor"
    assert f["capture_frame"]["line"] == line_of(lines, "# G2 OUTPUT")
    assert f["shadow_frame"]["line"] == line_of(lines, "# REPLAY G1")
    assert f["graph"] == f"cudagraph@{tmp_path / 'prog.py'}:{line_of(lines, '# CAPTURE G2')}"
    message = f["message"]
    assert f"prog.py:{line_of(lines, '# G1 INTERMEDIATE')}" in message  # the block g1's capture freed
    assert f"aten.add.Tensor at {tmp_path / 'prog.py'}:{line_of(lines, '# READ')} read them" in message
    assert "overwrote 1024 bytes" in message
    assert f["occurrences"] == 3  # every step read the overwritten output


def test_docs_example_replayed_in_capture_order_is_clean(tmp_path, capsys):
    code, doc, err, _ = check(tmp_path, capsys, DOCS_EXAMPLE.format(pool=", pool=g1.pool()", replays=IN_ORDER))
    assert code == 0, doc["findings"] if doc else err


def test_graphs_in_separate_pools_replayed_out_of_order_are_clean(tmp_path, capsys):
    code, doc, err, _ = check(tmp_path, capsys, DOCS_EXAMPLE.format(pool="", replays=OUT_OF_ORDER))
    assert code == 0, doc["findings"] if doc else err


def test_an_output_kept_past_the_next_steps_replay_in_capture_order(tmp_path, capsys):
    # edge: capture order every step, but g2's output is consumed one step late
    # (double buffering), after the next step's g1 replay rewrote it
    pipelined = '''\
            g1.replay()                                          # REPLAY G1
            if pending is not None:
                outs.append(pending * 1)                         # READ
            g2.replay()
            pending = self.static_out_2'''
    source = DOCS_EXAMPLE.format(pool=", pool=g1.pool()", replays=pipelined).replace(
        "outs = []", "outs, pending = [], None")
    code, doc, err, lines = check(tmp_path, capsys, source)
    assert code == 1, err
    f = doc["findings"][0]
    assert (f["code"], f["tensor"], f["shadow_frame"]["line"]) == ("CL111", "prog.static_out_2", line_of(lines, "# REPLAY G1"))
    assert f"aten.mul.Tensor at {tmp_path / 'prog.py'}:{line_of(lines, '# READ')}" in f["message"]


def test_consuming_each_output_before_the_other_graph_replays_is_clean(tmp_path, capsys):
    consumed = '''\
            g2.replay()
            out2 = self.static_out_2.clone()
            g1.replay()
            outs.append(self.static_out_1 + out2)'''
    code, doc, err, _ = check(tmp_path, capsys, DOCS_EXAMPLE.format(pool=", pool=g1.pool()", replays=consumed))
    assert code == 0, doc["findings"] if doc else err


def test_a_third_graphs_replay_reads_the_overwritten_output(tmp_path, capsys):
    # edge: the read is another graph's replay, not eager code
    source = DOCS_EXAMPLE.format(pool=", pool=g1.pool()", replays='''\
            g2.replay()
            g1.replay()
            g3.replay()                                          # READ BY G3
            outs.append(self.static_out_3 * 1)''').replace(
        "        gen = torch.Generator()", '''\
        g3 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g3):
            self.static_out_3 = self.static_out_2 - 1
        gen = torch.Generator()''')
    code, doc, err, lines = check(tmp_path, capsys, source)
    assert code == 1, err
    f = doc["findings"][0]
    assert (f["code"], f["tensor"]) == ("CL111", "prog.static_out_2")
    assert "the replay of graph cudagraph@" in f["message"]
    assert f"prog.py:{line_of(lines, '# READ BY G3')} (aten.sub.Tensor)" in f["message"]


GRAPHED_TUPLE = '''
import torch
from torch import nn
from capturelint.target import Target

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def targets():
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16)).to(DEVICE)
    b = nn.Sequential(nn.Linear(16, 16), nn.Tanh()).to(DEVICE)
    x = torch.randn(4, 16, device=DEVICE)

    def run():
        with torch.no_grad():
            fa, fb = torch.cuda.make_graphed_callables((a, b), ((x,), (x,)))  # one shared pool
            outs = []
            for i in range(3):
                y = torch.randn(4, 16)
                {calls}
        return outs

    return [Target(run=run, roots={{"a": a, "b": b}}, runner="torch", mode="graphed")]
'''


def test_graphed_callables_of_one_tuple_called_out_of_order(tmp_path, capsys):
    calls = "yb = fb(y)\n                ya = fa(y)\n                outs.append(yb + ya)"
    code, doc, err, _ = check(tmp_path, capsys, GRAPHED_TUPLE.format(calls=calls))
    assert code == 1, err
    assert {f["code"] for f in doc["findings"]} == {"CL111"}


def test_graphed_callables_of_one_tuple_called_in_order_are_clean(tmp_path, capsys):
    calls = "ya = fa(y)\n                yb = fb(y)\n                outs.append(yb + ya)"
    code, doc, err, _ = check(tmp_path, capsys, GRAPHED_TUPLE.format(calls=calls))
    assert code == 0, doc["findings"] if doc else err
