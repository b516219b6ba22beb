"""Region changes: what moved between captured and eager segments from one region map
to another, per configuration, and whether eager growth stays within a budget.

The comparison of the pre-merge gate (``capturelint.baseline``) and of ``capturelint
diff``: the change records, and the functions that compute them from two region maps
(``capturelint.snapshot``'s records). Renderers (``capturelint.render.changes``) draw
them; this module imports no renderer.

**Comparing.** Configurations pair up by runner and mode (``check --baseline``,
``diff OLD NEW``), or by position when two plans that differ in one option are
compared (``diff --against-...``). Within a pair, graphs pair up by batch descriptor and
runtime mode. For each pair of graphs and each ``(scope, op)``, ops *moved* to eager are
those whose eager count rose while their captured count fell by at least as much (and
the converse for moved to captured). Segments are matched in order on ``(kind, break
name)``; unmatched ones are *added* or *removed*. The *growth* of a configuration is
the relative change of its eager ops per step, in percent; from 0 to more than 0 it is
unbounded (``growth_pct: null``). ``RegionChanges.failed`` is true when the growth of any
configuration present on both sides exceeds the budget; configurations new in the run
are listed, never failed.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
from collections import Counter, defaultdict
from typing import Any, Iterable

from capturelint.errors import CapturelintError
from capturelint.lists import cut
from capturelint.regions import GraphMap
from capturelint.runtime.protocol import SegmentKind
from capturelint.snapshot import ConfigMap, EngineParams, RegionMap, natural


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




# ------------------------------------------------------------------ computing

@dataclasses.dataclass(frozen=True)
class GraphDiff:
    """The changes between two graphs with the same descriptor and runtime mode:
    ``moved`` ``(scope, op, direction) -> count``; indices of the segments of ``old``
    that were removed and of ``new`` that were added."""

    moved: dict[tuple[str, str, Direction], int]
    removed: tuple[int, ...]
    added: tuple[int, ...]


def graph_diff(old: GraphMap, new: GraphMap) -> GraphDiff:
    a, b = old.op_counts(), new.op_counts()
    moved: dict[tuple[str, str, Direction], int] = {}
    for key in sorted(set(a) | set(b)):
        c0, e0 = a.get(key, (0, 0))
        c1, e1 = b.get(key, (0, 0))
        to_eager = min(max(e1 - e0, 0), max(c0 - c1, 0))
        to_captured = min(max(c1 - c0, 0), max(e0 - e1, 0))
        if to_eager:
            moved[(key[0], key[1], Direction.TO_EAGER)] = to_eager
        if to_captured:
            moved[(key[0], key[1], Direction.TO_CAPTURED)] = to_captured
    ka = [s.key for s in old.segments]
    kb = [s.key for s in new.segments]
    removed: list[int] = []
    added: list[int] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, ka, kb, autojunk=False).get_opcodes():
        if tag in ("delete", "replace"):
            removed.extend(range(i1, i2))
        if tag in ("insert", "replace"):
            added.extend(range(j1, j2))
    return GraphDiff(moved, tuple(removed), tuple(added))


def _segment_changes(counts: dict[tuple[str, str | None], list[int]]) -> tuple[SegmentChange, ...]:
    return tuple(
        SegmentChange(SegmentKind(kind), name, n, g)
        for (kind, name), (n, g) in sorted(counts.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))
    )


def compare_configs(old: ConfigMap, new: ConfigMap, max_growth_pct: float | None) -> ConfigChange:
    """The changes from ``old`` to ``new``, graphs paired by descriptor and runtime mode."""
    old_graphs = {g.key: g for g in old.graphs}
    new_graphs = {g.key: g for g in new.graphs}
    moved: dict[tuple[str, str, Direction], list[int]] = defaultdict(lambda: [0, 0])
    added: dict[tuple[str, str | None], list[int]] = defaultdict(lambda: [0, 0])
    removed: dict[tuple[str, str | None], list[int]] = defaultdict(lambda: [0, 0])
    for key in sorted(set(old_graphs) & set(new_graphs), key=lambda k: (k[1], natural(k[0]))):
        gd = graph_diff(old_graphs[key], new_graphs[key])
        a = Counter(new_graphs[key].segments[i].key for i in gd.added)
        r = Counter(old_graphs[key].segments[i].key for i in gd.removed)
        for k, n in gd.moved.items():
            moved[k][0] += n
            moved[k][1] += 1
        for target, counter in ((added, a), (removed, r)):
            for k, n in counter.items():
                target[k][0] += n
                target[k][1] += 1
    moved_ops = tuple(
        MovedOp(scope, op, d, n, g)
        for (scope, op, d), (n, g) in sorted(moved.items(), key=lambda kv: (kv[0][2].value, natural(kv[0][0]), kv[0][1]))
    )

    def label(k: tuple[str, str]) -> str:
        return f"{k[0]} ({k[1]})"

    return ConfigChange(
        before=old.label,
        after=new.label,
        region_before=old.eager_region,
        region_after=new.eager_region,
        eager_ops_before=old.eager_ops_per_step,
        eager_ops_after=new.eager_ops_per_step,
        moved=moved_ops,
        segments_added=_segment_changes(added),
        segments_removed=_segment_changes(removed),
        graphs_added=tuple(label(k) for k in sorted(set(new_graphs) - set(old_graphs), key=lambda k: (k[1], natural(k[0])))),
        graphs_removed=tuple(label(k) for k in sorted(set(old_graphs) - set(new_graphs), key=lambda k: (k[1], natural(k[0])))),
        max_growth_pct=max_growth_pct,
    )


def _engine_notes(old: EngineParams, new: EngineParams) -> tuple[str, ...]:
    notes = []
    before, after = old.described(), new.described()
    for key, a in before.items():
        b = after[key]
        if a != b:
            notes.append(
                f"the before side was recorded with {key}={a} and the after side with {key}={b}, so op "
                f"counts may differ for that reason alone; record both with the same options"
            )
    return tuple(notes)


def compare_maps(
    old: RegionMap,
    new: RegionMap,
    max_growth_pct: float | None = None,
    pairs: Iterable[tuple[ConfigMap, ConfigMap]] | None = None,
    engine_notes: bool = True,
) -> RegionChanges:
    """Compare two region maps, configurations paired by runner and mode (or ``pairs``).

    ``engine_notes``: note engine parameters that differ between the two sides (off when
    the difference is the point, as in ``diff --against-fresh-metadata``)."""
    if pairs is None:
        old_keys = {c.key for c in old.configs}
        new_keys = {c.key for c in new.configs}
        paired = [(old.config(*c.key), c) for c in new.configs if c.key in old_keys]
        new_only = tuple(c.label for c in new.configs if c.key not in old_keys)
        missing = tuple(c.label for c in old.configs if c.key not in new_keys)
    else:
        paired = list(pairs)
        new_only = missing = ()
    changes = tuple(compare_configs(a, b, max_growth_pct) for a, b in paired)  # type: ignore[arg-type]
    notes = _engine_notes(old.engine, new.engine) if engine_notes else ()
    return RegionChanges(changes, new_only, missing, max_growth_pct, notes)


def pair_by_position(left: RegionMap, right: RegionMap) -> list[tuple[ConfigMap, ConfigMap]]:
    """Pairs for two plans that differ in one option (``diff --against-...``)."""
    if len(left.configs) != len(right.configs):
        raise CapturelintError(
            f"the two sides have {len(left.configs)} and {len(right.configs)} configurations, so they cannot be paired; "
            "change one option at a time (e.g. --runner v1 --against-runner v2)"
        )
    return list(zip(left.configs, right.configs))


# ------------------------------------------------------------------------ diffs

@dataclasses.dataclass(frozen=True)
class RegionDiff:
    """Two region recordings compared: what each side is, the paired configurations
    (for drawing) and the changes."""

    before: str
    after: str
    pairs: tuple[tuple[ConfigMap, ConfigMap], ...]
    changes: RegionChanges

    def to_json(self) -> dict[str, Any]:
        return {"tool": "capturelint", "before": self.before, "after": self.after, "region_changes": self.changes.to_json()}


def _pairs_by_key(before: RegionMap, after: RegionMap) -> tuple[tuple[ConfigMap, ConfigMap], ...]:
    return tuple((b, c) for c in after.configs if (b := before.config(*c.key)) is not None)


def diff_by_key(before: RegionMap, after: RegionMap, before_label: str, after_label: str) -> RegionDiff:
    """Two maps of the same plan (two snapshot files, or a file and a fresh recording):
    configurations paired by runner and mode."""
    return RegionDiff(before_label, after_label, _pairs_by_key(before, after), compare_maps(before, after))


def diff_by_position(a: RegionMap, b: RegionMap, before: str, after: str) -> RegionDiff:
    """Two recordings of plans that differ in one option, configurations paired in order."""
    pairs = pair_by_position(a, b)
    return RegionDiff(before, after, tuple(pairs), compare_maps(a, b, pairs=pairs, engine_notes=False))
