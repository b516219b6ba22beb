"""Region maps: what each graph captures and what runs eagerly, as a reviewable file.

**The idea.** Where the eager breaks sit decides what a replay re-runs live and what it
replays frozen. A change that moves an op out of an eager break into a captured segment
(or the other way) changes what replay computes or what it costs, and it deserves a
review. A *region map* records, for every runner and mode of a plan and every graph
they capture, the segments in execution order: their kind (captured or eager), the
eager break's name, and per module scope how many of each op ran there.
``capturelint snapshot`` writes one; ``capturelint check --baseline FILE`` compares the
run against it; ``capturelint diff`` compares any two.

**The file.** JSON with sorted keys, two-space indent, no addresses, no timestamps: the
same engine and options give a byte-identical file. Printed form (abridged)::

    {
      "configurations": [
        {
          "eager_ops_per_step": 38.0,
          "eager_region": "wide",
          "graphs": [
            {
              "captured_ops": 61, "eager_ops": 38, "graph": "decode/8",
              "runtime_mode": "PIECEWISE",
              "segments": [
                {"break": null, "kind": "captured",
                 "ops": {"embed": {"aten.embedding.default": 1}, ...}},
                {"break": "DeepseekV4Attention._prepare_and_attn_eager", "kind": "eager",
                 "ops": {"layers.0.attn": {"dsv4.fused_qnorm_rope_kv_insert.default": 1}, ...}},
                ...
              ]
            }
          ],
          "mode": "PIECEWISE",
          "runner": "v1"
        }
      ],
      "engine": {"copy_break_outputs": true, "fresh_metadata": false, "kernels": "torch",
                 "layers": 2, "seed": 0, "steps": 4},
      "format": "capturelint-snapshot",
      "version": 1
    }

``captured_ops``, ``eager_ops`` and ``eager_ops_per_step`` are derived from the
segments and checked against them on load, so a hand edit cannot make them disagree.

**Eager ops per step.** A step replays exactly one graph. The *eager ops per step* of a
configuration is the number of ops that run inside eager segments of a graph (recorded
at capture; they re-run live on every replay), averaged over the configuration's
graphs, each graph counted once. FULL graphs have no eager segments, so they count 0; a
configuration that captures no graph has 0. It measures the Python and launch work a
replay does outside the graph, independent of how many graphs are captured.

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

**The invariant users keep.** A baseline is only as good as its last review: when a
region change is intended, accept it with ``capturelint snapshot --update FILE`` and
commit the file with the change that caused it.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import math
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterable, Sequence

from capturelint.runtime.protocol import SegmentKind
from capturelint.errors import CapturelintError
from capturelint.report import ConfigReport, Report, dumps_json
from capturelint.regions import GraphMap, SegmentMap
from capturelint.settings import MODES
from capturelint.region_changes import (  # noqa: F401  (re-exported: the gate's comparison model)
    LIST_CUT,
    ConfigChange,
    Direction,
    MovedOp,
    RegionChanges,
    SegmentChange,
    _num,
    cut,
)

FORMAT_MARKER = "capturelint-snapshot"
SNAPSHOT_VERSION = 1



# ------------------------------------------------------------------------ records

@dataclasses.dataclass(frozen=True)
class ConfigMap:
    """One runner and mode of a plan, with every graph it captured."""

    runner: str
    mode: str
    eager_region: str
    graphs: tuple[GraphMap, ...]

    @property
    def label(self) -> str:
        return f"{self.runner}/{self.mode}"

    @property
    def key(self) -> tuple[str, str]:
        return (self.runner, self.mode)

    @property
    def eager_ops_per_step(self) -> float:
        """Eager ops per replayed graph, averaged over the graphs (module docstring)."""
        if not self.graphs:
            return 0.0
        return round(sum(g.eager_ops for g in self.graphs) / len(self.graphs), 3)

    def to_json(self) -> dict[str, Any]:
        return {
            "runner": self.runner,
            "mode": self.mode,
            "eager_region": self.eager_region,
            "eager_ops_per_step": self.eager_ops_per_step,
            "graphs": [g.to_json() for g in self.graphs],
        }


@dataclasses.dataclass(frozen=True)
class EngineParams:
    """The plan values that change what a capture records (``None``: engine default)."""

    layers: int | None
    steps: int | None
    seed: int
    kernels: str
    fresh_metadata: bool
    copy_break_outputs: bool

    @classmethod
    def of(cls, plan: Any) -> "EngineParams":
        return cls(plan.layers, plan.steps, plan.seed, plan.kernels, plan.fresh_metadata, plan.copy_break_outputs)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class RegionMap:
    """Every configuration of a plan: the content of a snapshot file."""

    engine: EngineParams
    configs: tuple[ConfigMap, ...]

    def config(self, runner: str, mode: str) -> ConfigMap | None:
        for c in self.configs:
            if c.key == (runner, mode):
                return c
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_MARKER,
            "version": SNAPSHOT_VERSION,
            "engine": self.engine.to_json(),
            "configurations": [c.to_json() for c in self.configs],
        }

    def dumps(self) -> str:
        return dumps_json(self.to_json())


# ---------------------------------------------------------------- from a recording

def _natural(text: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


MODE_ORDER = tuple(m for m in MODES if m != "NONE")  # the order configurations are listed in


def _mode_order(mode: str) -> tuple[int, str]:
    return (MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER), mode)


def config_map(cfg: ConfigReport) -> ConfigMap:
    graphs = sorted(cfg.graphs, key=lambda g: (g.runtime_mode, _natural(g.graph)))
    return ConfigMap(cfg.runner, cfg.mode, cfg.eager_region, tuple(graphs))


def region_map(report: Report, plan: Any) -> RegionMap:
    """The region map of a run (its configurations' captures)."""
    configs = sorted((config_map(c) for c in report.configs), key=lambda c: (c.runner, _mode_order(c.mode)))
    return RegionMap(EngineParams.of(plan), tuple(configs))


def write_snapshot(rmap: RegionMap, path: str | Path) -> None:
    try:
        Path(path).write_text(rmap.dumps())
    except OSError as e:
        raise CapturelintError(f"cannot write snapshot {path}: {e.strerror}; choose a writable path") from None


# ---------------------------------------------------------------------- loading

def _regenerate(path: str) -> str:
    return f"regenerate it with `capturelint snapshot -o {path}`"


class _Fields:
    """Typed access to a parsed document that names the offending field on error."""

    def __init__(self, path: str):
        self.path = path

    def fail(self, where: str, what: str) -> CapturelintError:
        return CapturelintError(f"snapshot {self.path}: field {where} {what}; {_regenerate(self.path)}")

    def get(self, obj: dict, key: str, where: str) -> Any:
        if key not in obj:
            return self._missing(where + ("." if where else "") + key)
        return obj[key]

    def _missing(self, where: str) -> Any:
        raise CapturelintError(f"snapshot {self.path}: field {where} is missing; {_regenerate(self.path)}")

    def typed(self, value: Any, types: tuple[type, ...], where: str, expected: str) -> Any:
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if not ok:
            raise self.fail(where, f"must be {expected}, got {_describe(value)}")
        return value

    def field(self, obj: dict, key: str, where: str, types: tuple[type, ...], expected: str) -> Any:
        full = f"{where}.{key}" if where else key
        return self.typed(self.get(obj, key, where), types, full, expected)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def load_snapshot(path: str | Path) -> RegionMap:
    """Read and validate a snapshot file.

    Raises ``CapturelintError`` with one line naming the file, what is wrong and what
    to do for a missing or unreadable file, malformed or truncated JSON, a wrong format
    marker or version, and any missing, ill-typed or inconsistent field.
    """
    path = str(path)
    p = Path(path)
    if not p.exists():
        raise CapturelintError(f"snapshot {path} does not exist; create it with `capturelint snapshot -o {path}`")
    try:
        text = p.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise CapturelintError(f"snapshot {path} is a directory; pass the snapshot file's path") from None
    except UnicodeDecodeError:
        raise CapturelintError(f"snapshot {path} is not UTF-8 text; {_regenerate(path)}") from None
    except OSError as e:
        raise CapturelintError(f"cannot read snapshot {path}: {e.strerror}; check the path and its permissions") from None
    if not text.strip():
        raise CapturelintError(f"snapshot {path} is empty; {_regenerate(path)}")
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        body = text.strip()
        # a file cut short ends before its closing bracket (or inside a string)
        truncated = e.pos >= len(body) or (body[:1] in "{[" and body[-1:] not in "}]")
        what = "is truncated (the JSON ends early)" if truncated else f"is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
        raise CapturelintError(f"snapshot {path} {what}; {_regenerate(path)}") from None
    except ValueError as e:
        raise CapturelintError(f"snapshot {path} is not valid JSON ({e}); {_regenerate(path)}") from None
    except RecursionError:
        raise CapturelintError(f"snapshot {path} is nested too deeply to be a snapshot; {_regenerate(path)}") from None
    return parse_snapshot(doc, path)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a snapshot holds")


def parse_snapshot(doc: Any, path: str) -> RegionMap:
    """Validate a parsed snapshot document; see ``load_snapshot``."""
    f = _Fields(path)
    if not isinstance(doc, dict):
        raise CapturelintError(
            f"snapshot {path} is not a capturelint snapshot (the top level is {_describe(doc)}, not an object); {_regenerate(path)}"
        )
    marker = doc.get("format")
    if marker != FORMAT_MARKER:
        got = "has no format marker" if marker is None else f"has format {marker!r}"
        raise CapturelintError(
            f"snapshot {path} is not a capturelint snapshot (it {got}, expected {FORMAT_MARKER!r}); {_regenerate(path)}"
        )
    version = doc.get("version")
    if version != SNAPSHOT_VERSION or isinstance(version, bool):
        raise CapturelintError(
            f"snapshot {path} has {'no version' if version is None else f'version {version!r}'}; this capturelint "
            f"reads version {SNAPSHOT_VERSION}; {_regenerate(path)}"
        )
    eng = f.field(doc, "engine", "", (dict,), "an object")
    engine = EngineParams(
        layers=f.field(eng, "layers", "engine", (int, type(None)), "an integer or null"),
        steps=f.field(eng, "steps", "engine", (int, type(None)), "an integer or null"),
        seed=f.field(eng, "seed", "engine", (int,), "an integer"),
        kernels=f.field(eng, "kernels", "engine", (str,), "a string"),
        fresh_metadata=f.field(eng, "fresh_metadata", "engine", (bool,), "true or false"),
        copy_break_outputs=f.field(eng, "copy_break_outputs", "engine", (bool,), "true or false"),
    )
    raw_configs = f.field(doc, "configurations", "", (list,), "a list")
    configs: list[ConfigMap] = []
    seen: set[tuple[str, str]] = set()
    for ci, rc in enumerate(raw_configs):
        w = f"configurations[{ci}]"
        f.typed(rc, (dict,), w, "an object")
        runner = f.field(rc, "runner", w, (str,), "a string")
        mode = f.field(rc, "mode", w, (str,), "a string")
        if (runner, mode) in seen:
            raise f.fail(w, f"repeats runner {runner} mode {mode}")
        seen.add((runner, mode))
        region = f.field(rc, "eager_region", w, (str,), "a string")
        graphs: list[GraphMap] = []
        for gi, rg in enumerate(f.field(rc, "graphs", w, (list,), "a list")):
            gw = f"{w}.graphs[{gi}]"
            f.typed(rg, (dict,), gw, "an object")
            segs: list[SegmentMap] = []
            for si, rs in enumerate(f.field(rg, "segments", gw, (list,), "a list")):
                sw = f"{gw}.segments[{si}]"
                f.typed(rs, (dict,), sw, "an object")
                kind_text = f.field(rs, "kind", sw, (str,), "a string")
                try:
                    kind = SegmentKind(kind_text)
                except ValueError:
                    raise f.fail(f"{sw}.kind", f"must be 'captured' or 'eager', got {kind_text!r}") from None
                name = f.field(rs, "break", sw, (str, type(None)), "a string or null")
                if kind is SegmentKind.EAGER and name is None:
                    raise f.fail(f"{sw}.break", "must name the eager break")
                if kind is SegmentKind.CAPTURED and name is not None:
                    raise f.fail(f"{sw}.break", "must be null for a captured segment")
                scopes = []
                for scope, by_op in sorted(f.field(rs, "ops", sw, (dict,), "an object").items()):
                    ow = f"{sw}.ops[{scope!r}]"
                    f.typed(by_op, (dict,), ow, "an object")
                    counts = []
                    for op, n in sorted(by_op.items()):
                        f.typed(n, (int,), f"{ow}[{op!r}]", "an integer")
                        if n <= 0:
                            raise f.fail(f"{ow}[{op!r}]", f"must be a positive count, got {n}")
                        counts.append((op, n))
                    scopes.append((scope, tuple(counts)))
                segs.append(SegmentMap(kind, name, tuple(scopes)))
            g = GraphMap(
                f.field(rg, "graph", gw, (str,), "a string"),
                f.field(rg, "runtime_mode", gw, (str,), "a string"),
                tuple(segs),
            )
            for key, actual in (("captured_ops", g.captured_ops), ("eager_ops", g.eager_ops)):
                stated = f.field(rg, key, gw, (int,), "an integer")
                if stated != actual:
                    raise f.fail(f"{gw}.{key}", f"says {stated} but its segments hold {actual}")
            graphs.append(g)
        c = ConfigMap(runner, mode, region, tuple(graphs))
        stated = f.field(rc, "eager_ops_per_step", w, (int, float), "a number")
        if not math.isclose(stated, c.eager_ops_per_step, abs_tol=1e-3):
            raise f.fail(f"{w}.eager_ops_per_step", f"says {stated} but its graphs give {c.eager_ops_per_step}")
        configs.append(c)
    return RegionMap(engine, tuple(configs))


# ------------------------------------------------------------------- comparison

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
    for key in sorted(set(old_graphs) & set(new_graphs), key=lambda k: (k[1], _natural(k[0]))):
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
        for (scope, op, d), (n, g) in sorted(moved.items(), key=lambda kv: (kv[0][2].value, _natural(kv[0][0]), kv[0][1]))
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
        graphs_added=tuple(label(k) for k in sorted(set(new_graphs) - set(old_graphs), key=lambda k: (k[1], _natural(k[0])))),
        graphs_removed=tuple(label(k) for k in sorted(set(old_graphs) - set(new_graphs), key=lambda k: (k[1], _natural(k[0])))),
        max_growth_pct=max_growth_pct,
    )


