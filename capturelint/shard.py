"""Shards of a check: ``check --shard K/N`` runs a deterministic 1/N of the
configurations, and ``capturelint merge`` joins the shards' reports into the one report
an unsharded check would have written.

The idea: the CI system is the distributed engine. A matrix of N jobs each runs one
shard; one job merges their reports and gives the verdict. Nothing here schedules.

**Which configurations a shard runs.** The configurations of a plan (or the targets of
``--target``), in report order, are dealt round-robin: shard K of N runs the ones at
positions K-1, K-1+N, K-1+2N, ... (0-based), so the N shards partition the plan and each
gets a mix of runners and modes. The same plan gives the same shards on every machine.

**What a shard's report carries.** Its JSON report has a top-level ``shard`` object,
and its SARIF log the same object in the run's ``properties``::

    "shard": {"index": 1, "count": 2,
              "configurations": ["v1/PIECEWISE", "v1/FULL", "v2/PIECEWISE", "v2/FULL"],
              "check": "5c0e9f3a1b7d2e48"}

``configurations`` lists every configuration of the whole plan, in report order, as
``runner/mode``: with it ``merge`` checks that the shards it is given are the complete
set of one check and restores the report order. ``check`` is the check's
``fingerprint``: a hash of everything that shapes its report (the resolved options and
settings: engine, runners, modes, eager region, layers, steps, seed, kernels, ...; the
rules selected; the invariants in force; static mode; the target; capturelint's
version), so shards of checks that differ in anything but the shard (another ``--seed``
with the same configuration labels) are refused by ``merge``. An unsharded report has
no ``shard``.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import re
from typing import Any, Sequence, TypeVar

from capturelint.errors import CapturelintError
from capturelint.lists import cut

T = TypeVar("T")

Shard = tuple[int, int]  # (K, N): this run is shard K of N, 1 <= K <= N

_SHARD = re.compile(r"([0-9]{1,9})/([0-9]{1,9})", re.ASCII)


def parse_shard(text: str) -> Shard:
    """``"2/4"`` -> ``(2, 4)``, or a one-line error saying what ``--shard`` takes."""
    m = _SHARD.fullmatch(text.strip())
    if m is None:
        raise CapturelintError(f"--shard takes K/N (run shard K of N, 1 <= K <= N), got {text!r}; e.g. --shard 1/4")
    k, n = int(m.group(1)), int(m.group(2))
    if n < 1:
        raise CapturelintError(f"--shard {text}: the number of shards N must be at least 1; e.g. --shard 1/4")
    if not 1 <= k <= n:
        raise CapturelintError(f"--shard {text}: the shard K must be from 1 to {n}; e.g. --shard 1/{n}")
    return k, n


def positions(total: int, shard: Shard) -> range:
    """The positions (0-based, in report order) of the configurations shard K of N runs."""
    k, n = shard
    return range(k - 1, total, n)


def select(items: Sequence[T], shard: Shard | None) -> list[T]:
    """The items of ``items`` that ``shard`` runs (all of them without a shard)."""
    if shard is None:
        return list(items)
    return [items[i] for i in positions(len(items), shard)]


def require_selection(shard: Shard, labels: Sequence[str], what: str = "configuration") -> None:
    """A shard that selects nothing is an error: a job that checks nothing must not pass."""
    if positions(len(labels), shard):
        return
    k, n = shard
    total = len(labels)
    raise CapturelintError(
        f"--shard {k}/{n} selects no {what}: there {'is' if total == 1 else 'are'} {total} {what}"
        f"{'s' * (total != 1)} ({cut(labels)}), so use at most {total} "
        f"shard{'s' * (total != 1)} (--shard K/{total})"
    )


def fingerprint(*parts: Any) -> str:
    """16 hex digits that stand for ``parts`` (records, enums, sets, paths and plain
    values, nested): equal parts give equal digits on every machine and in every process."""
    text = json.dumps(_canonical(parts), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _canonical(x: Any) -> Any:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):  # a field that takes no part in comparing, neither
        return {f.name: _canonical(getattr(x, f.name)) for f in dataclasses.fields(x) if f.compare}
    if isinstance(x, enum.Enum):
        return _canonical(x.value)
    if isinstance(x, dict):
        return {str(k): _canonical(v) for k, v in x.items()}
    if isinstance(x, (set, frozenset)):
        return sorted((_canonical(v) for v in x), key=repr)
    if isinstance(x, (list, tuple)):
        return [_canonical(v) for v in x]
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    return str(x)


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """What a shard's report says of its shard: ``index`` K of ``count`` N,
    ``configurations``, every configuration label of the whole plan in report order, and
    ``check``, the ``fingerprint`` of the check (module docstring)."""

    index: int
    count: int
    configurations: tuple[str, ...]
    check: str

    @property
    def shard(self) -> Shard:
        return (self.index, self.count)

    @property
    def expected(self) -> list[str]:
        """The labels this shard's report must hold, in order."""
        return select(self.configurations, self.shard)

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "count": self.count, "configurations": list(self.configurations), "check": self.check}

    @classmethod
    def from_json(cls, doc: Any) -> ShardInfo:
        """The inverse of ``to_json``; ``ValueError`` names what is malformed."""
        if not isinstance(doc, dict) or set(doc) != {"index", "count", "configurations", "check"}:
            raise ValueError("shard must be an object with index, count, configurations and check")
        index, count, labels, check = doc["index"], doc["count"], doc["configurations"], doc["check"]
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (index, count)) or not 1 <= index <= count:
            raise ValueError(f"shard index {index!r} of count {count!r} is not 1 <= index <= count")
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels) or len(labels) < count:
            raise ValueError("shard configurations must list at least count configuration labels")
        if not isinstance(check, str) or not check:
            raise ValueError("shard check must be the check's fingerprint (a string)")
        return cls(index, count, tuple(labels), check)


__all__ = ["Shard", "ShardInfo", "fingerprint", "parse_shard", "positions", "require_selection", "select"]
