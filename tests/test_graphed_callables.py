"""Graphed callables (``torch.cuda.make_graphed_callables``) are shadowed: rules only.

A graphed callable keeps its Python, so every call (a replay) is checked against an
eager run of the callable on the call's arguments, as a breakable graph's steps are:
the CL101-CL104 family applies. The programs are written for a GPU (``.cuda()``,
``device="cuda"``), written to ``tmp_path`` and checked with ``check --target`` with no
eager twin; each finding names the graph and the program's own lines (marked ``# @``).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from capturelint.cli import main
from capturelint.runtime.emulated import emulate_cuda

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "plain" / "graphed_callable_baked_value.py"

PROGRAM = '''
    """Graphed callables written for a GPU, each target with one hazard or none."""
    import torch
    from torch import nn

    from capturelint.target import Target

    STEPS = 4


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 16)
            self.register_buffer("bias", torch.zeros(16))
            self.scale = 1.0
            self.step = 0

        def forward(self, x):
            h = self.lin(x) * self.scale  # @scale
            if self.step % 2:
                h = torch.relu(h)  # @relu
            return h + self.bias  # @bias


    class ArgNet(Net):
        def forward(self, x, scale):
            return self.lin(x) * scale + self.bias


    class Counted(nn.Module):
        def __init__(self, in_math):
            super().__init__()
            self.lin = nn.Linear(16, 16)
            self.in_math = in_math
            self.calls = 0
            self.seen = []

        def forward(self, x):
            self.calls += 1
            self.seen.append(self.calls)
            h = self.lin(x)
            return h * self.calls if self.in_math else h  # @calls


    def batches(rows=8):
        g = torch.Generator().manual_seed(1)
        return [torch.randn(rows, 16, generator=g).cuda() for _ in range(STEPS)]


    def serve(change=None):
        torch.manual_seed(0)
        model = Net().cuda().eval()

        def run():
            nonlocal model
            with torch.no_grad():
                model = torch.cuda.make_graphed_callables(model, (torch.zeros(8, 16, device="cuda"),))  # @graphed
                out = []
                for i, x in enumerate(batches()):
                    if change is not None:
                        change(model, i)
                    out.append(model(x).clone())
                return out

        return Target(run=run, roots={"model": model}, runner="plain", mode="graphed")


    def set_scale(model, i):
        model.scale = 1.0 + i


    def replace_bias(model, i):
        model.bias = torch.full((16,), float(i), device="cuda")  # @replace


    def set_step(model, i):
        model.step = i


    def per_step_scale():
        return serve(set_scale)


    def replaced_buffer():
        return serve(replace_bias)


    def branch_on_step():
        return serve(set_step)


    def scale_as_argument():
        torch.manual_seed(0)
        model = ArgNet().cuda().eval()

        def run():
            with torch.no_grad():
                sample = (torch.zeros(8, 16, device="cuda"), torch.ones((), device="cuda"))
                graphed = torch.cuda.make_graphed_callables(model, sample)
                return [graphed(x, torch.tensor(1.0 + i, device="cuda")).clone() for i, x in enumerate(batches())]

        return Target(run=run, roots={"model": model})


    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 4)
            self.scale = 1.0

        def forward(self, x):
            return torch.tanh(self.lin(x)) * self.scale  # @pair-scale


    def pair(rescale):
        torch.manual_seed(0)
        first, second = nn.Linear(16, 16).cuda(), Scaled().cuda()

        def run():
            with torch.no_grad():
                pool = torch.cuda.graph_pool_handle()
                samples = ((torch.zeros(8, 16, device="cuda"),), (torch.zeros(8, 16, device="cuda"),))
                a, b = torch.cuda.make_graphed_callables((first, second), samples, pool=pool)  # @pair
                out = []
                for i, x in enumerate(batches()):
                    if rescale:
                        second.scale = 1.0 + i
                    out.append(b(a(x)).clone())
                return out

        return Target(run=run, roots={"first": first, "second": second})


    def pair_clean():
        return pair(False)


    def pair_rescaled():
        return pair(True)


    def scaled(x, s):
        return x * s


    def float_sample():
        def run():
            with torch.no_grad():
                graphed = torch.cuda.make_graphed_callables(scaled, (torch.zeros(4, device="cuda"), 0.5))  # @float-sample
                return [graphed(torch.ones(4, device="cuda"), 0.5)]

        return Target(run=run)


    def float_call():
        def run():
            with torch.no_grad():
                graphed = torch.cuda.make_graphed_callables(scaled, (torch.zeros(4), torch.ones((), device="cuda")))
                return [graphed(torch.ones(4, device="cuda"), 0.5)]  # @float-call

        return Target(run=run)


    def affine(x, params):
        w, b = params
        return x * w + b


    def nested_tensor_arguments():
        def run():
            with torch.no_grad():
                zero = torch.zeros((), device="cuda")
                graphed = torch.cuda.make_graphed_callables(affine, (torch.zeros(8, 16, device="cuda"), (zero, zero)))
                out = []
                for i, x in enumerate(batches()):
                    params = (torch.tensor(1.0 + i, device="cuda"), torch.tensor(float(i), device="cuda"))
                    out.append(graphed(x, params).clone())
                return out

        return Target(run=run)


    def smaller_batch():
        torch.manual_seed(0)
        lin = nn.Linear(16, 4).cuda()

        def run():
            with torch.no_grad():
                graphed = torch.cuda.make_graphed_callables(lin, (torch.zeros(8, 16, device="cuda"),))  # @smaller
                return [graphed(x).clone() for x in batches(rows=1)]

        return Target(run=run, roots={"lin": lin})


    def counter(in_math):
        torch.manual_seed(0)
        model = Counted(in_math).cuda().eval()

        def run():
            with torch.no_grad():
                graphed = torch.cuda.make_graphed_callables(model, (torch.zeros(8, 16, device="cuda"),))
                out = [graphed(x).clone() for x in batches()]
            # Replays run no Python: the count stays where warm-up and capture left it.
            assert (model.calls, model.seen) == (4, [1, 2, 3, 4]), f"host state changed: {model.calls}, {model.seen}"
            return out

        return Target(run=run, roots={"model": model})


    def counted():
        return counter(False)


    def counted_in_math():
        return counter(True)
'''


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("graphed") / "graphed_program.py"
    path.write_text(textwrap.dedent(PROGRAM))
    return path


def line(path: Path, marker: str) -> int:
    """The line of ``path`` marked ``# @marker``."""
    lines = [i for i, text in enumerate(path.read_text().splitlines(), 1) if text.endswith(f"# @{marker}")]
    assert len(lines) == 1, marker
    return lines[0]


