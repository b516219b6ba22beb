"""Test-wide settings.

The engine's tensors are tiny: one intra-op thread is fastest, and on a loaded two-core
machine OpenMP threads contending for cores make each op ~100x slower.

The suite already runs one pytest worker per core (pytest-xdist), so in-process checks
default to one job: forked workers would only contend with the other pytest worker, and
their runs would bypass the session memo of configurations below. Tests of ``--jobs``
pass it explicitly.

Progress is off (``CAPTURELINT_QUIET=1``, inherited by the commands tests start as
subprocesses): the suite's own output stays quiet and the tests that read stderr read
what the command says, not its progress. The tests of progress unset it.
"""

import os

os.environ["CAPTURELINT_QUIET"] = "1"

import torch

torch.set_num_threads(1)

import pytest


@pytest.fixture(autouse=True, scope="session")
def _lint_every_recorded_stream():
    from capturelint.records import lint_recorded

    lint_recorded(True)
    yield
    lint_recorded(False)


@pytest.fixture(autouse=True)
def _one_job_by_default(monkeypatch):
    import capturelint.adapters.registry as registry

    monkeypatch.setattr(registry, "default_jobs", lambda: 1)


@pytest.fixture(scope="session")
def _configuration_memo():
    return {}


@pytest.fixture
def cached_configurations(monkeypatch, _configuration_memo):
    """Run each bundled-engine configuration once per session: the checker is
    deterministic, so tests that ask for the same (plan, runner, mode) share it."""
    import capturelint.adapters.bundled.plan as bundled

    real = bundled.run_configuration

    import dataclasses

    def memo(plan, runner, mode, shadow=True, static=False):
        # which runners and modes a plan lists does not change one configuration's run
        key = (dataclasses.replace(plan, runners=(), modes=()), runner, mode, shadow, static)
        if key not in _configuration_memo:
            _configuration_memo[key] = real(plan, runner, mode, shadow=shadow, static=static)
        return _configuration_memo[key]

    monkeypatch.setattr(bundled, "run_configuration", memo)
    yield memo


@pytest.fixture
def real_configurations(monkeypatch):
    """Undo the memo: the test needs fresh runs (determinism)."""
    import capturelint.adapters.bundled.plan as bundled
    import importlib

    fresh = importlib.reload(bundled)
    monkeypatch.setattr(bundled, "run_configuration", fresh.run_configuration)
    yield


@pytest.fixture
def memo_runs(cached_configurations):
    """Alias used by the region tests: share engine runs of identical configurations."""
    yield
