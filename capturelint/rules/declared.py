"""The base of the rules over declared invariants (CL2xx): one finding per violation."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar, Iterator

from capturelint.findings import Finding, Frame
from capturelint.invariants import Requirement
from capturelint.rules.base import Rule, cut

if TYPE_CHECKING:
    from capturelint.analyzer import RegionView
    from capturelint.invariants import Invariant, Violation


class DeclaredInvariantRule(Rule):
    """Checks the invariants of one ``requirement`` on each capture's region graph: a
    violation (``capturelint.invariants.violations``) is a finding located at its first
    op, with ``message`` filled in from ``fields``."""

    requirement: ClassVar[Requirement]

    def check_region(self, view: RegionView) -> Iterator[Finding]:
        from capturelint.invariants import violations

        for inv in view.invariants:
            if inv.requirement is not self.requirement:
                continue
            for v in violations(inv, view.graph, view.selected(inv)):
                f = violation_finding(self, view, v)
                yield dataclasses.replace(f, message=self.message.format(**self.fields(view, inv, v, f)))

    def fields(self, view: RegionView, inv: Invariant, v: Violation, f: Finding) -> dict[str, Any]:
        """The named fields of ``message``."""
        return dict(
            id=inv.id, source=inv.source, runner=view.label.runner, runtime_mode=view.capture.runtime_mode,
            graph=view.capture.graph, count=len(v.ops), scope=f.scope, segment=f.segment, ops=op_list(view, v.ops),
            why=explanation(v),
        )


def violation_finding(rule: Rule, view: RegionView, v: Violation) -> Finding:
    """The finding of a violated invariant, without its message: located at the first
    violating op, its scope the common module scope of the violating ops."""
    G = view.graph
    first = G.nodes[("op", v.first)]
    scopes = [G.nodes[("op", i)]["scope"] for i in v.ops]
    segment = v.segment if v.segment is not None else first["segment"]
    site = view.site(segment, None if v.segment is not None else f"{view.capture.graph} step")
    return Finding.of(rule, site, op=first["op"], scope=(v.group or "<step>") if v.segment is None else common_scope(scopes),
                      tensor=None, capture_frame=Frame(first["file"], first["line"], first["function"]),
                      shadow_frame=None, message="", invariant=v.invariant.id)


def common_scope(scopes: list[str]) -> str:
    """The longest dotted prefix shared by every scope."""
    if not scopes:
        return ""
    parts = scopes[0].split(".")
    for s in scopes[1:]:
        other = s.split(".")
        n = 0
        while n < min(len(parts), len(other)) and parts[n] == other[n]:
            n += 1
        parts = parts[:n]
    return ".".join(parts)


def op_list(view: RegionView, ops: tuple[int, ...], limit: int = 5) -> str:
    """``aten.mm.default (model.layers.0.attn.wq_b) at attention.py:281, ...``: cut at five."""
    G = view.graph
    items = []
    for i in ops:
        d = G.nodes[("op", i)]
        items.append(f"{d['op']} ({d['scope'] or '<top>'}) at {d['file']}:{d['line']}")
    return cut(items, limit)


def explanation(v: Violation) -> str:
    """The invariant's own ``why``, as a sentence of the message."""
    why = v.invariant.why.strip()
    return f" Why: {why}" + ("" if why.endswith(".") else ".") if why else ""


__all__ = ["DeclaredInvariantRule", "common_scope", "explanation", "op_list", "violation_finding"]
