"""The pytest plugin (``capturelint.pytest_plugin``): a project's test fails with the
findings to read, passes when clean, and compares with a baseline. The projects run in
``pytester`` with the plugin named by ``-p`` (the entry point registers it once the
package is installed; a test reads that it is declared), in this process (a session of
their own, without the import of torch and the engine that a subprocess pays again); a
fresh ``python -m pytest`` process loading the plugin by its entry point is
``test_own_engine.py``'s plugin test."""

from __future__ import annotations

import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from capturelint.cli import main

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
# named by -p until the installed package's entry point registers it (twice is an error)
INSTALLED = any(e.value == "capturelint.pytest_plugin" for e in entry_points(group="pytest11"))
PLUGIN = [*([] if INSTALLED else ["-p", "capturelint.pytest_plugin"]), "-p", "no:cacheprovider", "-n", "0"]


def run(pytester: pytest.Pytester, source: str, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_regions=source)
    return pytester.runpytest_inprocess(*PLUGIN, *args)


def test_the_entry_point_is_declared():
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert doc["project"]["entry-points"]["pytest11"] == {"capturelint": "capturelint.pytest_plugin"}


def test_a_failing_project_shows_the_findings(pytester):
    result = run(pytester, """
        def test_regions(capturelint_check):
            capturelint_check.check(runner="v1", eager_region="narrow", modes="PIECEWISE", layers=1, steps=6,
                              jobs=1).assert_clean()
    """)
    result.assert_outcomes(failed=1)
    text = result.stdout.str()
    assert "AssertionError: " in text
    assert "capturelint/engine/dsv4/attention.py:302: CL101 replay re-issues the recorded ops" in text  # its branch
    assert "  fix: Move the branching code into an eager break" in text
    assert "v1/PIECEWISE (eager region narrow)" in text


def test_a_passing_project_with_a_marker(pytester):
    result = run(pytester, """
        import pytest

        @pytest.mark.capturelint(runner="v2", modes="PIECEWISE", layers=1, steps=6, jobs=1)
        def test_regions(capturelint_check):
            report = capturelint_check.check()
            report.assert_clean()
            assert [c.label for c in report.configs] == ["v2/PIECEWISE"]
    """, "--strict-markers")
    result.assert_outcomes(passed=1)


def test_a_baseline_fails_on_eager_growth(pytester):
    """v2's regions recorded narrow; checked wide, eager ops per step grow over the
    budget: the check fails with the region changes, by --capturelint-baseline or by
    the call."""
    small = ["--runner", "v2", "--mode", "PIECEWISE", "--layers", "1", "--steps", "6", "--jobs", "1"]
    assert main(["snapshot", *small, "-o", str(pytester.path / "regions.json")]) == 0
    source = """
        import pytest

        OPTIONS = dict(runner="v2", modes="PIECEWISE", layers=1, steps=6, jobs=1)

        def test_same_regions(capturelint_check):
            capturelint_check.check(**OPTIONS).assert_clean()

        def test_wider_region(capturelint_check):
            capturelint_check.check(eager_region="wide", **OPTIONS).assert_clean()

        @pytest.mark.capturelint(baseline="regions.json", max_eager_growth=1000)
        def test_within_budget(capturelint_check):
            capturelint_check.check(eager_region="wide", **OPTIONS).assert_clean()
    """
    result = run(pytester, source, "--capturelint-baseline", "regions.json")
    result.assert_outcomes(passed=2, failed=1)
    text = result.stdout.str()
    assert "FAILED test_regions.py::test_wider_region" in text
    assert "regions: " in text and "eager ops per step" in text
    without = run(pytester, source)
    without.assert_outcomes(passed=3)


def test_a_bad_option_is_a_capturelint_error(pytester):
    result = run(pytester, """
        import pytest
        from capturelint.errors import CapturelintError

        def test_regions(capturelint_check):
            with pytest.raises(CapturelintError, match="unknown"):
                capturelint_check.check(runner="v9")
    """)
    result.assert_outcomes(passed=1)


def test_a_markers_unknown_option_or_bad_value_is_named_before_anything_runs(pytester):
    result = run(pytester, """
        import pytest

        @pytest.mark.capturelint(bogus=1)
        def test_unknown(capturelint_check):
            capturelint_check.check()

        @pytest.mark.capturelint(layers="2")
        def test_bad_value(capturelint_check):
            capturelint_check.check()
    """)
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*UsageError: @pytest.mark.capturelint(...) has no option 'bogus'; its options are *",
                                 "*UsageError: layers must be an integer from 1 to 256, got '2'*"])
    assert "TypeError" not in result.stdout.str()
