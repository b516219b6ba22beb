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

**What lives where.** This module is the file format: the records, their JSON, the
loader that validates a file and the writer. Comparing two maps is
``capturelint.region_changes``; the gate (a run against its baseline) and accepting a
change (``snapshot --update``) are ``capturelint.baseline``; recording a map from the
engine is each adapter's ``record_regions`` (``capturelint.adapters.registry``).

**Reading is bounded** (``capturelint.inputs``): a file larger than
``capturelint.limits.MAX_SNAPSHOT_BYTES`` (64 MiB) is refused before it is read, and so
is anything but a regular file (a device such as ``/dev/zero``, a named pipe); a
document nested deeper than any snapshot is refused too.
Writing is atomic (``capturelint.output.write_file``): a snapshot on disk is whole.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

from capturelint.errors import CapturelintError
from capturelint.inputs import InputProblem, parse_json, read_text
from capturelint.limits import MAX_SNAPSHOT_BYTES
from capturelint.options import CAPTURE_MODES, DEFAULT_ENGINE, BreakOutputs
from capturelint.output import write_file
from capturelint.regions import GraphMap, SegmentMap
from capturelint.report import ConfigReport, Report, dumps_json
from capturelint.runtime.protocol import SegmentKind

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
    target: str | None = None  # a user's targets: the source they came from (its spec, relative to the project root)

    @property
    def label(self) -> str:
        return f"{self.runner}/{self.mode}" if self.target is None else f"{self.target} {self.runner}/{self.mode}"

    @property
    def key(self) -> tuple[str, ...]:
        """What pairs it with its other recording: runner and mode, and a target's source."""
        return (self.runner, self.mode) if self.target is None else (self.target, self.runner, self.mode)

    @property
    def order(self) -> tuple[Any, ...]:
        """Its place in a map: by source, runner, then mode in ``MODE_ORDER``."""
        return (self.target or "", self.runner, mode_order(self.mode))

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
            **({"target": self.target} if self.target is not None else {}),
        }


@dataclasses.dataclass(frozen=True)
class EngineParams:
    """The plan values that change what a capture records (``None``: engine default)."""

    layers: int | None
    steps: int | None
    seed: int
    kernels: str
    fresh_metadata: bool
    break_outputs: BreakOutputs
    name: str = DEFAULT_ENGINE  # the engine family (--engine); written only when not the default engine
    capture_sizes: tuple[int, ...] | None = None  # --engine vllm's workload; written only when given
    batch_sizes: tuple[int, ...] | None = None

    @classmethod
    def of(cls, plan: Any) -> "EngineParams":
        """The plan's values: the shared ones, and what its engine family's knobs record
        (``knobs.recorded()``: the fields above they set; the others keep their defaults)."""
        recorded = plan.knobs.recorded() if plan.knobs is not None else {}
        base = dict(kernels="torch", fresh_metadata=False, break_outputs=BreakOutputs.COPY)
        return cls(plan.layers, plan.steps, plan.seed, name=plan.engine, **{**base, **recorded})

    def described(self) -> dict[str, Any]:
        """Every value as the file says it: the break-output policy as
        ``copy_break_outputs`` (true or false), the name and the workload sizes
        (lists, or null for the engine's defaults) included."""
        return {"layers": self.layers, "steps": self.steps, "seed": self.seed, "kernels": self.kernels,
                "fresh_metadata": self.fresh_metadata, "copy_break_outputs": self.break_outputs is BreakOutputs.COPY,
                "name": self.name,
                "capture_sizes": None if self.capture_sizes is None else list(self.capture_sizes),
                "batch_sizes": None if self.batch_sizes is None else list(self.batch_sizes)}

    def to_json(self) -> dict[str, Any]:
        doc = self.described()
        if self.name == DEFAULT_ENGINE:
            del doc["name"]
        for key in ("capture_sizes", "batch_sizes"):
            if doc[key] is None:
                del doc[key]
        return doc


@dataclasses.dataclass(frozen=True)
class RegionMap:
    """Every configuration of a plan: the content of a snapshot file."""

    engine: EngineParams
    configs: tuple[ConfigMap, ...]

    def config(self, *key: str) -> ConfigMap | None:
        """The configuration of ``key`` (``runner, mode``, or a target's ``source,
        runner, mode``: ``ConfigMap.key``)."""
        for c in self.configs:
            if c.key == key:
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

