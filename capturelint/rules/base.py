"""The rule base class: one class per diagnostic, with a stable code and one doc."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, ClassVar, Iterator

from capturelint.findings import Condition, Finding, Frame, RuleInfo

if TYPE_CHECKING:  # the rule registry imports without torch (``capturelint rules``)
    from capturelint.analyzer import RegionView, RunLabel, RunOutcome, StepView
    from capturelint.invariants import Violation
    from capturelint.runtime.protocol import StaleInputEvent
    from capturelint.tracer import OpRecord, Stream

DOC_SECTIONS = ("What it does", "Why is this bad?", "Example", "Use instead", "Limitations")


class Rule:
    """A replay-equivalence rule.

    Subclasses set ``code`` (``CL`` + 3 digits, never reused), ``name`` (kebab case),
    ``condition`` (which condition of the replay model it checks), ``summary`` (one
    sentence) and ``doc`` (Markdown with the sections of ``DOC_SECTIONS``), and
    implement one or more of ``check`` (a replay step), ``check_capture`` (a capture),
    ``check_region`` (a capture's region graph against the declared invariants that
    apply to it), ``check_stale`` (a freed input of a graph without a shadow) and
    ``check_run`` (the whole run of a configuration).

    A rule module imports the analyzer and the tracer (and so torch) only for type
    checking or inside its methods: ``capturelint rules`` reads the registry's codes and
    docs without importing torch (a test keeps it so).
    """

    code: ClassVar[str]
    name: ClassVar[str]
    condition: ClassVar[Condition]
    summary: ClassVar[str]
    doc: ClassVar[str]

    def check(self, view: StepView) -> Iterator[Finding]:
        return iter(())

    def check_capture(self, label: RunLabel, capture: Stream) -> Iterator[Finding]:
        return iter(())

    def check_region(self, view: RegionView) -> Iterator[Finding]:
        """A capture's region graph and the declared invariants that apply to it."""
        return iter(())

    def check_stale(self, label: RunLabel, capture: Stream, event: StaleInputEvent) -> Iterator[Finding]:
        """A graph that gets no shadow found a storage it reads freed by the engine."""
        return iter(())

    def check_run(self, outcome: RunOutcome) -> Iterator[Finding]:
        """The whole run: a capture stopped by a host sync, the numerical oracle."""
        return iter(())

    @classmethod
    def info(cls) -> RuleInfo:
        return RuleInfo(cls.code, cls.name, cls.condition, cls.summary, textwrap.dedent(cls.doc).strip() + "\n")

    def finding(
        self,
        view: StepView,
        segment: int,
        capture_op: OpRecord | None,
        shadow_op: OpRecord | None,
        tensor: str | None,
        message: str,
    ) -> Finding:
        op = capture_op or shadow_op
        return Finding(
            code=self.code,
            name=self.name,
            condition=self.condition,
            runner=view.label.runner,
            mode=view.label.mode,
            graph=view.capture.graph,
            runtime_mode=view.capture.runtime_mode,
            segment=view.segment_label(segment),
            segment_index=segment,
            op=op.op if op else "",
            scope=(op.scope if op else "") or "<top>",
            tensor=tensor,
            capture_frame=capture_op.frame if capture_op else None,
            capture_stack=capture_op.stack if capture_op else (),
            shadow_frame=shadow_op.frame if shadow_op else None,
            message=message,
            steps=(view.shadow.step,),
        )


def violation_finding(rule: Rule, view: RegionView, v: Violation, message: str) -> Finding:
    """The finding of a violated invariant: located at the first violating op, its scope
    the common module scope of the violating ops."""
    G = view.graph
    first = G.nodes[("op", v.first)]
    scopes = [G.nodes[("op", i)]["scope"] for i in v.ops]
    segment = v.segment if v.segment is not None else first["segment"]
    return Finding(
        code=rule.code, name=rule.name, condition=rule.condition, runner=view.label.runner, mode=view.label.mode,
        graph=view.capture.graph, runtime_mode=view.capture.runtime_mode,
        segment=view.segment_label(segment) if v.segment is not None else f"{view.capture.graph} step",
        segment_index=segment, op=first["op"],
        scope=(v.group or "<step>") if v.segment is None else (common_scope(scopes) or "<top>"), tensor=None,
        capture_frame=Frame(first["file"], first["line"], first["function"]), shadow_frame=None, message=message,
        invariant=v.invariant.id,
    )


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


def where(frame: Frame | None) -> str:
    return f"{frame.file}:{frame.line}" if frame else "<unknown>"


def cut(items: list[str], limit: int = 5) -> str:
    """Join at most ``limit`` items, then "... and N more"."""
    shown = ", ".join(items[:limit])
    return shown + (f" ... and {len(items) - limit} more" if len(items) > limit else "")
