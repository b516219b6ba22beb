"""The adapter registry: an engine family is one module plus one registry entry
(``tests/toy_adapter.py``, checked through the CLI), and the registry's errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from capturelint.adapters import registry
from capturelint.cli import main
from capturelint.errors import CapturelintError

ROOT = Path(__file__).resolve().parent.parent


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def toy():
    import toy_adapter

    registry.register("toy", toy_adapter)
    try:
        yield toy_adapter
    finally:
        registry.unregister("toy")


def test_a_toy_engine_is_one_module_and_one_entry(capsys, toy):
    assert registry.names() == ("bundled", "vllm", "toy")
    code, out, err = run(capsys, "check", "--engine", "toy", "--format", "json")
    assert code == 1, err
    doc = json.loads(out)
    assert [(c["runner"], c["mode"]) for c in doc["configurations"]] == [
        ("v1", "PIECEWISE"), ("v1", "FULL"), ("v2", "PIECEWISE"), ("v2", "FULL")]
    # v1 re-allocates its metadata every step: the graphs keep reading the first tensor
    assert sorted((f["code"], f["runner"], f["mode"], f["tensor"]) for f in doc["findings"]) == [
        ("CL104", "v1", "FULL", "attn_metadata['bias']"), ("CL104", "v1", "PIECEWISE", "attn_metadata['bias']")]
    code, out, err = run(capsys, "check", "--engine", "toy", "--runner", "v2", "--steps", "3")
    assert code == 0, err
    assert "no findings in 2 configurations" in out


def test_a_toy_engine_records_its_regions_under_its_name(capsys, toy, tmp_path):
    out = tmp_path / "toy.json"
    code, _, err = run(capsys, "snapshot", "--engine", "toy", "--mode", "FULL", "-o", str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["engine"]["name"] == "toy"  # the default engine's name is the one left unwritten
    assert [(c["runner"], c["mode"]) for c in doc["configurations"]] == [("v1", "FULL"), ("v2", "FULL")]


@pytest.mark.parametrize("args, needle", [
    (["--kernels", "triton"], "--kernels configures an engine knob the toy engine does not have, so --kernels would "
                              "be ignored; drop --kernels"),
    (["--mode", "FULL_DECODE_ONLY"], "the toy engine captures PIECEWISE or FULL graphs, not FULL_DECODE_ONLY"),
    (["--runner", "v3"], "unknown runner 'v3'; use v1, v2 or all"),
])
def test_what_a_toy_engine_does_not_read_is_an_error(capsys, toy, args, needle):
    code, out, err = run(capsys, "check", "--engine", "toy", *args)
    assert code == 2 and out == ""
    assert err == f"capturelint: error: {needle}\n"


def test_an_unregistered_engine_is_no_choice(capsys):
    code, out, err = run(capsys, "check", "--engine", "toy")
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and "Invalid value for '--engine': 'toy' is not one of 'bundled', 'vllm'" in err


def test_an_unknown_engine_name_is_one_line_listing_the_names():
    with pytest.raises(CapturelintError, match=r"^unknown engine 'nope'; use bundled or vllm$"):
        registry.adapter("nope")


def test_an_unknown_engine_in_settings_names_the_file_and_key(capsys, tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.capturelint]\nengine = "nope"\n')
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "check")
    assert code == 2 and out == ""
    assert err == ("capturelint: error: pyproject.toml: [tool.capturelint] engine 'nope' is no engine; use bundled or "
                   "vllm\n")


def test_names_are_registered_once_and_built_in_engines_stay(toy):
    with pytest.raises(ValueError, match="registered already"):
        registry.register("toy", toy)
    with pytest.raises(ValueError, match="not a registered plug-in"):
        registry.unregister("bundled")


def test_the_registry_loads_adapters_when_asked():
    # the commands import the registry to build --engine's choices: no adapter, no torch
    code = ("import sys; import capturelint.adapters.registry as r\n"
            "print(sorted(m for m in sys.modules if m.startswith('capturelint.adapters')), 'torch' in sys.modules)\n"
            "r.adapter('bundled'); print('capturelint.adapters.vllm.plan' in sys.modules, "
            "'capturelint.adapters.bundled' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "['capturelint.adapters', 'capturelint.adapters.common', 'capturelint.adapters.registry'] False",
        "False True"]
