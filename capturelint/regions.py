"""Region maps: what a capture put in each segment, by module scope and op.

One ``GraphMap`` per captured graph, built from its capture stream by ``graph_map``;
the check report, the snapshots of the gate, ``show`` and ``diff`` all read these.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

from capturelint.runtime.protocol import SegmentKind

if TYPE_CHECKING:  # reading a report (capturelint merge) needs no tracer, nor torch
    from capturelint.records import Stream

ScopeOps = tuple[tuple[str, tuple[tuple[str, int], ...]], ...]  # ((scope, ((op, count), ...)), ...)


@dataclasses.dataclass(frozen=True)
class SegmentMap:
    """One segment: its kind, the eager break's name, and ops per scope (sorted)."""

    kind: SegmentKind
    name: str | None
    ops: ScopeOps

    @property
    def op_count(self) -> int:
        return sum(n for _, by_op in self.ops for _, n in by_op)

    @property
    def key(self) -> tuple[str, str | None]:
        return (str(self.kind), self.name)

    @property
    def label(self) -> str:
        return f"eager break {self.name}" if self.kind is SegmentKind.EAGER else "captured segment"

    def to_json(self) -> dict[str, Any]:
        return {"kind": str(self.kind), "break": self.name, "ops": {s: dict(by_op) for s, by_op in self.ops}}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SegmentMap:
        """The segment ``to_json`` wrote; scopes and ops sorted, as ``graph_map`` sorts them."""
        ops = tuple((scope, tuple(sorted(by_op.items()))) for scope, by_op in sorted(doc["ops"].items()))
        return cls(SegmentKind(doc["kind"]), doc["break"], ops)


@dataclasses.dataclass(frozen=True)
class GraphMap:
    """One captured graph: batch descriptor, runtime mode, segments in execution order."""

    graph: str
    runtime_mode: str
    segments: tuple[SegmentMap, ...]

    @property
    def key(self) -> tuple[str, str]:
        return (self.graph, self.runtime_mode)

    @property
    def eager_ops(self) -> int:
        return sum(s.op_count for s in self.segments if s.kind is SegmentKind.EAGER)

    @property
    def captured_ops(self) -> int:
        return sum(s.op_count for s in self.segments if s.kind is SegmentKind.CAPTURED)

    @property
    def eager_breaks(self) -> int:
        return sum(1 for s in self.segments if s.kind is SegmentKind.EAGER)

    def op_counts(self) -> dict[tuple[str, str], tuple[int, int]]:
        """``(scope, op) -> (captured count, eager count)``."""
        out: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        for s in self.segments:
            col = 1 if s.kind is SegmentKind.EAGER else 0
            for scope, by_op in s.ops:
                for op, n in by_op:
                    out[(scope, op)][col] += n
        return {k: (v[0], v[1]) for k, v in out.items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "graph": self.graph,
            "runtime_mode": self.runtime_mode,
            "captured_ops": self.captured_ops,
            "eager_ops": self.eager_ops,
            "segments": [s.to_json() for s in self.segments],
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> GraphMap:
        """The graph ``to_json`` wrote (``GraphMap.from_json(d).to_json() == d``); its op
        counts are derived, so counts that disagree with the segments are a ``ValueError``."""
        g = cls(doc["graph"], doc["runtime_mode"], tuple(SegmentMap.from_json(s) for s in doc["segments"]))
        if (g.captured_ops, g.eager_ops) != (doc["captured_ops"], doc["eager_ops"]):
            raise ValueError(f"graph {g.graph}: captured_ops and eager_ops disagree with its segments")
        return g


def graph_map(stream: Stream) -> GraphMap:
    """The region map of one capture stream."""
    per_segment: dict[int, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    for rec in stream.ops:
        per_segment[rec.segment][rec.scope][rec.op] += 1
    segs = []
    for s in stream.segments:
        by_scope = per_segment.get(s.index, {})
        ops = tuple((scope, tuple(sorted(c.items()))) for scope, c in sorted(by_scope.items()))
        segs.append(SegmentMap(s.kind, s.name if s.kind is SegmentKind.EAGER else None, ops))
    return GraphMap(stream.graph, stream.runtime_mode, tuple(segs))
