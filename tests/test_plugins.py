"""Engines as plug-ins: an installed distribution with an entry point in the group
``capturelint.adapters`` adds ``--engine NAME`` (``capturelint.adapters.registry``), as
pytest finds its plug-ins through ``pytest11``.

The plug-in is ``tests/plugins/toy/``, a package of the shape of
``capturelint/adapters/vllm/`` (``plan``, ``options``) with a ``pyproject.toml`` naming its
entry point. One test installs it for real (pip, into a scratch folder on the path of a
subprocess) and checks with it; the others give ``importlib.metadata`` a stand-in entry
point, for what a broken or clashing plug-in does."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from capturelint.report import finding_entries
from capturelint.adapters import registry
from capturelint.errors import CapturelintError

TESTS = Path(__file__).resolve().parent
TOY = TESTS / "plugins" / "toy"


def test_an_installed_plugin_engine_is_checked_with_its_own_options(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(TOY, source)  # the build writes next to its sources: not in the repository
    site = tmp_path / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                              "--no-index", "--target", str(site), str(source)],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr
    assert (site / "capturelint_toy_engine-0.1.0.dist-info" / "entry_points.txt").read_text().split() == [
        "[capturelint.adapters]", "toy", "=", "capturelint_toy"]
    # its engine's runner is tests/toy_engine.py, on the path as a third-party engine's code would be
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(TESTS), str(TESTS.parent)])}

    def capturelint(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "capturelint", *args], capture_output=True, text=True,
                              timeout=600, cwd=tmp_path, env=env)

    done = capturelint("check", "--engine", "toy", "--format", "json")
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert [(c["runner"], c["mode"]) for c in doc["configurations"]] == [
        ("v1", "PIECEWISE"), ("v1", "FULL"), ("v2", "PIECEWISE"), ("v2", "FULL")]
    assert sorted((f["code"], f["runner"], f["mode"]) for f in finding_entries(doc)) == [
        ("CL104", "v1", "FULL"), ("CL104", "v1", "PIECEWISE")]
    fixed = capturelint("check", "--engine", "toy", "--toy-fixed", "--runner", "v1", "--mode", "PIECEWISE")
    assert fixed.returncode == 0, fixed.stderr
    assert "no findings in 1 configuration" in fixed.stderr + fixed.stdout
    refused = capturelint("check", "--engine", "toy", "--kernels", "triton")
    assert refused.returncode == 2 and refused.stderr == (
        "capturelint: error: --kernels configures --engine bundled, and --engine toy does not read it, so it would "
        "be ignored; drop --kernels\n")
    helped = capturelint("check", "--help")
    assert "Engine options (toy):\n  --toy-fixed" in helped.stdout
    said = " ".join(helped.stdout.split())
    assert "--steps N Engine steps of the workload, one forward each (default: bundled: 24; vllm: 6; toy: 4)." in said


@pytest.fixture
def entry_points(monkeypatch):
    """Stand-in entry points of the group (a fresh registry reads them)."""

    def use(*points: tuple[str, str]) -> None:
        found = [importlib.metadata.EntryPoint(name, value, registry.ENTRY_POINTS) for name, value in points]
        real = importlib.metadata.entry_points
        monkeypatch.setattr(importlib.metadata, "entry_points",
                            lambda **kw: found if kw.get("group") == registry.ENTRY_POINTS else real(**kw))
        monkeypatch.setattr(registry, "_plugins_read", False)
        monkeypatch.setattr(registry, "_FAMILIES", {n: f for n, f in registry._FAMILIES.items()
                                                    if n in registry._BUILT_IN})
        monkeypatch.setattr(registry, "_options", {})

    return use


def test_a_plugin_found_through_its_entry_point_is_an_engine(entry_points, monkeypatch):
    monkeypatch.syspath_prepend(str(TOY))
    entry_points(("toy", "capturelint_toy"))
    assert registry.names() == ("bundled", "vllm", "toy")
    assert [s.flag for s in registry.family_options("toy").specs] == ["--toy-fixed"]
    assert registry.adapter("toy").NAME == "toy"


def test_a_plugin_that_cannot_be_imported_is_one_line_naming_it(entry_points):
    entry_points(("ghost", "no_such_package_of_capturelint"))
    assert "ghost" in registry.names()  # its metadata is read without importing it
    with pytest.raises(CapturelintError) as info:
        registry.adapter("ghost")
    assert str(info.value).startswith("the plug-in engine 'ghost' (capturelint.adapters entry point ghost = "
                                      "'no_such_package_of_capturelint') cannot be imported: ModuleNotFoundError")
    with pytest.raises(CapturelintError, match=r"^the plug-in engine 'ghost' .* cannot be imported"):
        registry.family_specs()  # what every command's options are built from: the user is told, not a traceback


def test_a_plugin_without_an_options_module_reads_only_engine(entry_points, monkeypatch, tmp_path):
    (tmp_path / "bare_engine").mkdir()
    (tmp_path / "bare_engine" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    entry_points(("bare", "bare_engine"))
    assert registry.family_options("bare").reads == frozenset({"engine"}) and registry.family_options("bare").specs == ()


def test_a_plugin_may_not_take_a_built_in_engines_name(entry_points):
    entry_points(("vllm", "somebody_elses_vllm"))
    with pytest.raises(CapturelintError, match=r"takes the name of an engine that is there already"):
        registry.names()
