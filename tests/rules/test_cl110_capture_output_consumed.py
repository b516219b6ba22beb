"""CL110: what a bare graph's capture returned, used before any replay computed it."""

from __future__ import annotations

from bare_programs import check, codes, line_of, write

LAZY = """
class Lazy:
    def __init__(self, mode):
        torch.manual_seed(0)
        self.mode = mode
        self.model = nn.Linear(4, 4).to(DEV).eval()
        self.static_x = torch.zeros(2, 4, device=DEV)
        self.graph = None

    @torch.no_grad()
    def step(self, x):
        self.static_x.copy_(x)
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.static_y = self.model(self.static_x)
            if self.mode == "bug":
                return self.static_y.softmax(-1)  # the capture ran nothing
            if self.mode == "overwrite":  # computed eagerly into the output buffer first
                self.static_y.copy_(self.model(self.static_x))
                return self.static_y.softmax(-1)
            if self.mode == "shape":  # only its size, dtype and device are read
                return torch.zeros_like(self.static_y)
        self.graph.replay()
        return self.static_y.softmax(-1)

    def serve(self):
        return [self.step(torch.full((2, 4), float(i), device=DEV)) for i in range(3)]

    @torch.no_grad()
    def eager(self):
        return [self.model(torch.full((2, 4), float(i), device=DEV)).softmax(-1) for i in range(3)]


def targets():
    return Target(run=Lazy("bug").serve, runner="plain", mode="graph")


def fixed():
    return Target(run=Lazy("replay").serve, runner="plain", mode="graph")


def edges():
    return [Target(run=Lazy(m).serve, runner="plain", mode=m) for m in ("overwrite", "shape")]


def with_twin():
    lazy = Lazy("bug")
    return Target(run=lazy.serve, eager=lazy.eager, runner="plain", mode="graph")
"""


def test_the_capturing_calls_result_returned_as_the_first_step(tmp_path, capsys):
    path = write(tmp_path, LAZY)
    code, doc = check(capsys, path)
    assert code == 1 and codes(doc) == ["CL110"]
    (f,) = doc["findings"]
    assert (f["tensor"], f["op"], f["condition"]) == ("lazy.static_y", "aten._softmax.default", "R7")
    assert f["capture_frame"]["line"] == line_of(path, "self.static_y = self.model(self.static_x)")
    assert f["shadow_frame"]["line"] == line_of(path, "return self.static_y.softmax(-1)  # the capture")
    assert f"graph cudagraph@{f['capture_frame']['file']}:{line_of(path, 'with torch.cuda.graph')}" in f["message"]
    assert doc["numerical"] == []  # rules only: nothing numerical was compared


def test_replaying_after_the_capture_is_clean(tmp_path, capsys):
    code, doc = check(capsys, write(tmp_path, LAZY), "fixed")
    assert code == 0 and doc["findings"] == []


def test_an_output_written_eagerly_first_or_read_for_its_shape_only_is_clean(tmp_path, capsys):
    code, doc = check(capsys, write(tmp_path, LAZY), "edges")
    assert code == 0 and doc["findings"] == [] and len(doc["configurations"]) == 2


def test_with_an_eager_twin_the_divergence_is_cl110_not_cl901(tmp_path, capsys):
    code, doc = check(capsys, write(tmp_path, LAZY), "with_twin")
    assert code == 1 and codes(doc) == ["CL110"]
    assert doc["numerical"][0]["max_logit_error"] == "inf"  # the NaN the capture returned


BREAKABLE = """
from capturelint.runtime.breakable import CUDAGraphWrapper
from capturelint.runtime.forward_context import BatchDescriptor, CUDAGraphMode, set_forward_context


class Served(nn.Module):
    def __init__(self, mode):
        super().__init__()
        torch.manual_seed(0)
        self.mode = mode
        self.lin = nn.Linear(8, 8)
        self.input = torch.zeros(4, 8)
        self.wrapper = CUDAGraphWrapper(self)

    def forward(self, x):
        return torch.relu(self.lin(x))  # @produce

    def run(self, graphs=True):
        outs = []
        with torch.no_grad():
            if self.mode in ("warm", "peek") and graphs:  # a capture pass whose output is discarded
                with set_forward_context({}, CUDAGraphMode.FULL, BatchDescriptor(4, False)):
                    warm = self.wrapper(self.input)
                if self.mode == "peek":
                    warm[0].sum()  # @peek: read, as vLLM's dummy run indexes it, and dropped
            for step in range(3):
                self.input.copy_(torch.randn(4, 8, generator=torch.Generator().manual_seed(step)))
                mode = CUDAGraphMode.FULL if graphs else CUDAGraphMode.NONE
                with set_forward_context({}, mode, BatchDescriptor(4, False)):
                    y = self.wrapper(self.input)  # the first call captures
                outs.append(y.sum())  # @read
        return outs


def targets(mode="lazy"):
    m, e = Served(mode), Served(mode)
    return [Target(run=lambda: m.run(True), roots={"model": m}, runner="served", mode="FULL",
                   eager=lambda: e.run(False))]


def targets_warm():
    return targets("warm")


def targets_peek_drift():  # the capture pass's output read and dropped; the run drifts for another reason
    m, e = Served("peek"), Served("peek")
    return [Target(run=lambda: m.run(True), roots={"model": m}, runner="served", mode="FULL",
                   eager=lambda: [o + 1 for o in e.run(False)])]


def targets_no_twin():
    m = Served("lazy")
    return [Target(run=lambda: m.run(True), roots={"model": m}, runner="served", mode="FULL")]
"""


