"""A pytest plug-in that prints each test's CPU time: what a loaded machine cannot blur
(wall time on a shared two-core machine grows with everyone else's work; CPU seconds
barely do). Not a test and not installed: load it by name from bench/.

    PYTHONPATH=bench python -m pytest -p pytest_cpu -n 0 -q tests/test_jobs.py [-m slow]

At the end of the session it prints one line per test, the costliest first: CPU seconds
(user + system, of the test's process and of the subprocesses and workers it waited
for), wall seconds, the test; then the totals, and the totals per file. Run it with
``-n 0``: under xdist each worker would print its own share.

``--cpu-write`` also stores each file's CPU seconds in ``tests/data/file_cpu.json``
(merged: the files not run keep their figures), which ``tests/conftest.py`` reads to
hand the costliest files to the two xdist workers first::

    PYTHONPATH=bench python -m pytest -p pytest_cpu -n 0 -q --cpu-write tests/vllm
"""

from __future__ import annotations

import json
import resource
import time
from collections import defaultdict
from pathlib import Path

import pytest

_rows: list[tuple[float, float, str]] = []
FILE_CPU = Path(__file__).resolve().parent.parent / "tests" / "data" / "file_cpu.json"


def pytest_addoption(parser) -> None:
    parser.addoption("--cpu-write", action="store_true", default=False,
                     help=f"store each file's CPU seconds in {FILE_CPU.relative_to(FILE_CPU.parents[2])} (merged)")


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
    if terminalreporter.config.getoption("cpu_write"):
        known = json.loads(FILE_CPU.read_text()) if FILE_CPU.exists() else {}
        known.update({path: round(cpu, 1) for path, (cpu, _) in per_file.items()})
        FILE_CPU.write_text(json.dumps(dict(sorted(known.items())), indent=1) + "\n")
        write(f"wrote {FILE_CPU} ({len(per_file)} files of {len(known)})")
