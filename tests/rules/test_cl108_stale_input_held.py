"""CL108: a bare graph's input holder re-bound while the captured tensor stays alive."""

from __future__ import annotations

from bare_programs import check, codes, line_of, write

RUNNER = """
class Runner:
    def __init__(self, in_place, keep):
        torch.manual_seed(0)
        self.in_place = in_place
        self.model = nn.Linear(4, 4).to(DEV).eval()
        self.static_x = torch.zeros(2, 4, device=DEV)
        self.inputs = [self.static_x] if keep else []

    @torch.no_grad()
    def serve(self):
        self.model(self.static_x)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_y = self.model(self.static_x)
        outs = []
        for step in range(3):
            batch = torch.full((2, 4), float(step), device=DEV)
            if self.in_place:
                self.static_x.copy_(batch)
            else:
                self.static_x = batch + 0
            self.graph.replay()
            outs.append(self.static_y.clone())
        return outs


def targets():
    return Target(run=Runner(in_place=False, keep=True).serve, runner="plain", mode="graph")


def fixed():
    return Target(run=Runner(in_place=True, keep=True).serve, runner="plain", mode="graph")


def freed():
    return Target(run=Runner(in_place=False, keep=False).serve, runner="plain", mode="graph")
"""


def test_a_rebound_attribute_whose_captured_tensor_a_list_keeps_is_named(tmp_path, capsys):
    path = write(tmp_path, RUNNER)
    code, doc = check(capsys, path)
    assert code == 1 and codes(doc) == ["CL108"]
    (f,) = doc["findings"]
    assert (f["tensor"], f["op"], f["condition"]) == ("runner.static_x", "aten.addmm.default", "R4")
    assert f["capture_frame"]["line"] == line_of(path, "self.static_y = self.model(self.static_x)")
    assert f["shadow_frame"]["line"] == line_of(path, "self.static_x = batch + 0")  # the re-binding line
    assert f["allocation_frame"]["line"] == line_of(path, "self.static_x = batch + 0")
    assert f["location"] == {**f["shadow_frame"], "role": "re-binding"}  # the line to change
    assert "held by runner.inputs[0]" in f["message"] and "float32[2, 4]" in f["message"]
    assert f"replay 1 (at {f['shadow_frame']['file']}:{line_of(path, 'self.graph.replay()')})" in f["message"]
    assert f["steps"] == [1] and doc["numerical"] == []  # rules only, no eager twin: nothing numerical compared


def test_the_fixed_twin_refreshing_in_place_is_clean(tmp_path, capsys):
    code, doc = check(capsys, write(tmp_path, RUNNER), "fixed")
    assert code == 0 and doc["findings"] == []


def test_a_captured_tensor_nothing_holds_any_more_is_cl104_not_cl108(tmp_path, capsys):
    code, doc = check(capsys, write(tmp_path, RUNNER), "freed")
    assert code == 1 and codes(doc) == ["CL104"]
    assert doc["findings"][0]["tensor"] == "runner.static_x"  # named without roots, by the capture's holders
    # found as CL108 finds it, though the old tensor is gone: the re-binding is the line to change
    assert doc["findings"][0]["location"]["line"] == line_of(tmp_path / "prog.py", "self.static_x = batch + 0")
    assert doc["findings"][0]["location"]["role"] == "re-binding"


def test_a_rebound_name_whose_captured_tensor_is_still_refreshed_in_place_is_clean(tmp_path, capsys):
    # The program re-binds the attribute, but writes each batch into the captured tensor
    # too (through the list that holds it): the graph reads the right values.
    path = write(tmp_path, RUNNER.replace("self.static_x = batch + 0", "self.static_x = batch + 0\n"
                                          "                self.inputs[0].copy_(batch)"))
    code, doc = check(capsys, path)
    assert code == 0 and doc["findings"] == []


