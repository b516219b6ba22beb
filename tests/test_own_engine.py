"""A team's own engine, gated as capturelint gates its own: ``examples/own_engine`` run as
a user runs it (the installed ``capturelint`` command, a fresh process, the project's
folder or a subfolder as the working directory, no PYTHONPATH), and the region gate
(snapshot, check --baseline, --max-eager-growth, diff) on a project's targets."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from capturelint.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "own_engine"
CAPTURELINT = Path(sys.executable).parent / "capturelint"  # the console script pip installed
REBIND = "self.static_x = x.to(DEVICE)"
FIX = "self.static_x.copy_(x)"


def capturelint(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``capturelint ARGS`` in ``cwd``, as a shell runs it: no PYTHONPATH, no -m."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(CAPTURELINT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def line_of(path: Path, text: str) -> int:
    (line,) = [i for i, t in enumerate(path.read_text().splitlines(), 1) if t.strip().startswith(text)]
    return line


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A scratch copy of the example, outside any repository."""
    copy = tmp_path / "myserve"
    shutil.copytree(EXAMPLE, copy)
    return copy


def test_the_example_fails_on_the_rebinding_line_from_its_root_and_a_subfolder_and_passes_once_fixed(project):
    runner = project / "src" / "myserve" / "runner.py"
    rebind = line_of(runner, REBIND)

    from_root = capturelint(project, "check", "--format", "json")
    assert from_root.returncode == 1, from_root.stderr
    doc = json.loads(from_root.stdout)
    (finding,) = doc["findings"]
    assert finding["code"] == "CL104" and finding["tensor"] == "runner.static_x"
    assert finding["location"] == {"file": "src/myserve/runner.py", "line": rebind, "function": "serve",
                                   "role": "re-binding"}
    assert doc["subject"] == {"targets": ["tests/capture_targets.py:targets"]}  # its targets, not capturelint's engine
    assert doc["region_changes"]["failed"] is False  # the committed baseline of pyproject.toml was compared
    assert from_root.stderr.rstrip().endswith("[targets tests/capture_targets.py:targets]")

    from_tests = capturelint(project / "tests", "check", "--format", "json")  # a subfolder: the same report
    assert from_tests.returncode == 1, from_tests.stderr
    assert from_tests.stdout == from_root.stdout

    annotated = capturelint(project / "src", "check", "--format", "github")
    assert annotated.returncode == 1
    assert annotated.stdout.startswith(f"::error file=src/myserve/runner.py,line={rebind},title=CL104 ")
    assert "hint: run `capturelint suggest`" not in annotated.stderr  # a bare graph has no region to suggest

    runner.write_text(runner.read_text().replace(REBIND, FIX))
    fixed = capturelint(project / "tests", "check")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert fixed.stdout.rstrip().endswith("no findings in 1 configuration: replay matches eager execution; regions "
                                          "unchanged in 1 configuration [targets tests/capture_targets.py:targets]")


def test_the_bundled_engine_is_still_one_option_away(project):
    result = capturelint(project, "check", "--engine", "bundled", "--runner", "v2", "--mode", "FULL", "--layers", "1",
                         "--steps", "3", "--format", "json", "--jobs", "1")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["subject"] == {"engine": "bundled"}
    # an engine option without --engine bundled is refused: this project checks its own targets
    refused = capturelint(project, "check", "--runner", "v2")
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        "capturelint: error: --runner configures capturelint's engines, and this project checks its own targets "
        "(pyproject.toml: targets), which do not read it; add --engine bundled to check capturelint's engine, or "
        "drop --runner")


# ------------------------------------------------------------------ settings


