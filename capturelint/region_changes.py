"""Region changes: what moved between captured and eager segments from one region map
to another, per configuration, and whether eager growth stays within a budget.

The comparison model of the pre-merge gate and of ``capturelint diff``; snapshots
(``capturelint.snapshot``) compute it, renderers (``capturelint.render.changes``) draw
it. It imports neither.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Sequence

from capturelint.runtime.protocol import SegmentKind

LIST_CUT = 5

class Direction(enum.Enum):
    TO_EAGER = "to eager"
    TO_CAPTURED = "to captured"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class MovedOp:
    """Ops of one scope that moved between captured and eager segments: ``count`` over
    all paired graphs, ``graphs`` how many of them."""

    scope: str
    op: str
    direction: Direction
    count: int
    graphs: int

    def to_json(self) -> dict[str, Any]:
        return {"scope": self.scope, "op": self.op, "direction": str(self.direction), "count": self.count, "graphs": self.graphs}


@dataclasses.dataclass(frozen=True)
class SegmentChange:
    """Segments of one kind and break name added or removed: ``count`` over all paired
    graphs, ``graphs`` how many of them."""

    kind: SegmentKind
    name: str | None
    count: int
    graphs: int

    @property
    def label(self) -> str:
        return f"eager break {self.name}" if self.kind is SegmentKind.EAGER else "captured segment"

    def to_json(self) -> dict[str, Any]:
        return {"kind": str(self.kind), "break": self.name, "count": self.count, "graphs": self.graphs}


@dataclasses.dataclass(frozen=True)
class ConfigChange:
    """One pair of configurations: before (baseline / left) and after (run / right)."""

    before: str
    after: str
    region_before: str
    region_after: str
    eager_ops_before: float
    eager_ops_after: float
    moved: tuple[MovedOp, ...]
    segments_added: tuple[SegmentChange, ...]
    segments_removed: tuple[SegmentChange, ...]
    graphs_added: tuple[str, ...]
    graphs_removed: tuple[str, ...]
    max_growth_pct: float | None

    @property
    def label(self) -> str:
        return self.after if self.before == self.after else f"{self.before} -> {self.after}"

    @property
    def growth_pct(self) -> float | None:
        """Relative change of eager ops per step in percent; ``None`` when it grew from 0."""
        if self.eager_ops_before == 0:
            return 0.0 if self.eager_ops_after == 0 else None
        return (self.eager_ops_after - self.eager_ops_before) * 100.0 / self.eager_ops_before

    @property
    def over_budget(self) -> bool:
        if self.max_growth_pct is None:
            return False
        g = self.growth_pct
        return g is None or g > self.max_growth_pct + 1e-9

    @property
    def changed(self) -> bool:
        return bool(
            self.moved or self.segments_added or self.segments_removed or self.graphs_added or self.graphs_removed
            or self.eager_ops_before != self.eager_ops_after
        )

    def moved_count(self, direction: Direction) -> int:
        return sum(m.count for m in self.moved if m.direction is direction)

    def describe_growth(self) -> str:
        g = self.growth_pct
        pct = "unbounded" if g is None else f"{g:+.1f}%"
        return f"{_num(self.eager_ops_before)} -> {_num(self.eager_ops_after)} ({pct})"

    def to_json(self) -> dict[str, Any]:
        g = self.growth_pct
        return {
            "before": self.before,
            "after": self.after,
            "eager_region": {"before": self.region_before, "after": self.region_after},
            "eager_ops_per_step": {"before": self.eager_ops_before, "after": self.eager_ops_after},
            "growth_pct": None if g is None else round(g, 2),
            "over_budget": self.over_budget,
            "moved": [m.to_json() for m in self.moved],
            "segments_added": [s.to_json() for s in self.segments_added],
            "segments_removed": [s.to_json() for s in self.segments_removed],
            "graphs_added": list(self.graphs_added),
            "graphs_removed": list(self.graphs_removed),
        }


@dataclasses.dataclass(frozen=True)
class RegionChanges:
    """What changed between two region maps (see the module docstring)."""

    configs: tuple[ConfigChange, ...]
    new_configs: tuple[str, ...]  # only on the after side: listed, never failed
    missing_configs: tuple[str, ...]  # only on the before side: not run this time
    max_growth_pct: float | None
    notes: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        return any(c.over_budget for c in self.configs)

    @property
    def changed(self) -> bool:
        return any(c.changed for c in self.configs) or bool(self.new_configs or self.missing_configs)

    def to_json(self) -> dict[str, Any]:
        return {
            "failed": self.failed,
            "max_eager_growth_pct": self.max_growth_pct,
            "configurations": [c.to_json() for c in self.configs],
            "new_configurations": list(self.new_configs),
            "missing_configurations": list(self.missing_configs),
            "notes": list(self.notes),
        }

    def summary_line(self) -> str:
        changed = [c for c in self.configs if c.changed]
        n = len(self.configs)
        if not changed:
            line = f"regions unchanged in {n} configuration{'s' * (n != 1)}"
        else:
            to_eager = sum(c.moved_count(Direction.TO_EAGER) for c in changed)
            to_captured = sum(c.moved_count(Direction.TO_CAPTURED) for c in changed)
            growth = cut([f"{c.label} {c.describe_growth()}" for c in changed if c.eager_ops_before != c.eager_ops_after])
            line = (
                f"regions changed in {len(changed)} of {n} configuration{'s' * (n != 1)}: "
                f"{to_eager} op{'s' * (to_eager != 1)} moved to eager, {to_captured} to captured"
            )
            if growth:
                line += f"; eager ops per step {growth}"
        over = [c.label for c in self.configs if c.over_budget]
        if over:
            line += (
                f"; eager growth over the {_num(self.max_growth_pct or 0)}% budget in {cut(over)} (more ops re-run "
                "outside the graph on every replay); accept an intended change with `capturelint snapshot --update "
                "BASELINE` or raise --max-eager-growth"
            )
        if self.new_configs:
            line += f"; new (not in the baseline): {cut(list(self.new_configs))}"
        if self.missing_configs:
            line += f"; not run: {cut(list(self.missing_configs))}"
        return line


def _num(x: float) -> str:
    return f"{x:g}" if x != int(x) else str(int(x))


def cut(items: Sequence[str], limit: int = LIST_CUT) -> str:
    """``a, b, c, d, e ... and 3 more``."""
    head = ", ".join(items[:limit])
    return head + (f" ... and {len(items) - limit} more" if len(items) > limit else "")