def test_a_local_rebound_while_a_closure_keeps_the_captured_tensor(tmp_path, capsys):
    path = write(tmp_path, """
    def probe_of(t):
        return lambda: t.sum()


    @torch.no_grad()
    def serve():
        w = torch.ones(4, device=DEV)
        x = torch.zeros(4, device=DEV)
        probe = probe_of(x)  # its closure keeps the captured tensor alive
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x * w
        outs = []
        for step in range(2):
            x = torch.full((4,), float(step), device=DEV)
            g.replay()
            outs.append(y.clone())
        return outs


    def targets():
        return Target(run=serve, runner="plain", mode="graph")
    """)
    code, doc = check(capsys, path)
    assert code == 1 and codes(doc) == ["CL108"]
    (f,) = doc["findings"]
    assert f["tensor"] == "local x of serve()" and f["op"] == "aten.mul.Tensor"
    assert f["shadow_frame"]["line"] == line_of(path, "x = torch.full((4,), float(step), device=DEV)")
    assert f["capture_frame"]["line"] == line_of(path, "y = x * w")
    assert "held by closure variable t of probe_of.<locals>.<lambda>()" in f["message"]


def test_a_parameter_replaced_after_make_graphed_callables_is_the_shadows_location_mismatch(tmp_path, capsys):
    # make_graphed_callables keeps the module's parameters alive (its static input
    # surface, as torch's does): re-binding the weight frees nothing and the graph keeps
    # the old one. A graphed callable's calls are shadowed, so the shadow reads the new
    # weight where the graph reads the old: CL104 (R4, with the step's line), which
    # explains the twin's divergence (not CL901); CL108 is for graphs without a shadow.
    path = write(tmp_path, """
    def make():
        torch.manual_seed(0)
        return nn.Linear(4, 4).to(DEV).eval()


    @torch.no_grad()
    def serve():
        model = make()
        graphed = torch.cuda.make_graphed_callables(model, (torch.zeros(2, 4, device=DEV),))
        outs = [graphed(torch.ones(2, 4, device=DEV)).clone()]
        model.weight = nn.Parameter(model.weight * 2)  # new weights, by re-binding
        outs.append(graphed(torch.ones(2, 4, device=DEV)).clone())
        return outs


    @torch.no_grad()
    def eager():
        model = make()
        out = [model(torch.ones(2, 4, device=DEV))]
        model.weight = nn.Parameter(model.weight * 2)
        return out + [model(torch.ones(2, 4, device=DEV))]


    def targets():
        return Target(run=serve, eager=eager, runner="plain", mode="graph")
    """)
    code, doc = check(capsys, path)
    assert code == 1 and codes(doc) == ["CL104"]
    (f,) = doc["findings"]
    assert f["steps"] == [2]  # (unnamed: the graphed callable's holders are not discovered yet; no roots given)
    assert f["shadow_frame"]["line"] == line_of(path, "outs.append(graphed(torch.ones(2, 4, device=DEV)).clone())")
    assert doc["numerical"][0]["max_logit_error"] > 0.1  # the twin diverges; CL108 explains it


def test_a_global_of_a_script_rebound_while_a_global_list_keeps_the_captured_tensor(tmp_path, capsys):
    # Module-level code, as a script runs: the holder is a global, its re-binding line
    # is found in the module's source.
    script = write(tmp_path, """
    w = torch.ones(4, device=DEV)
    static_x = torch.zeros(4, device=DEV)
    seen = [static_x]
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        static_y = static_x * w
    outs = []
    for i in range(2):
        static_x = torch.full((4,), float(i), device=DEV)
        g.replay()
        outs.append(static_y.clone())
    """, name="script.py")
    target = write(tmp_path, f"""
    import runpy


    def targets():
        return Target(run=lambda: runpy.run_path({str(script)!r})["outs"], runner="script", mode="graph")
    """, name="target.py")
    code, doc = check(capsys, target)
    assert code == 1 and codes(doc) == ["CL108"]
    (f,) = doc["findings"]
    assert f["tensor"] == "global static_x of module <run_path>" and "held by seen[0]" in f["message"]
    assert f["shadow_frame"]["line"] == line_of(script, "static_x = torch.full((4,), float(i), device=DEV)")
