"""The Python API (``capturelint.api``): the verdicts of ``capturelint check`` as a report
object, ``assert_clean()`` with the findings to read, and the CLI's one-line errors as
``CapturelintError``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from capturelint import api
from capturelint.cli import main
from capturelint.errors import CapturelintError

SMALL = dict(modes="PIECEWISE", layers=1, steps=6, jobs=1)


def test_narrow_v1_reports_cl101_and_assert_clean_names_it(cached_configurations):
    report = api.check(runner="v1", eager_region="narrow", **SMALL)
    assert "CL101" in {f.code for f in report.findings}
    assert [c.label for c in report.configs] == ["v1/PIECEWISE"]
    assert report.configs[0].checked.with_eager and report.failed
    with pytest.raises(AssertionError) as info:
        report.assert_clean()
    text = str(info.value)
    # one entry per problem, as the terminal report prints it: where, what, why, fix
    (cl101,) = [g for g in report.groups if g.code == "CL101"]
    assert f"\n{cl101.line()}\n  why: {cl101.parts.why}\n  fix: {cl101.parts.fix}\n" in text
    assert "capturelint/engine/dsv4/attention.py:302: CL101 replay re-issues the recorded ops" in text  # its branch
    assert "[model.layers.0.attn; mixed/32 in v1/PIECEWISE]" in text
    assert "compared:\n  v1/PIECEWISE (eager region narrow): rules CL101-CL107" in text
    assert text.endswith(report.summary_line())


def test_v2_is_clean(cached_configurations):
    report = api.check(runner="v2", **SMALL)
    assert report.findings == [] and not report.failed
    assert [(c.label, c.eager_region) for c in report.configs] == [("v2/PIECEWISE", "narrow")]
    report.assert_clean()  # does not raise
    assert report.summary_line() == "no findings in 1 configuration: replay matches eager execution [engine bundled]"


def test_the_api_report_is_the_cli_report(cached_configurations, capsys):
    """Same options, same JSON: the CLI is a layer over the API."""
    assert main(["check", "--runner", "v1", "--eager-region", "narrow", "--mode", "PIECEWISE", "--layers", "1",
                 "--steps", "6", "--format", "json"]) == 1
    cli = json.loads(capsys.readouterr().out)
    report = api.check(runner="v1", eager_region="narrow", **SMALL)
    assert cli["findings"] == report.to_json()["findings"]
    assert cli["configurations"] == report.to_json()["configurations"]


def test_options_take_the_parsed_values_too(cached_configurations):
    from capturelint.options import CUDAGraphMode, EagerRegion, Runner

    spelled = api.check(runner="v1", eager_region="narrow", **SMALL)
    parsed = api.check(runner=(Runner.V1,), eager_region=EagerRegion.NARROW, modes=(CUDAGraphMode.PIECEWISE,),
                       layers=1, steps=6, jobs=1)
    assert parsed.to_json() == spelled.to_json()
    only = api.check(runner="v1", eager_region="narrow", select="CL2", **SMALL)
    assert {f.code for f in only.findings} == {"CL201"}


def test_a_target():
    report = api.check(target="tests/toy_engine.py:stale_targets", jobs=1)
    assert [(f.code, f.mode) for f in report.findings] == [("CL104", "FULL"), ("CL104", "PIECEWISE")]
    with pytest.raises(AssertionError, match=r"tests/toy_engine\.py:\d+: CL104 "):
        report.assert_clean()
    api.check(target="tests/toy_engine.py:fixed_targets", jobs=1).assert_clean()


@pytest.mark.parametrize(
    "options, needle",
    [
        (dict(runner="v9"), "v9"),
        (dict(modes="SIDEWAYS"), "SIDEWAYS"),
        (dict(modes="NONE"), "mode NONE captures no CUDA graph"),
        (dict(static=True, require_oracle=True), "drop one of them"),
        (dict(target="tests/toy_engine.py:fixed_targets", layers=1), "drop layers"),  # named as the API spells it
        (dict(target="tests/missing.py:targets"), "no file tests/missing.py"),
        (dict(max_eager_growth=5), "no baseline is given"),
        (dict(baseline="no/such/regions.json"), "no/such/regions.json"),
    ],
)
def test_bad_options_raise_capturelint_error(options, needle):
    with pytest.raises(CapturelintError, match=None) as info:
        api.check(**options)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_suggest_checks_its_options_before_running():
    with pytest.raises(CapturelintError, match="^max_candidates must be an integer from 1 to 1000, got 0$"):
        api.suggest(runner="v1", max_candidates=0)


def test_show_keeps_the_captures(cached_configurations):
    report = api.show(runner="v2", modes="PIECEWISE", layers=1, steps=6, jobs=1, no_check=True)
    [config] = report.configs
    assert config.captures and config.graphs and report.findings == []


def test_importing_the_api_and_the_plugin_loads_no_torch():
    code = "import sys, capturelint.api, capturelint.pytest_plugin; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120).stdout
    assert out.strip() == "False"


def test_suggest_default_is_the_searchs():
    import inspect

    from capturelint import suggest

    assert inspect.signature(api.suggest).parameters["max_candidates"].default == suggest.DEFAULT_MAX_CANDIDATES
    assert inspect.signature(api.suggest_with).parameters["max_candidates"].default == suggest.DEFAULT_MAX_CANDIDATES


@pytest.mark.parametrize("call, options, message", [
    ("check", dict(runner=1), "runner must be v1, v2 or all or a list of them, got 1"),
    ("check", dict(modes=5), "modes must be a CUDA-graph mode ("),
    ("check", dict(select=5), "select must be a list of rule codes, got 5"),
    ("check", dict(select=[]), "select is an empty list; list at least one rule code"),
    ("check", dict(config=123), "config must be a path (a non-empty string), got 123"),
    ("check", dict(invariants=5), "invariants must be a path (a non-empty string), got 5"),
    ("check", dict(max_eager_growth="x"), "max_eager_growth must be a percentage (a number >= 0), got 'x'"),
    ("check", dict(jobs="2"), "jobs must be an integer from 1 to 256, got '2'"),
    ("check", dict(capture_sizes="2,x", engine="vllm"), "capture_sizes takes positive integers separated by commas"),
    ("check", dict(bogus=1), "check() has no option 'bogus'; its options are accept_findings, baseline,"),
    ("check", dict(mode="FULL", modes="FULL"), "check() got mode twice (also as modes); give it once"),
    ("check", dict(engine="vllm", kernels="triton"), "kernels configures engine='bundled', and engine='vllm' does not "
                                                      "read it, so it would be ignored; drop kernels"),
    ("show", dict(runner=object()), "runner must be v1, v2 or all or a list of them"),
    ("show", dict(no_check="yes"), "no_check must be true or false, got 'yes'"),
    ("suggest", dict(max_candidates="x"), "max_candidates must be an integer from 1 to 1000, got 'x'"),
    ("suggest", dict(bogus=1), "suggest() has no option 'bogus'"),
])
def test_the_api_names_a_bad_option_as_it_spells_it(call, options, message):
    # CapturelintError, never TypeError; the keyword as given here, not the flag
    with pytest.raises(CapturelintError) as info:
        getattr(api, call)(**options)
    text = str(info.value)
    assert message in text and "\n" not in text and "--" not in text