def _engine_notes(old: EngineParams, new: EngineParams) -> tuple[str, ...]:
    notes = []
    for fld in dataclasses.fields(EngineParams):
        a, b = getattr(old, fld.name), getattr(new, fld.name)
        if a != b:
            notes.append(
                f"the before side was recorded with {fld.name}={a} and the after side with {fld.name}={b}, so op "
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


def compare_report(snapshot: RegionMap, report: Report, plan: Any, max_growth_pct: float) -> RegionChanges:
    """The gate of ``check --baseline``: the run's regions against the baseline's."""
    return compare_maps(snapshot, region_map(report, plan), max_growth_pct)


def pair_by_position(left: RegionMap, right: RegionMap) -> list[tuple[ConfigMap, ConfigMap]]:
    """Pairs for two plans that differ in one option (``diff --against-...``)."""
    if len(left.configs) != len(right.configs):
        raise CapturelintError(
            f"the two sides have {len(left.configs)} and {len(right.configs)} configurations, so they cannot be paired; "
            "change one option at a time (e.g. --runner v1 --against-runner v2)"
        )
    return list(zip(left.configs, right.configs))


# ------------------------------------------------------------- recording, update

@dataclasses.dataclass(frozen=True)
class SnapshotUpdate:
    """What ``snapshot --update`` did: the map written, the changes against the old
    file (``None`` when there was no readable old file), the configurations kept from
    the old file because this run did not record them, and why the old file was
    replaced without comparison (``None`` when it was read)."""

    written: RegionMap
    changes: RegionChanges | None
    kept: tuple[str, ...]
    unreadable: str | None
    created: bool

    def summary_line(self, path: str) -> str:
        if self.created:
            line = f"created {path}"
        elif self.unreadable is not None:
            line = f"replaced {path}, which could not be read ({self.unreadable})"
        else:
            line = f"updated {path}: " + (self.changes.summary_line() if self.changes else "regions unchanged")
        if self.kept:
            line += f"; kept from the old file (not run this time): {cut(list(self.kept))}"
        return line


def update_snapshot(path: str | Path, current: RegionMap) -> SnapshotUpdate:
    """Rewrite the snapshot at ``path`` with ``current`` (accepting every change).

    Configurations of the old file that this run did not record are kept when the old
    file was recorded with the same engine parameters, so ``--runner v2`` updates v2
    alone; with other parameters the file is replaced whole.
    """
    path = str(path)
    old: RegionMap | None = None
    unreadable: str | None = None
    created = not Path(path).exists()
    if not created:
        try:
            old = load_snapshot(path)
        except CapturelintError as e:
            unreadable = str(e).split("; ")[0].replace(f"snapshot {path} ", "")
    kept: tuple[str, ...] = ()
    merged = current
    if old is not None and old.engine == current.engine:
        run_keys = {c.key for c in current.configs}
        extra = [c for c in old.configs if c.key not in run_keys]
        if extra:
            kept = tuple(c.label for c in extra)
            configs = sorted(current.configs + tuple(extra), key=lambda c: (c.runner, _mode_order(c.mode)))
            merged = RegionMap(current.engine, tuple(configs))
    changes = compare_maps(old, merged) if old is not None else None
    write_snapshot(merged, path)
    return SnapshotUpdate(merged, changes, kept, unreadable, created)


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


def diff_files(old_path: str, new_path: str) -> RegionDiff:
    before, after = load_snapshot(old_path), load_snapshot(new_path)
    return RegionDiff(old_path, new_path, _pairs_by_key(before, after), compare_maps(before, after))


def diff_file_against_map(old_path: str, before: RegionMap, after: RegionMap) -> RegionDiff:
    """A snapshot file (loaded as ``before``) against a fresh recording of the engine."""
    return RegionDiff(old_path, "the current engine", _pairs_by_key(before, after), compare_maps(before, after))


def diff_recordings(a: RegionMap, b: RegionMap, before: str, after: str) -> RegionDiff:
    """Two recordings of plans that differ in one option, configurations paired in order."""
    pairs = pair_by_position(a, b)
    return RegionDiff(before, after, tuple(pairs), compare_maps(a, b, pairs=pairs, engine_notes=False))