def write_project(root: Path, table: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text("[tool.capturelint]\n" + textwrap.dedent(table))
    return root


@pytest.mark.parametrize("table, message", [
    ('targets = "t.py:targets"\nengine = "bundled"\n', "engine and targets both say what to check"),
    ("targets = []\n", "targets must be a non-empty list"),
    ('targets = ["t.py"]\n', "has 't.py', which is not FILE.py:FUNCTION or MODULE:FUNCTION"),
    ('targets = ["t.py:targets"]\npythonpath = ["nowhere"]\n', "which is not a folder"),
])
def test_bad_target_settings_are_one_line_errors_before_anything_runs(tmp_path, monkeypatch, capsys, table, message):
    monkeypatch.chdir(write_project(tmp_path, table))
    assert main(["check"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_setting_paths_are_read_against_the_settings_file_and_command_line_paths_against_the_cwd(tmp_path, monkeypatch,
                                                                                                capsys):
    from capturelint.adapters import registry
    from capturelint.api import engine_options
    from capturelint.options import EngineOptions

    root = write_project(tmp_path / "proj", 'targets = ["tests/t.py:targets", "pkg.targets:more"]\npythonpath = ["src"]\n')
    (root / "src").mkdir()
    (root / "deep" / "er").mkdir(parents=True)
    monkeypatch.chdir(root / "deep" / "er")
    settings = registry.load_settings()
    assert settings.targets == (f"{root.resolve()}/tests/t.py:targets", "pkg.targets:more")
    assert settings.pythonpath == ((root / "src").resolve(),)
    plan = registry.make_plan(settings, EngineOptions())
    assert plan.engine == "target"
    assert [s.name for s in plan.sources] == ["tests/t.py:targets", "pkg.targets:more"]
    assert plan.sources[0].paths == (str(root.resolve()), str((root / "src").resolve()))  # as pytest's rootdir
    cli = registry.make_plan(settings, EngineOptions(target="../t.py:targets"))  # typed in deep/er: its cwd
    assert cli.sources[0].name == "deep/t.py:targets"
    api = registry.make_plan(settings, engine_options(target="tests/t.py:targets"))  # the API: the project root
    assert api.sources[0].spec == f"{root.resolve()}/tests/t.py:targets"
    assert registry.make_plan(settings, EngineOptions(engine="bundled")).engine == "bundled"


# ------------------------------------------------------------------ the region gate

GROWING = """
import torch
from torch import nn

from capturelint.runtime.breakable import CUDAGraphWrapper, eager_break_during_capture
from capturelint.runtime.forward_context import BatchDescriptor, CUDAGraphMode, set_forward_context
from capturelint.target import Target

WIDE = False  # the refactor under review: the activation moves into an eager break


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        h = self.norm(self.a(x))
        h = self.act(h) if WIDE else torch.relu(h)
        return self.b(h)

    @eager_break_during_capture
    def norm(self, h):
        return h / (h.abs().amax() + 1.0)

    @eager_break_during_capture
    def act(self, h):
        return torch.relu(h) * 2.0


class Runner:
    def __init__(self):
        self.model = Net()
        self.wrapper = CUDAGraphWrapper(self.model)
        self.x = torch.zeros(2, 4)

    def run(self):
        outs = []
        for step in range(4):
            self.x.copy_(torch.full((2, 4), float(step)))
            with set_forward_context(None, CUDAGraphMode.PIECEWISE, BatchDescriptor(2, False)):
                outs.append(self.wrapper(self.x).clone())
        return outs


def targets():
    runner = Runner()
    return Target(run=runner.run, roots={"model": runner.model, "runner": runner}, runner="net", mode="PIECEWISE")
"""


def test_snapshot_baseline_budget_and_diff_gate_a_projects_targets(tmp_path, monkeypatch, capsys):
    root = write_project(tmp_path / "proj", 'targets = ["capture_targets.py:targets"]\n')
    (root / "capture_targets.py").write_text(GROWING)
    (root / "sub").mkdir()
    monkeypatch.chdir(root / "sub")

    assert main(["snapshot", "-o", "../regions.json"]) == 0
    snap = json.loads((root / "regions.json").read_text())
    (config,) = snap["configurations"]
    assert (config["target"], config["runner"], config["mode"]) == ("capture_targets.py:targets", "net", "PIECEWISE")
    assert config["eager_ops_per_step"] > 0
    capsys.readouterr()

    assert main(["check", "--baseline", "../regions.json", "--max-eager-growth", "0"]) == 0  # unchanged
    assert "regions unchanged in 1 configuration" in capsys.readouterr().out

    (root / "capture_targets.py").write_text(GROWING.replace("WIDE = False", "WIDE = True"))
    assert main(["check", "--baseline", "../regions.json", "--max-eager-growth", "10", "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["findings"] == [] and doc["region_changes"]["failed"] is True  # the growth alone fails the gate
    (change,) = doc["region_changes"]["configurations"]
    growth = change["eager_ops_per_step"]
    assert growth["after"] > growth["before"] > 0 and change["growth_pct"] > 10 and change["over_budget"] is True
    assert main(["check", "--baseline", "../regions.json", "--max-eager-growth", "1000"]) == 0  # within budget
    capsys.readouterr()

    assert main(["diff", "../regions.json", "--format", "json"]) == 0
    diff = json.loads(capsys.readouterr().out)
    assert diff["before"] == "../regions.json" and diff["after"] == "the current targets"
    (moved,) = diff["region_changes"]["configurations"]
    assert any(m["direction"] == "to eager" and m["op"] == "aten.relu.default" for m in moved["moved"])

    assert main(["check", "--format", "sarif"]) == 0  # SARIF says what it checked too
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["properties"]["subject"] == {"targets": ["capture_targets.py:targets"]}
    assert main(["show", "--no-check"]) == 0  # show draws the same targets
    assert "capture_targets.py:targets" not in capsys.readouterr().err  # no error naming them
    assert main(["snapshot", "--update", "../regions.json"]) == 0  # accept the change
    assert main(["check", "--baseline", "../regions.json", "--max-eager-growth", "0"]) == 0


# ------------------------------------------------------------------ the API and the plugin


@pytest.fixture
def clean_imports():
    """The example's package imported in this process is forgotten afterwards."""
    path, modules = list(sys.path), set(sys.modules)
    yield
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        if name.startswith(("myserve", "capturelint_target_")):
            del sys.modules[name]


def test_the_api_takes_target_objects_or_a_function_and_specs_relative_to_the_project_root(project, monkeypatch,
                                                                                          clean_imports):
    from capturelint import api
    from capturelint.errors import CapturelintError

    monkeypatch.chdir(project / "tests")
    spec = api.check(target="tests/capture_targets.py:targets", jobs=1)  # the project root's path, from tests/
    assert [f.code for f in spec.findings] == ["CL104"]
    assert spec.subject == {"targets": ["tests/capture_targets.py:targets"]}

    shutil.copy(project / "tests" / "capture_targets.py", project / "src" / "capture_targets_copy.py")
    sys.path.insert(0, str(project / "src"))
    import capture_targets_copy

    from capturelint.target import emulate_cuda

    monkeypatch.chdir(project.parent)  # outside the project: objects need no settings
    with emulate_cuda():  # the runner moves its model to "cuda" as it is built: no GPU here
        made = capture_targets_copy.targets()
    objects = api.check(targets=made, jobs=1)
    assert [f.code for f in objects.findings] == ["CL104"]
    assert objects.subject == {"targets": ["Target objects"]}
    called = api.check(targets=capture_targets_copy.targets, jobs=1)
    assert called.subject == {"targets": ["capture_targets_copy:targets"]}
    assert [f.location.line for f in called.findings] == [line_of(project / "src" / "myserve" / "runner.py", REBIND)]
    with pytest.raises(CapturelintError, match="targets="):
        api.check(targets=[1, 2])
    with pytest.raises(AssertionError) as failed:
        called.assert_clean()
    first = str(failed.value).splitlines()[0]  # the grouped problem, paths relative to the working directory here
    assert first.startswith(f"myserve/src/myserve/runner.py:{line_of(project / 'src/myserve/runner.py', REBIND)}: "
                            "CL104 the graph reads freed memory")
    assert repr(called).startswith("<Report: 1 finding (CL104 x1) in 1 configuration")


PLUGIN_TEST = """
import pytest

import capture_targets_copy
from capturelint.target import emulate_cuda

with emulate_cuda():  # the runner moves its model to "cuda" as it is built: no GPU here
    OBJECTS = capture_targets_copy.targets()


@pytest.mark.capturelint(targets=OBJECTS)
def test_marker_target_objects(capturelint_check):
    capturelint_check.check().assert_clean()


@pytest.mark.capturelint(targets=capture_targets_copy.targets)
def test_marker_objects(capturelint_check):
    capturelint_check.assert_clean()


def test_settings_targets(capturelint_check):
    capturelint_check.check().assert_clean()


def test_old_name(capturelint):
    assert capturelint.check(targets=capture_targets_copy.targets).findings
"""


def test_the_plugin_marker_takes_target_objects_and_fails_with_the_problems_from_any_folder(project):
    shutil.copy(project / "tests" / "capture_targets.py", project / "src" / "capture_targets_copy.py")
    (project / "tests" / "test_plugin_gate.py").write_text(PLUGIN_TEST)
    (project / "conftest.py").write_text("import sys, pathlib\nsys.path.insert(0, str(pathlib.Path(__file__).parent / "
                                         "'src'))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for cwd, args in ((project, ["tests/test_plugin_gate.py"]), (project / "src", ["../tests/test_plugin_gate.py"])):
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
                                 *args, "--rootdir", str(project)],
                                cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        out = result.stdout
        assert result.returncode == 1, out
        assert "3 failed, 1 passed" in out, out
        assert "test_plugin_gate.py::test_marker_target_objects - " in out
        assert "src/myserve/runner.py:" in out and ": CL104 the graph reads freed memory" in out
        assert "fix: Allocate the input once and refresh it in place" in out
        assert "capturelint/report.py" not in out and "capturelint/pytest_plugin.py" not in out  # frames hidden
        assert "<Report" not in out and "Report(configs=" not in out
        assert "DeprecationWarning" in out and "capturelint_check" in out  # the old name warns
