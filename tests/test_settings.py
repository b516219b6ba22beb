"""Reading [tool.capturelint] from pyproject.toml, and flag/setting/default precedence."""

from __future__ import annotations

from pathlib import Path

import pytest

from capturelint.adapters.registry import family_specs
from capturelint.errors import CapturelintError
from capturelint.options import BreakOutputs, CUDAGraphMode, EagerRegion, Runner
from capturelint.settings import Settings, find_config, load_settings, merge
from capturelint.settings import read_settings as read_shared


def read_settings(path):
    """The file's settings with every engine family's keys, as the commands read them."""
    return read_shared(path, family_specs())


FULL_TABLE = """
[project]
name = "demo"

[tool.capturelint]
runner = ["v1", "V2"]
mode = ["piecewise", "FULL_DECODE_ONLY"]
eager-region = "narrow"
select = ["CL1", "cl901"]
ignore = []
baseline = "ci/capturelint-baseline.json"
max-eager-growth = 12.5
layers = 4
steps = 8
seed = 0
kernels = "triton"
format = "sarif"
"""


def write(directory: Path, text: str, name: str = "pyproject.toml") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def test_valid_table(tmp_path):
    path = write(tmp_path, FULL_TABLE)
    assert read_settings(path) == Settings(
        runners=(Runner.V1, Runner.V2),
        modes=(CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL_DECODE_ONLY),
        eager_region=EagerRegion.NARROW,
        select=("CL1", "CL901"),
        ignore=(),
        baseline=(tmp_path / "ci" / "capturelint-baseline.json").resolve(),
        max_eager_growth=12.5,
        layers=4,
        steps=8,
        seed=0,
        format="sarif",
        family=(("kernels", "triton"),),
        engine_keys=("runner", "mode", "eager-region", "layers", "steps", "seed", "kernels"),
        source=path.resolve(),
    )


@pytest.mark.parametrize("text", ['runner = "all"', 'runners = ["v1", "v2"]', 'runner = ["v1", "v2"]', 'runner = "v1,v2"'])
def test_the_key_is_the_flags_name_and_the_plural_an_alias(tmp_path, text):
    assert read_settings(write(tmp_path, f"[tool.capturelint]\n{text}\n")).runners == (Runner.V1, Runner.V2)


def test_a_setting_given_by_both_its_names_is_one_line(tmp_path):
    path = write(tmp_path, '[tool.capturelint]\nmodes = ["FULL"]\nmode = "PIECEWISE"\n')
    with pytest.raises(CapturelintError) as info:
        read_settings(path)
    assert str(info.value) == f"{path.resolve()}: [tool.capturelint] modes and mode are one setting; keep mode"


def test_an_engine_familys_keys_are_read_with_its_specs_only(tmp_path):
    path = write(tmp_path, '[tool.capturelint]\ncapture-sizes = [4, 2]\nvllm-runner-impl = "reproduced"\n')
    from capturelint.adapters.vllm.options import RunnerImpl

    settings = read_settings(path)
    assert settings.value("capture_sizes") == (4, 2) and settings.value("vllm_runner_impl") is RunnerImpl.REPRODUCED
    assert settings.engine_keys == ("capture-sizes", "vllm-runner-impl")
    with pytest.raises(CapturelintError, match=r"unknown key 'capture-sizes'"):
        read_shared(path)  # without the families' specs (the adapter registry passes them)


