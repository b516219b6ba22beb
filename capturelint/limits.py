"""The bounds of what the command line and ``[tool.capturelint]`` accept.

A value outside them is refused with a one-line error before anything runs, rather
than found out as an allocation failure or an overflow deep inside torch:

- **seeds** are unsigned 64-bit integers, what ``torch.Generator.manual_seed`` takes;
- **layers** and **steps** of the bundled engine are at most ``MAX_LAYERS`` and
  ``MAX_STEPS`` (DeepSeek V4 has 61 layers; the default workload runs 24 steps);
- an **input file** is at most as large as its kind ever is, and refused by its size
  before it is read (``capturelint.inputs``): a baseline (snapshot) ``MAX_SNAPSHOT_BYTES``
  (a snapshot of every runner and mode of a 61-layer engine is a few MiB), a report to
  merge ``MAX_REPORT_BYTES``, a settings or invariants file ``MAX_TOML_BYTES``; and its
  document is at most ``MAX_DEPTH`` levels deep (what capturelint writes is under 12).

No import here needs torch: settings and argument validation use these.
"""

from __future__ import annotations

SEED_MAX = 2**64 - 1
MAX_LAYERS = 256
MAX_STEPS = 4096
MAX_SNAPSHOT_BYTES = 64 * 2**20
MAX_REPORT_BYTES = 256 * 2**20
MAX_TOML_BYTES = 4 * 2**20
MAX_DEPTH = 64

_COUNT_MAX = {"layers": MAX_LAYERS, "steps": MAX_STEPS}


def count_problem(key: str, value: object) -> str | None:
    """Why ``value`` is not a valid ``layers`` or ``steps`` count, or ``None``."""
    maximum = _COUNT_MAX[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        return f"must be an integer from 1 to {maximum}"
    return None


def seed_problem(value: object) -> str | None:
    """Why ``value`` is not a valid seed, or ``None``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        return f"must be an integer from 0 to {SEED_MAX} (64 bits)"
    return None


__all__ = [
    "MAX_DEPTH", "MAX_LAYERS", "MAX_REPORT_BYTES", "MAX_SNAPSHOT_BYTES", "MAX_STEPS", "MAX_TOML_BYTES", "SEED_MAX", "count_problem",
    "seed_problem",
]


MAX_JOBS = 256


def jobs_problem(value: object) -> str | None:
    """Why ``value`` is not a valid ``jobs`` count, or ``None``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_JOBS:
        return f"must be an integer from 1 to {MAX_JOBS}"
    return None


def default_jobs() -> int:
    """Configurations checked at once by default: the cores this process may use."""
    import os

    try:
        return max(1, min(len(os.sched_getaffinity(0)), MAX_JOBS))
    except AttributeError:  # not Linux
        return max(1, min(os.cpu_count() or 1, MAX_JOBS))