def check(capsys, target: str) -> tuple[int, dict, str]:
    code = main(["check", "--target", target, "--format", "json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code in (0, 1) else {}), err


def where(frame: dict) -> tuple[str, int]:
    return Path(frame["file"]).name, frame["line"]


def only_finding(doc: dict) -> dict:
    assert len(doc["findings"]) == 1, [f["code"] for f in doc["findings"]]
    return doc["findings"][0]


def graph_label(path: Path, marker: str, name: str) -> str:
    return f"graphed {name}@{path}:{line(path, marker)}"


# ================================================================= hazards


def test_a_per_step_float_read_from_a_module_attribute_is_baked(capsys, program):
    code, doc, _ = check(capsys, f"{program}:per_step_scale")
    f = only_finding(doc)
    assert code == 1
    assert (f["code"], f["op"], f["tensor"]) == ("CL102", "aten.mul.Tensor", "argument other")
    assert f["graph"].startswith("graphed Net@") and f["graph"].endswith(f"graphed_program.py:{line(program, 'graphed')}")
    assert where(f["capture_frame"]) == where(f["shadow_frame"]) == (program.name, line(program, "scale"))
    assert f["steps"] == [2, 3, 4]  # step 1 runs with the capture's scale
    assert "recorded with other=1.0, but replay step 2 passes other=2.0" in f["message"]


def test_a_buffer_replaced_after_capture_is_a_stale_input(capsys, program):
    code, doc, _ = check(capsys, f"{program}:replaced_buffer")
    f = only_finding(doc)
    assert code == 1
    assert (f["code"], f["op"], f["tensor"]) == ("CL104", "aten.add.Tensor", "model.bias")
    assert where(f["capture_frame"]) == where(f["shadow_frame"]) == (program.name, line(program, "bias"))
    assert where(f["allocation_frame"]) == (program.name, line(program, "replace"))  # the line that replaced it
    assert "reads model.bias (other) as captured, but replay step 1 uses model.bias" in f["message"]


def test_a_branch_on_host_state_is_baked_control_flow(capsys, program):
    code, doc, _ = check(capsys, f"{program}:branch_on_step")
    f = only_finding(doc)
    assert code == 1
    assert f["code"] == "CL101" and f["steps"] == [2, 4]  # the steps with an odd step count
    assert where(f["capture_frame"]) == (program.name, line(program, "bias"))  # the capture went on to the add
    assert where(f["shadow_frame"]) == (program.name, line(program, "relu"))  # the step runs the relu
    assert "aten.relu.default" in f["message"]


def test_a_tensor_argument_smaller_than_its_sample_is_a_baked_shape(capsys, program):
    # copy_ broadcasts the 1-row batch into the 8-row static input: the replay computes 8 rows.
    code, doc, _ = check(capsys, f"{program}:smaller_batch")
    f = only_finding(doc)
    assert code == 1 and f["code"] == "CL103" and f["op"] == "aten.addmm.default"
    assert "float32[8, 16]" in f["message"] and "float32[1, 16]" in f["message"]
    assert where(f["capture_frame"])[1] == line(program, "smaller")


# ================================================================= clean twins


def test_a_per_step_value_passed_as_an_argument_is_clean_and_the_shadow_agrees(capsys, program):
    code, doc, _ = check(capsys, f"{program}:scale_as_argument")
    assert code == 0 and doc["findings"] == []
    [numerical] = doc["numerical"]
    assert numerical["replay_steps"] == 4 and float(numerical["max_step_error"]) == 0.0
    assert numerical["token_agreement"] is None and numerical["max_logit_error"] is None  # no eager twin


def test_graphs_of_a_tuple_sharing_a_pool_are_each_shadowed(capsys, program):
    code, doc, _ = check(capsys, f"{program}:pair_clean")
    assert code == 0 and doc["findings"] == []
    [numerical] = doc["numerical"]
    assert numerical["replay_steps"] == 8 and float(numerical["max_step_error"]) == 0.0  # 4 calls of each graph
    labels = [g["graph"] for g in doc["configurations"][0]["graphs"]]
    at = f"@{program}:{line(program, 'pair')}"
    assert labels == [f"graphed Linear#0{at}", f"graphed Scaled#1{at}"]

    code, doc, _ = check(capsys, f"{program}:pair_rescaled")
    f = only_finding(doc)
    assert code == 1 and f["code"] == "CL102" and f["graph"] == f"graphed Scaled#1{at}"
    assert where(f["capture_frame"]) == (program.name, line(program, "pair-scale"))


def test_tensor_arguments_nested_in_tuples_are_copied_in_each_call(capsys, program):
    code, doc, _ = check(capsys, f"{program}:nested_tensor_arguments")
    assert code == 0 and doc["findings"] == []
    assert float(doc["numerical"][0]["max_step_error"]) == 0.0


def test_a_python_value_in_sample_args_fails_as_in_pytorch(capsys, program):
    code, _, err = check(capsys, f"{program}:float_sample")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "sample_args for each callable must contain only Tensors" in err
    assert f"{program.name}:{line(program, 'float-sample')}" in err


def test_a_python_value_passed_for_a_tensor_argument_is_an_error_naming_the_call(capsys, program):
    # PyTorch fails here too (the graph copies each argument into its static input).
    code, _, err = check(capsys, f"{program}:float_call")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "takes 2 tensors, as its sample_args, but was called with (Tensor, float)" in err
    assert f"{program.name}:{line(program, 'float-call')}" in err


def test_a_module_comes_back_as_itself_with_its_forward_graphed():
    # As PyTorch does: code that keeps using the module (model.scale = ...) reaches the graph.
    with emulate_cuda(), torch.no_grad():
        model = nn.Linear(4, 4).cuda().eval()
        assert torch.cuda.make_graphed_callables(model, (torch.zeros(2, 4, device="cuda"),)) is model
        x = torch.randn(2, 4, device="cuda")
        y = model(x)
        assert torch.equal(y, nn.functional.linear(x, model.weight, model.bias))
        assert model(torch.randn(2, 4, device="cuda")) is y  # the static output, refreshed by a replay
        model.train()
        assert model(x) is not y  # captured in eval mode: in training mode the original forward runs


# ======================================================== host state in the shadow


def test_a_counter_in_the_callable_advances_as_without_shadows(capsys, program):
    # The shadow re-runs forward's Python at each call; the counter and the list it
    # appends to are put back, so the program's own assertion holds (else exit 2).
    code, doc, err = check(capsys, f"{program}:counted")
    assert code == 0 and doc["findings"] == [], err
    assert doc["numerical"][0]["replay_steps"] == 4


def test_a_counter_that_feeds_a_captured_op_is_a_baked_host_value(capsys, program):
    # Eager steps multiply by 5, 6, ...; every replay multiplies by the capture's 4.
    code, doc, _ = check(capsys, f"{program}:counted_in_math")
    f = only_finding(doc)
    assert code == 1
    assert (f["code"], f["tensor"]) == ("CL102", "argument other")
    assert where(f["capture_frame"]) == (program.name, line(program, "calls"))
    assert "recorded with other=4, but replay step 1 passes other=5" in f["message"]


# ================================================================= the example


def example_line(marker: str) -> int:
    return next(i for i, text in enumerate(EXAMPLE.read_text().splitlines(), 1) if marker in text)


def test_the_example_with_the_baked_temperature_fails_with_cl102(capsys):
    code, doc, _ = check(capsys, f"{EXAMPLE}:targets_bug")
    f = only_finding(doc)
    assert code == 1 and f["code"] == "CL102" and f["op"] == "aten.div.Tensor"
    assert where(f["capture_frame"]) == where(f["shadow_frame"]) == (EXAMPLE.name, example_line("# the float is baked"))
    assert "recorded with other=1.0, but replay step 2 passes other=0.7" in f["message"]


def test_the_example_with_the_temperature_as_an_argument_passes(capsys):
    code, doc, _ = check(capsys, f"{EXAMPLE}:targets_fixed")
    assert code == 0 and doc["findings"] == []
    assert float(doc["numerical"][0]["max_step_error"]) == 0.0


LAYERDROP = '''\
import random
import sys

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            if random.random() < 0.5:  # LayerDrop: a Python coin picks the layers
                continue
            x = torch.relu(layer(x))
        return x


random.seed(0)
torch.manual_seed(0)
training = "--train" in sys.argv
net = Net().cuda().train(training)
x = torch.randn(4, 8, device="cuda")
with torch.set_grad_enabled(training):
    g = torch.cuda.make_graphed_callables(net, (x,), allow_unused_input=training)
    for _ in range(4):
        y = g(torch.randn(4, 8, device="cuda"))
        if training:
            y.sum().backward()
'''


@pytest.mark.parametrize("args", [(), ("--train",)], ids=["inference", "training"])
def test_layerdrop_is_baked_control_flow_and_its_weights_are_not_called_re_allocated(capsys, tmp_path, monkeypatch, args):
    """Layers chosen by Python's ``random`` at capture are baked (CL101); the weights of
    the layers the step chose existed before the capture, so they are not "re-allocated
    after capture" (CL104): the ops were aligned across two paths."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "layerdrop.py").write_text(LAYERDROP)
    capsys.readouterr()
    code = main(["run", "--format", "json", "layerdrop.py", *args])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    codes = [f["code"] for f in doc["findings"]]
    assert codes and set(codes) == {"CL101"}, codes