def test_search_walks_up_and_skips_pyprojects_without_the_table(tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()
    root = write(tmp_path, '[tool.capturelint]\nrunners = ["v2"]\n')
    write(tmp_path / "pkg", '[project]\nname = "pkg"\n')
    deep = tmp_path / "pkg" / "src" / "deeper"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    settings = load_settings()
    assert settings.runners == (Runner.V2,)
    assert settings.source == root.resolve()
    assert find_config(deep) == (root.resolve(), {"runners": ["v2"]})


def test_search_stops_at_the_repository_root(tmp_path):
    write(tmp_path, '[tool.capturelint]\nrunners = ["v2"]\n')
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    assert find_config(repo) is None
    assert load_settings(start=repo) == Settings()


def test_no_file_gives_empty_settings(tmp_path):
    (tmp_path / ".git").mkdir()
    assert load_settings(start=tmp_path) == Settings()


def test_explicit_config(tmp_path):
    path = write(tmp_path / "elsewhere", '[tool.capturelint]\nbaseline = "b.json"\n', name="custom.toml")
    settings = load_settings(config=path, start=tmp_path)
    assert settings.source == path.resolve()
    assert settings.baseline == (tmp_path / "elsewhere" / "b.json").resolve()


def test_explicit_config_errors(tmp_path):
    with pytest.raises(CapturelintError, match=r"missing\.toml: no such file; --config takes"):
        load_settings(config=tmp_path / "missing.toml")
    path = write(tmp_path, '[project]\nname = "x"\n')
    with pytest.raises(CapturelintError, match=r"pyproject\.toml: no \[tool\.capturelint\] table"):
        load_settings(config=path)


def test_unknown_key(tmp_path):
    path = write(tmp_path, '[tool.capturelint]\nrunnr = ["v1"]\n')
    with pytest.raises(CapturelintError) as info:
        read_settings(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path.resolve()}: [tool.capturelint] unknown key 'runnr'; did you mean 'runner'? ")
    assert ("known keys: accept-findings, baseline, batch-sizes, break-outputs, capture-sizes, eager-region, engine, "
            "format, fresh-metadata, ignore, invariants, jobs, kernels, layers, max-eager-growth, mode, model, "
            "platform, pythonpath, require-oracle, runner, seed, select, spec, steps, targets, vllm-runner-impl") in message


@pytest.mark.parametrize(
    "line, expected",
    [
        ('runners = 1', "runners must be v1, v2 or all or a list of them, got a number (1); write for example runners = [\"v1\", \"v2\"]"),
        ('runners = ["v3"]', "runners: unknown runner 'v3'; use v1, v2 or all"),
        ("modes = [1]", "modes must be a list of modes, got a list; write for example modes = [\"PIECEWISE\"]"),
        ('modes = ["SOMETIMES"]', "modes: unknown CUDA-graph mode 'SOMETIMES'; use one of NONE, PIECEWISE, FULL"),
        ('eager-region = "medium"', "eager-region: unknown eager region 'medium'; use narrow, wide, per-runner"),
        ('eager-region = 1', 'eager-region must be one of "narrow", "wide", "per-runner", got a number (1)'),
        ('select = ["E501"]', "select has 'E501', not a rule code; use codes like \"CL101\" or prefixes like \"CL1\""),
        ('ignore = ["CL1011"]', "ignore has 'CL1011', not a rule code"),
        ('ignore = 5', "ignore must be a list of rule codes, got a number (5)"),
        ('baseline = 3', "baseline must be a path (a non-empty string), got a number (3)"),
        ('max-eager-growth = -1', "max-eager-growth must be a percentage (a number >= 0), got a number (-1)"),
        ('max-eager-growth = "10%"', "max-eager-growth must be a percentage (a number >= 0), got a string ('10%'); write for example max-eager-growth = 10"),
        ('max-eager-growth = nan', "max-eager-growth must be a percentage"),
        ('layers = 0', "layers must be an integer from 1 to 256, got a number (0)"),
        ('layers = 100000', "layers must be an integer from 1 to 256, got a number (100000)"),
        ('steps = true', "steps must be an integer from 1 to 4096, got a boolean (true)"),
        ('steps = 1000000000', "steps must be an integer from 1 to 4096, got a number (1000000000)"),
        ('seed = 1.5', "seed must be an integer from 0 to 18446744073709551615 (64 bits), got a number (1.5)"),
        ('seed = 18446744073709551616', "seed must be an integer from 0 to 18446744073709551615 (64 bits), got a number"),
        ('seed = -1', "seed must be an integer from 0 to 18446744073709551615 (64 bits), got a number (-1)"),
        ('select = ["CL999"]', "select has 'CL999', which matches no rule code; use one of CL101, CL102"),
        ('ignore = ["CL8"]', "ignore has 'CL8', which matches no rule code"),
        ('select = []', "select is an empty list; list at least one rule code, or leave it out for the default"),
        ('runners = []', "runners is an empty list; list at least one runner, or leave it out for the default"),
        ('mode = []', "mode is an empty list; list at least one mode, or leave it out for the default"),
        ('kernels = "cuda"', 'kernels must be one of "torch", "triton"'),
        ('break-outputs = "keep"', "break-outputs: unknown break-outputs policy 'keep'; use copy, discard"),
        ('capture-sizes = [2, 0]', "capture-sizes takes positive integers separated by commas (e.g. 2,4), got a list"),
        ('vllm-runner-impl = "shim"', "vllm-runner-impl: unknown runner implementation 'shim'; use real, reproduced"),
        ('format = ["json"]', 'format must be one of "rich", "json", "sarif", "github", "html", got a list'),
    ],
)
def test_wrong_type_or_value(tmp_path, line, expected):
    path = write(tmp_path, f"[tool.capturelint]\n{line}\n")
    with pytest.raises(CapturelintError) as info:
        read_settings(path)
    message = str(info.value)
    assert "\n" not in message
    assert "[tool.capturelint] " + expected in message


def test_ignore_may_be_an_empty_list(tmp_path):
    assert read_settings(write(tmp_path, "[tool.capturelint]\nignore = []\n")).ignore == ()


def test_a_file_that_is_not_utf8_is_one_line_naming_it(tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()
    (tmp_path / "pyproject.toml").write_bytes(b'[tool.capturelint]\nsteps = 2 # caf\xe9\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CapturelintError) as info:
        load_settings()
    assert str(info.value) == "pyproject.toml: not UTF-8 text (byte 34 is invalid); TOML files are UTF-8: save it as UTF-8"


def test_table_of_wrong_type(tmp_path):
    path = write(tmp_path, "[tool]\ncapturelint = 3\n")
    with pytest.raises(CapturelintError, match=r"tool\.capturelint must be a table, got a number \(3\)"):
        read_settings(path)


def test_malformed_toml(tmp_path, monkeypatch):
    write(tmp_path, '[tool.capturelint]\nrunners = = ["v1"]\nsteps = 2\n')
    (tmp_path / ".git").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CapturelintError) as info:
        load_settings()
    message = str(info.value)
    assert message.startswith("pyproject.toml: malformed TOML: ")
    assert "(at line 2, column" in message
    assert message.endswith("; fix the file")
    assert "\n" not in message


@pytest.mark.parametrize(
    "cli_value, setting_value, default, expected",
    [
        ("wide", "narrow", "per-runner", "wide"),
        (None, "narrow", "per-runner", "narrow"),
        (None, None, "per-runner", "per-runner"),
        ((), ("v1",), ("v1", "v2"), ("v1",)),
        (("v2",), ("v1",), ("v1", "v2"), ("v2",)),
        (None, (), ("CL101",), ()),
        (0, 5, 7, 0),
        (False, True, True, False),
    ],
)
def test_merge_precedence(cli_value, setting_value, default, expected):
    assert merge(cli_value, setting_value, default) == expected


def test_precedence_with_a_project(tmp_path):
    path = write(tmp_path, '[tool.capturelint]\neager-region = "wide"\nsteps = 3\n')
    settings = read_settings(path)
    assert merge(None, settings.eager_region, EagerRegion.PER_RUNNER) is EagerRegion.WIDE
    assert merge(EagerRegion.NARROW, settings.eager_region, EagerRegion.PER_RUNNER) is EagerRegion.NARROW
    assert merge(None, settings.layers, 2) == 2
    assert merge(5, settings.steps, 16) == 5


def test_settings_hold_the_values_of_the_options(tmp_path):
    # parsed once, by the reader, into capturelint.options' values (any case)
    path = write(tmp_path, '[tool.capturelint]\nmodes = ["full_and_piecewise"]\nbreak-outputs = "Discard"\n'
                           'eager-region = "PER-RUNNER"\n')
    settings = read_settings(path)
    assert settings.modes == (CUDAGraphMode.FULL_AND_PIECEWISE,)
    assert settings.value("break_outputs") is BreakOutputs.DISCARD and settings.eager_region is EagerRegion.PER_RUNNER


def test_break_outputs_setting_and_its_flag(tmp_path):
    from capturelint.adapters.registry import make_plan
    from capturelint.options import EngineOptions

    settings = read_settings(write(tmp_path, '[tool.capturelint]\nbreak-outputs = "discard"\nrunners = ["v1"]\n'))
    assert settings.value("break_outputs") is BreakOutputs.DISCARD
    assert make_plan(settings, EngineOptions()).knobs.break_outputs is BreakOutputs.DISCARD
    flag = EngineOptions(family=(("break_outputs", BreakOutputs.COPY),), given=("break_outputs",))
    assert make_plan(settings, flag).knobs.break_outputs is BreakOutputs.COPY  # the flag wins
    assert make_plan(Settings(), EngineOptions(runners=(Runner.V1,))).knobs.break_outputs is BreakOutputs.COPY  # the default


def test_settings_and_options_are_refused_before_torch_is_imported(tmp_path):
    """A typo in [tool.capturelint] or a bad option is reported without loading torch
    (seconds) or an engine: the module-import assertion of each case, in a fresh process."""
    import json
    import subprocess
    import sys

    (tmp_path / ".git").mkdir()
    write(tmp_path, '[tool.capturelint]\nlayrs = 2\n')
    cases = [["check"], ["suggest"], ["snapshot"], ["run", "x.py"],
             ["check", "--config", str(write(tmp_path / "o", '[tool.capturelint]\nmode = "SIDEWAYS"\n'))],
             ["check", "--config", str(write(tmp_path / "v", '[tool.capturelint]\ncapture-sizes = [99]\nengine = "vllm"\n'))],
             ["check", "--config", str(write(tmp_path / "d", '[tool.capturelint]\nspec = "dspark"\nrunner = "v1"\n')),
              "--engine", "vllm"],
             ["check", "--engine", "vllm", "--kernels", "triton", "--config", str(write(tmp_path / "e", "[tool.capturelint]\n"))]]
    code = ("import json, sys\nfrom capturelint.cli import main\nout = []\n"
            f"for args in {cases!r}:\n    out.append([main(args), 'torch' in sys.modules])\n"
            "print(json.dumps(out), file=sys.__stdout__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert json.loads(done.stdout) == [[2, False]] * len(cases), done.stderr
    errors = done.stderr.splitlines()
    assert len(errors) == len(cases)
    assert errors[0].startswith("capturelint: error: pyproject.toml: [tool.capturelint] unknown key 'layrs'; did you "
                                "mean 'layers'?")
    assert "mode: unknown CUDA-graph mode 'SIDEWAYS'" in errors[4]
    assert errors[5].endswith("--capture-sizes 99: each must be at most 64 (the runner's max_num_batched_tokens)")
    assert errors[6].startswith("capturelint: error: --spec dspark needs --runner v2")
    assert errors[7] == ("capturelint: error: --kernels configures --engine bundled, and --engine vllm does not read "
                         "it, so it would be ignored; drop --kernels")