def natural(text: str) -> tuple:
    """A sort key that orders ``decode/8`` before ``decode/16``."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


MODE_ORDER = tuple(str(m) for m in CAPTURE_MODES)  # the order configurations are listed in


def mode_order(mode: str) -> tuple[int, str]:
    return (MODE_ORDER.index(mode) if mode in MODE_ORDER else len(MODE_ORDER), mode)


def config_map(cfg: ConfigReport) -> ConfigMap:
    graphs = sorted(cfg.graphs, key=lambda g: (g.runtime_mode, natural(g.graph)))
    return ConfigMap(cfg.runner, cfg.mode, cfg.eager_region, tuple(graphs), target=cfg.target)


def region_map(report: Report, plan: Any) -> RegionMap:
    """The region map of a run (its configurations' captures)."""
    configs = sorted((config_map(c) for c in report.configs), key=lambda c: c.order)
    return RegionMap(EngineParams.of(plan), tuple(configs))


def write_snapshot(rmap: RegionMap, path: str | Path) -> None:
    """Write ``rmap`` to ``path`` atomically: the file is the whole snapshot or the old one."""
    write_file(str(path), rmap.dumps())


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
    text = read_snapshot_text(path)
    if not text.strip():
        raise CapturelintError(f"snapshot {path} is empty; {_regenerate(path)}")
    try:
        doc = parse_json(text, path, parse_constant=_reject_constant)
    except InputProblem as e:
        raise CapturelintError(f"snapshot {path} {e.problem}, deeper than any snapshot; {_regenerate(path)}") from None
    except json.JSONDecodeError as e:
        body = text.strip()
        # a file cut short ends before its closing bracket (or inside a string)
        truncated = e.pos >= len(body) or (body[:1] in "{[" and body[-1:] not in "}]")
        what = "is truncated (the JSON ends early)" if truncated else f"is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
        raise CapturelintError(f"snapshot {path} {what}; {_regenerate(path)}") from None
    except ValueError as e:
        raise CapturelintError(f"snapshot {path} is not valid JSON ({e}); {_regenerate(path)}") from None
    return parse_snapshot(doc, path)


def read_snapshot_text(path: str) -> str:
    """The text of a snapshot file, read by the bounded reader (``capturelint.inputs``):
    a regular file of at most ``MAX_SNAPSHOT_BYTES``."""
    try:
        return read_text(path, MAX_SNAPSHOT_BYTES)
    except InputProblem as e:
        fix = {
            "missing": f"create it with `capturelint snapshot -o {path}`",
            "directory": "pass the snapshot file's path",
            "special": "pass the snapshot file's path",
            "too-large": f"more than any snapshot capturelint writes; pass the snapshot file's path, or {_regenerate(path)}",
            "unreadable": "check the path and its permissions",
        }.get(e.kind, _regenerate(path))
        raise CapturelintError(f"snapshot {path} {e.problem}; {fix}") from None


def looks_like_snapshot(path: str) -> bool:
    """Whether the file at ``path`` says it is a capturelint snapshot: a JSON object with
    the format marker, whatever its version or the validity of its fields. What
    ``snapshot --update`` may replace (besides an empty file)."""
    try:
        doc = parse_json(read_snapshot_text(path), path, parse_constant=_reject_constant)
    except (CapturelintError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("format") == FORMAT_MARKER


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a snapshot holds")


def _sizes(f: _Fields, eng: dict, key: str) -> tuple[int, ...] | None:
    """An optional list of positive integers of the engine section (``--capture-sizes``)."""
    if key not in eng:
        return None
    value = f.field(eng, key, "engine", (list,), "a list of positive integers")
    if not value or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in value):
        raise f.fail(f"engine.{key}", f"must be a list of positive integers, got {value!r}")
    return tuple(value)


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
        break_outputs=(BreakOutputs.COPY if f.field(eng, "copy_break_outputs", "engine", (bool,), "true or false")
                       else BreakOutputs.DISCARD),
        name=f.field(eng, "name", "engine", (str,), "a string") if "name" in eng else DEFAULT_ENGINE,
        capture_sizes=_sizes(f, eng, "capture_sizes"),
        batch_sizes=_sizes(f, eng, "batch_sizes"),
    )
    raw_configs = f.field(doc, "configurations", "", (list,), "a list")
    configs: list[ConfigMap] = []
    seen: set[tuple[str, ...]] = set()
    for ci, rc in enumerate(raw_configs):
        w = f"configurations[{ci}]"
        f.typed(rc, (dict,), w, "an object")
        runner = f.field(rc, "runner", w, (str,), "a string")
        mode = f.field(rc, "mode", w, (str,), "a string")
        target = f.field(rc, "target", w, (str,), "a string") if "target" in rc else None
        key = (runner, mode) if target is None else (target, runner, mode)
        if key in seen:
            raise f.fail(w, f"repeats runner {runner} mode {mode}" + (f" of target {target}" if target else ""))
        seen.add(key)
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
        c = ConfigMap(runner, mode, region, tuple(graphs), target=target)
        stated = f.field(rc, "eager_ops_per_step", w, (int, float), "a number")
        if not math.isclose(stated, c.eager_ops_per_step, abs_tol=1e-3):
            raise f.fail(f"{w}.eager_ops_per_step", f"says {stated} but its graphs give {c.eager_ops_per_step}")
        configs.append(c)
    return RegionMap(engine, tuple(configs))


__all__ = [
    "ConfigMap", "EngineParams", "FORMAT_MARKER", "GraphMap", "RegionMap", "SNAPSHOT_VERSION", "SegmentMap",
    "config_map", "load_snapshot", "looks_like_snapshot", "mode_order", "natural", "parse_snapshot",
    "read_snapshot_text", "region_map", "write_snapshot",
]