def test_a_breakable_graphs_capture_output_used_as_a_result_is_cl110_not_cl901(tmp_path, capsys):
    path = write(tmp_path, BREAKABLE)
    code, doc = check(capsys, path)
    assert code == 1
    assert codes(doc) == ["CL110"]
    (f,) = doc["findings"]
    assert f["shadow_frame"]["line"] == line_of(path, "outs.append(y.sum())")
    assert f["capture_frame"]["line"] == line_of(path, "return torch.relu(self.lin(x))")


def test_a_breakable_graph_captured_in_a_warm_up_pass_is_clean(tmp_path, capsys):
    path = write(tmp_path, BREAKABLE)
    code, doc = check(capsys, path, "targets_warm")
    assert code == 0, doc["findings"]
    assert doc["findings"] == []


def test_edge_a_breakable_graphs_capture_output_read_without_reaching_a_result_is_not_reported(tmp_path, capsys):
    """Engines read a capture pass's outputs knowingly and discard them (vLLM's dummy
    runs): on a breakable graph the read counts only where the run's result diverged
    from its eager twin; without a twin there is nothing to say it reached a result."""
    path = write(tmp_path, BREAKABLE)
    code, doc = check(capsys, path, "targets_no_twin")
    assert code == 0, doc["findings"]
    assert doc["findings"] == []


DUMMY = """
class Dummy:
    def __init__(self, mode):
        torch.manual_seed(0)
        self.mode = mode
        self.model = nn.Linear(4, 4).to(DEV).eval()
        self.static_x = torch.zeros(2, 4, device=DEV)
        self.last = torch.tensor([1], device=DEV)
        self.graph = None

    @torch.no_grad()
    def step(self, x):
        self.static_x.copy_(x)
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.static_y = self.model(self.static_x)
            picked = self.static_y[self.last]  # a dummy run indexes the capture's output
            if self.mode == "returned":
                return picked.softmax(-1)
        self.graph.replay()
        return self.static_y[self.last].softmax(-1)

    def serve(self):
        return [self.step(torch.full((2, 4), float(i), device=DEV)) for i in range(3)]

    @torch.no_grad()
    def eager(self):
        return [self.model(torch.full((2, 4), float(i), device=DEV))[self.last].softmax(-1) for i in range(3)]


def twin(mode):
    graphed, eager = Dummy(mode), Dummy(mode)
    return Target(run=graphed.serve, eager=eager.eager, runner="plain", mode="graph")


def discarded():
    return twin("discarded")


def returned():
    return twin("returned")


def discarded_no_twin():
    return Target(run=Dummy("discarded").serve, runner="plain", mode="graph")
"""


def test_a_bare_capture_output_indexed_and_discarded_is_clean_where_the_eager_twin_agrees(tmp_path, capsys):
    """The emulator poisons what the capture returned (NaN): a twin that agrees shows the
    indexed value never reached the result, as in vLLM V1's ``_dummy_run``."""
    code, doc = check(capsys, write(tmp_path, DUMMY), "discarded")
    assert code == 0, doc["findings"]
    assert doc["findings"] == []
    (n,) = doc["numerical"]
    assert n["max_logit_error"] == 0.0 and n["replay_steps"] == 3  # compared with the twin, and equal


def test_the_same_indexed_value_returned_as_the_first_steps_result_is_cl110(tmp_path, capsys):
    path = write(tmp_path, DUMMY)
    code, doc = check(capsys, path, "returned")
    assert code == 1 and codes(doc) == ["CL110"]
    (f,) = doc["findings"]
    assert f["shadow_frame"]["line"] == line_of(path, "picked = self.static_y[self.last]")
    assert doc["numerical"][0]["max_logit_error"] == "inf"  # the poisoned value reached the result


def test_edge_a_bare_capture_output_read_without_an_eager_twin_is_still_cl110(tmp_path, capsys):
    """Without a twin nothing shows the value was dropped: a bare graph's read is reported."""
    path = write(tmp_path, DUMMY)
    code, doc = check(capsys, path, "discarded_no_twin")
    assert code == 1 and codes(doc) == ["CL110"]
    assert doc["findings"][0]["shadow_frame"]["line"] == line_of(path, "picked = self.static_y[self.last]")


def test_edge_a_breakable_graphs_dropped_read_is_not_blamed_for_a_finite_divergence(tmp_path, capsys):
    """The poison (NaN) never reached the result: the run's finite divergence has another
    cause (here the twin's own +1), which the numerical oracle reports, not CL110."""
    code, doc = check(capsys, write(tmp_path, BREAKABLE), "targets_peek_drift")
    assert code == 1 and codes(doc) == ["CL901"], doc["findings"]
    assert doc["numerical"][0]["max_logit_error"] == 1.0
