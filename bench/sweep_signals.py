"""Signal sweep over the start-up of a check (not a test; the outcomes go to
BENCHMARKS.md with the machine they were measured on).

Starts ``capturelint check`` (the console script's function, as ``[project.scripts]``
names it, or ``python -m capturelint``, alternately) again and again, sends it SIGINT
(or ``--signal``) after a delay drawn at random over the first ``--span`` seconds, and
counts the outcomes: the promise (docs/errors.md, "Signals") is exit status 130 and
exactly the one line ``capturelint: interrupted`` on standard error, whenever the signal
arrives after capturelint's first line ran (before it, the interpreter is starting and
the signal is Python's). The delay counts from that line: the moment the process
catches SIGTERM (``/proc/PID/status``, ``SigCgt``), which Python does not and
``capturelint.launch`` does. Anything else (a traceback, SIGABRT, another line, a
swallowed signal that lets the check finish) is listed with its delay.

    python bench/sweep_signals.py [--runs 50] [--span 9] [--seed 0] [--signal SIGINT]
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import random
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECK = ["check", "--runner", "v1", "--mode", "PIECEWISE", "--layers", "1", "--steps", "400"]  # outlasts the sweep


def entry_points() -> list[list[str]]:
    """The two ways the program starts: the console script's function and ``-m``."""
    script = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["capturelint"]
    module, function = script.split("#")[0].strip().split(":")
    console = f"import sys; from {module} import {function}; sys.argv[0] = 'capturelint'; sys.exit({function}())"
    return [[sys.executable, "-c", console], [sys.executable, "-m", "capturelint"]]


def handlers_installed(pid: int) -> bool:
    """Whether process ``pid`` catches SIGTERM (capturelint's first line ran)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True  # it ended
    caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.M).group(1), 16)
    return bool(caught >> (signal.SIGTERM - 1) & 1)


def env() -> dict[str, str]:
    """No progress lines (off a terminal they go to standard error): the interrupt's line alone."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "CAPTURELINT_QUIET": "1"}


def interrupt(command: list[str], delay: float, signum: int, cwd: Path | str = ROOT,
              timeout: float = 300) -> tuple[int | None, str]:
    """Run ``command``, send ``signum`` after ``delay`` seconds; its exit status (``None``:
    it had finished before the signal) and standard error."""
    process = subprocess.Popen(command, cwd=cwd, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        while not handlers_installed(process.pid):
            time.sleep(0.002)
        time.sleep(delay)
        sent = process.poll() is None
        if sent:
            process.send_signal(signum)
        _, err = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return (process.returncode if sent else None), err


def expected(signum: int) -> tuple[int, str]:
    return 128 + signum, "capturelint: interrupted\n" if signum == signal.SIGINT else "capturelint: terminated\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--span", type=float, default=9.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--signal", default="SIGINT", choices=("SIGINT", "SIGTERM", "SIGHUP"))
    args = parser.parse_args()
    signum = getattr(signal, args.signal)
    rng = random.Random(args.seed)
    commands = entry_points()
    status, line = expected(signum)
    outcomes: collections.Counter[str] = collections.Counter()
    broken = []
    for i in range(args.runs):
        delay = rng.uniform(0, args.span)
        code, err = interrupt([*commands[i % 2], *CHECK], delay, signum)
        if code is None:
            outcomes["finished before the signal"] += 1
        elif code == status and err == line:
            outcomes[f"{status} and one line"] += 1
        else:
            outcomes["broken"] += 1
            broken.append((round(delay, 2), "console" if i % 2 == 0 else "-m", code, err.strip()[-300:]))
    print(f"{platform.node()}: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}; python {platform.python_version()}")
    print(f"{args.runs} runs of capturelint {' '.join(CHECK)}, {args.signal} at a random moment in "
          f"the first {args.span} s after its first line (seed {args.seed})")
    for outcome, count in sorted(outcomes.items()):
        print(f"  {outcome}: {count}")
    for delay, how, code, err in broken:
        print(f"  BROKEN at {delay} s ({how}): exit {code}: {err!r}")
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()
