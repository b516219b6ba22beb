"""The adapter registry: an engine family is one package (``plan``, ``options``) plus one
registry entry (``tests/plugins/toy/capturelint_toy``, checked through the CLI), and the
registry's errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from capturelint.report import finding_entries
from capturelint.adapters import registry
from capturelint.cli import main
from capturelint.errors import CapturelintError

ROOT = Path(__file__).resolve().parent.parent


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


TOY = Path(__file__).resolve().parent / "plugins" / "toy"  # a plug-in's package (tests/test_plugins.py installs it)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.syspath_prepend(str(TOY))
    from capturelint_toy import options, plan

    registry.register("toy", plan, options)
    try:
        yield plan
    finally:
        registry.unregister("toy")


def test_a_toy_engine_is_one_package_and_one_entry(capsys, toy):
    assert registry.names() == ("bundled", "vllm", "toy")
    code, out, err = run(capsys, "check", "--engine", "toy", "--format", "json")
    assert code == 1, err
    doc = json.loads(out)
    assert [(c["runner"], c["mode"]) for c in doc["configurations"]] == [
        ("v1", "PIECEWISE"), ("v1", "FULL"), ("v2", "PIECEWISE"), ("v2", "FULL")]
    # v1 re-allocates its metadata every step: the graphs keep reading the first tensor
    assert sorted((f["code"], f["runner"], f["mode"], f["tensor"]) for f in finding_entries(doc)) == [
        ("CL104", "v1", "FULL", "attn_metadata['bias']"), ("CL104", "v1", "PIECEWISE", "attn_metadata['bias']")]
    code, out, err = run(capsys, "check", "--engine", "toy", "--runner", "v2", "--steps", "3")
    assert code == 0, err
    assert "no findings in 2 configurations" in out
    # its own option (--toy-fixed) reaches commands built after it registered: tests/test_plugins.py runs one
    assert [s.flag for s in registry.family_options("toy").specs] == ["--toy-fixed"]


def test_a_toy_engine_records_its_regions_under_its_name(capsys, toy, tmp_path):
    out = tmp_path / "toy.json"
    code, _, err = run(capsys, "snapshot", "--engine", "toy", "--mode", "FULL", "-o", str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["engine"]["name"] == "toy"  # the default engine's name is the one left unwritten
    assert [(c["runner"], c["mode"]) for c in doc["configurations"]] == [("v1", "FULL"), ("v2", "FULL")]


@pytest.mark.parametrize("args, needle", [
    (["--kernels", "triton"], "--kernels configures --engine bundled, and --engine toy does not read it, so it would "
                              "be ignored; drop --kernels"),
    (["--layers", "2"], "--layers configures capturelint's engines (--engine bundled, vllm), and --engine toy does not "
                        "read it, so it would be ignored; drop --layers"),
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


def test_a_vllm_option_travels_as_a_value_from_its_spelling_to_the_step_loop(tmp_path):
    # the walk of --vllm-runner-impl: its spec (adapters/vllm/options.py) parses the
    # spelling once; the value rides EngineOptions.family into vLLM's knobs, which pick
    # the step loop (adapters/vllm/plan.py step_loop)
    from capturelint.adapters.vllm import plan as vllm_plan
    from capturelint.adapters.vllm.options import RunnerImpl, SpecMethod
    from capturelint.options import CUDAGraphMode, Runner
    from capturelint.settings import Settings

    def loop(mode: CUDAGraphMode, settings: Settings = Settings(), **options) -> str:
        plan = registry.make_plan(settings, registry.engine_options(engine="vllm", **options))
        return vllm_plan.step_loop(plan, Runner.V1, mode).__name__

    options = registry.engine_options(engine="vllm", vllm_runner_impl="Reproduced")
    assert options.family == (("vllm_runner_impl", RunnerImpl.REPRODUCED),) and options.given == ("engine", "vllm_runner_impl")
    assert loop(CUDAGraphMode.PIECEWISE) == "VllmRunnerLoop"  # the default: vLLM's own runner where it can
    assert loop(CUDAGraphMode.FULL) == "ReproducedLoop"  # vLLM's FULL graphs are bare: the reproduction
    assert loop(CUDAGraphMode.PIECEWISE, vllm_runner_impl=RunnerImpl.REPRODUCED) == "ReproducedLoop"
    assert loop(CUDAGraphMode.PIECEWISE, spec="mtp") == "MTPLoop"
    (tmp_path / "pyproject.toml").write_text('[tool.capturelint]\nvllm-runner-impl = "reproduced"\nspec = "mtp"\n')
    settings = registry.load_settings(str(tmp_path / "pyproject.toml"))
    plan = registry.make_plan(settings, registry.engine_options(engine="vllm"))
    assert (plan.knobs.vllm_runner_impl, plan.knobs.spec) == (RunnerImpl.REPRODUCED, SpecMethod.MTP)  # settings too


def test_the_bundled_engines_defaults_in_help_are_its_own():
    from capturelint.adapters.bundled import options
    from capturelint.engine.config import EngineConfig

    config = EngineConfig()
    assert (options.DEFAULT_LAYERS, options.DEFAULT_STEPS) == (config.num_layers, config.steps)
    assert registry.default_texts("layers") == "bundled: 4; vllm: 3"
