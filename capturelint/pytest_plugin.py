"""The pytest plugin (entry point ``pytest11``): a project checks its CUDA graphs in its
own test suite with one test::

    def test_regions(capturelint_check):
        capturelint_check.assert_clean()          # the targets of pyproject.toml

    def test_bundled(capturelint_check):
        capturelint_check.check(engine="bundled", runner="all", layers=1, steps=6).assert_clean()

The ``capturelint_check`` fixture's ``check``, ``show`` and ``suggest`` are those of
``capturelint.api`` (same options as the command line, the report returned; ``targets=``
takes ``Target`` objects or a function returning them); ``assert_clean(**options)``
checks and fails the test with the findings grouped by problem (``path:line: CODE
message``, why, fix) and what was compared, with no traceback through capturelint. A
failing ``report.assert_clean()`` says the same, capturelint's own frames hidden
(``__tracebackhide__``). Options every call of a test shares go in its marker,
``@pytest.mark.capturelint(targets=[...], baseline="regions.json")``; a call's own
keyword arguments win. A baseline (``baseline="regions.json"``, or
``--capturelint-baseline FILE`` for every check of the run) compares the regions as
``check --baseline`` does: ``assert_clean()`` fails when eager ops per step grow over
``max_eager_growth`` percent.

**Which project.** Settings are read as the command line reads them, from the nearest
``pyproject.toml`` with a ``[tool.capturelint]`` table above the working directory; when
there is none (pytest started outside the project), from pytest's root folder's.
Relative paths (``target=``, ``baseline=``) are read against the project root, so a test
passes or fails the same from wherever pytest was started.

The fixture was called ``capturelint`` before, which shadowed the package inside a test;
that name still works, with a ``DeprecationWarning``. Loading the plugin imports neither
torch nor an engine: a test suite that never asks for the fixture pays nothing.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("capturelint")
    group.addoption("--capturelint-baseline", metavar="FILE", default=None,
                    help="Region map (capturelint snapshot) that every capturelint_check.check() of the run compares "
                         "with, as check --baseline does, unless the call or its marker names another.")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "capturelint(**options): options of every capturelint_check fixture call in the test (e.g. "
                   "targets=[...], engine='vllm', baseline='regions.json'); a call's own options win.")


class CapturelintCheck:
    """The ``capturelint_check`` fixture: ``capturelint.api`` with the test's marker
    options (and ``--capturelint-baseline``) as defaults, and ``config`` the project's
    settings file when the working directory has none."""

    def __init__(self, defaults: dict[str, Any], baseline: str | None, config: str | None = None):
        self.defaults = defaults
        self.baseline = baseline
        self.config = config

    def _options(self, options: dict[str, Any]) -> dict[str, Any]:
        merged = {**self.defaults, **options}
        if self.config is not None and merged.get("config") is None:
            merged["config"] = self.config
        return merged

    def check(self, **options: Any) -> Any:
        """``capturelint.api.check`` (the ``capturelint.report.Report``)."""
        __tracebackhide__ = True
        from capturelint import api

        merged = self._options(options)
        if self.baseline is not None and "baseline" not in merged:
            merged["baseline"] = self.baseline
        return api.check(**merged)

    def assert_clean(self, **options: Any) -> Any:
        """Check and fail the test, without a traceback, with the findings grouped by
        problem and what was compared (``Report.failure_text``); the report when clean."""
        __tracebackhide__ = True
        report = self.check(**options)
        if report.failed:
            pytest.fail(report.failure_text(), pytrace=False)
        return report

    def show(self, **options: Any) -> Any:
        """``capturelint.api.show`` (the report with its captures)."""
        __tracebackhide__ = True
        from capturelint import api

        return api.show(**self._engine(self._options(options)))

    def suggest(self, **options: Any) -> Any:
        """``capturelint.api.suggest`` (the ``capturelint.suggest.SuggestReport``)."""
        __tracebackhide__ = True
        from capturelint import api

        return api.suggest(**self._engine(self._options(options)))

    @staticmethod
    def _engine(options: dict[str, Any]) -> dict[str, Any]:
        """A marker's check-only options (a baseline and its budget) do not apply to
        show and suggest."""
        return {k: v for k, v in options.items() if k not in ("baseline", "max_eager_growth")}


Capturelint = CapturelintCheck  # the name of earlier versions


def _project_config(rootpath: Path) -> str | None:
    """pytest's root folder's ``pyproject.toml`` when the working directory is in no
    project with a ``[tool.capturelint]`` table (``None``: the API's own search)."""
    from capturelint.settings import find_config

    if find_config(Path.cwd()) is not None:
        return None
    found = find_config(rootpath)
    return str(found[0]) if found is not None and found[0].parent == rootpath.resolve() else None


def _fixture(request: pytest.FixtureRequest) -> CapturelintCheck:
    from capturelint import api
    from capturelint.errors import CapturelintError

    defaults: dict[str, Any] = {}
    for marker in reversed(list(request.node.iter_markers("capturelint"))):  # the closest marker last: it wins
        if marker.args:
            raise pytest.UsageError("@pytest.mark.capturelint takes keyword options only, e.g. "
                                    "@pytest.mark.capturelint(runner='all')")
        try:  # parsed as check() parses its keywords: an unknown one or a bad value is named here
            api.check_options("@pytest.mark.capturelint(...)", **marker.kwargs)
        except CapturelintError as e:
            raise pytest.UsageError(str(e)) from None
        defaults.update(marker.kwargs)
    try:
        config = _project_config(Path(request.config.rootpath))
    except CapturelintError as e:
        raise pytest.UsageError(str(e)) from None
    return CapturelintCheck(defaults, request.config.getoption("capturelint_baseline"), config)


@pytest.fixture
def capturelint_check(request: pytest.FixtureRequest) -> CapturelintCheck:
    """capturelint's check, show and suggest; see ``capturelint.pytest_plugin``."""
    return _fixture(request)


@pytest.fixture
def capturelint(request: pytest.FixtureRequest) -> CapturelintCheck:
    """Deprecated: the ``capturelint_check`` fixture under its old name, which shadows
    the ``capturelint`` package inside a test."""
    warnings.warn("the capturelint fixture is now called capturelint_check (the old name shadows the capturelint "
                  "package); rename it in your test", DeprecationWarning, stacklevel=2)
    return _fixture(request)
