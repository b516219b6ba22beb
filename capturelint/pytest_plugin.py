"""The pytest plugin (entry point ``pytest11``): a project checks its CUDA graphs in its
own test suite with one test::

    def test_regions(capturelint):
        capturelint.check(runner="all", layers=1, steps=6).assert_clean()

The ``capturelint`` fixture's ``check``, ``show`` and ``suggest`` are those of
``capturelint.api`` (same options as the command line, the report returned); a failing
``assert_clean()`` fails the test with the findings (``path:line: CODE message``) and
what was compared. Options every call of a test shares go in its marker,
``@pytest.mark.capturelint(engine="vllm", baseline="regions.json")``; a call's own
keyword arguments win. A baseline (``baseline="regions.json"``, or
``--capturelint-baseline FILE`` for every check of the run) compares the regions as
``check --baseline`` does: ``assert_clean()`` fails when eager ops per step grow over
``max_eager_growth`` percent.

Loading the plugin imports neither torch nor an engine: a test suite that never asks for
the fixture pays nothing.
"""

from __future__ import annotations

from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("capturelint")
    group.addoption("--capturelint-baseline", metavar="FILE", default=None,
                    help="Region map (capturelint snapshot) that every capturelint.check() of the run compares "
                         "with, as check --baseline does, unless the call or its marker names another.")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "capturelint(**options): options of every capturelint fixture call in the test (e.g. "
                   "engine='vllm', baseline='regions.json'); a call's own options win.")


class Capturelint:
    """The ``capturelint`` fixture: ``capturelint.api`` with the test's marker options
    (and ``--capturelint-baseline``) as defaults."""

    def __init__(self, defaults: dict[str, Any], baseline: str | None):
        self.defaults = defaults
        self.baseline = baseline

    def check(self, **options: Any) -> Any:
        """``capturelint.api.check`` (the ``capturelint.report.Report``)."""
        from capturelint import api

        merged = {**self.defaults, **options}
        if self.baseline is not None and "baseline" not in merged and merged.get("target") is None:
            merged["baseline"] = self.baseline
        return api.check(**merged)

    def show(self, **options: Any) -> Any:
        """``capturelint.api.show`` (the report with its captures)."""
        from capturelint import api

        return api.show(**self._engine({**self.defaults, **options}))

    def suggest(self, **options: Any) -> Any:
        """``capturelint.api.suggest`` (the ``capturelint.suggest.SuggestReport``)."""
        from capturelint import api

        return api.suggest(**self._engine({**self.defaults, **options}))

    @staticmethod
    def _engine(options: dict[str, Any]) -> dict[str, Any]:
        """A marker's check-only options (a baseline and its budget) do not apply to
        show and suggest."""
        return {k: v for k, v in options.items() if k not in ("baseline", "max_eager_growth")}


@pytest.fixture
def capturelint(request: pytest.FixtureRequest) -> Capturelint:
    """capturelint's check, show and suggest; see ``capturelint.pytest_plugin``."""
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
    return Capturelint(defaults, request.config.getoption("capturelint_baseline"))
