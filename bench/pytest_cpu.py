"""A pytest plug-in that prints each test's CPU time: what a loaded machine cannot blur
(wall time on a shared two-core machine grows with everyone else's work; CPU seconds
barely do). Not a test and not installed: load it by name from bench/.

    PYTHONPATH=bench python -m pytest -p pytest_cpu -n 0 -q tests/test_jobs.py [-m slow]

At the end of the session it prints one line per test, the costliest first: CPU seconds
(user + system, of the test's process and of the subprocesses and workers it waited
for), wall seconds, the test; then the totals, and the totals per file. Run it with
``-n 0``: under xdist each worker would print its own share.
"""

from __future__ import annotations

import resource
import time
from collections import defaultdict

import pytest

_rows: list[tuple[float, float, str]] = []


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    waited = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + waited.ru_utime + waited.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, wall = _cpu(), time.perf_counter()
    yield
    _rows.append((_cpu() - cpu, time.perf_counter() - wall, item.nodeid))


def pytest_terminal_summary(terminalreporter) -> None:
    if not _rows:
        return
    write = terminalreporter.write_line
    terminalreporter.section("CPU seconds per test (bench/pytest_cpu.py)")
    for cpu, wall, node in sorted(_rows, reverse=True):
        write(f"{cpu:8.2f} {wall:8.2f}  {node}")
    per_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for cpu, wall, node in _rows:
        per_file[node.split("::")[0]][0] += cpu
        per_file[node.split("::")[0]][1] += wall
    write(f"total: {sum(r[0] for r in _rows):.1f} s CPU, {sum(r[1] for r in _rows):.1f} s wall, {len(_rows)} tests")
    for path, (cpu, wall) in sorted(per_file.items(), key=lambda kv: -kv[1][0]):
        write(f"{cpu:8.2f} {wall:8.2f}  {path}")
