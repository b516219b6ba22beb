"""The rule base class: one class per diagnostic, with a stable code and one doc."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, ClassVar, Iterator

from capturelint.findings import Condition, Finding, Frame, RuleInfo
from capturelint.lists import cut

if TYPE_CHECKING:  # the rule registry imports without torch (``capturelint rules``)
    from capturelint.analyzer import BareView, HazardView, RegionView, RunLabel, RunOutcome, StepView
    from capturelint.runtime.protocol import StaleInputEvent
    from capturelint.records import OpRecord, Stream
    from capturelint.waivers import SuppressionView

DOC_SECTIONS = ("What it does", "Why is this bad?", "Example", "Use instead", "Limitations")

# The check methods a rule may implement, one per point of a run where the analyzer
# calls rules (``Rule.hooks``).
HOOKS = ("check", "check_capture", "check_region", "check_stale", "check_bare", "check_hazard", "check_run",
         "check_suppressions")


class Rule:
    """A replay-equivalence rule.

    Subclasses set ``code`` (``CL`` + 3 digits, never reused), ``name`` (kebab case),
    ``condition`` (which condition of the replay model it checks), ``summary`` (one
    sentence), ``doc`` (Markdown with the sections of ``DOC_SECTIONS``) and ``message``
    (the finding's message: a ``str.format`` template with named fields, naming cause,
    consequence and fix; a rule with more than one kind of finding has more templates:
    sentences, the first stating the evidence, the last the fix in words that name no
    field, those between what replay does, as ``findings.MessageParts`` reads them for
    the one-line-per-problem report),
    and implement one or more of ``check`` (a replay step), ``check_capture`` (a
    capture), ``check_region`` (a capture's region graph against the declared
    invariants that apply to it), ``check_stale`` (a freed input of a graph without a
    shadow), ``check_bare`` (another event of such a graph: ``analyzer.BareView``),
    ``check_hazard`` (a hazard the emulated runtime saw happen),
    ``check_run`` (the whole run of a configuration) and ``check_suppressions`` (the
    inline suppression comments of the source the check ran, once its findings are
    matched to them: ``capturelint.waivers``). ``hooks`` names the
    ones a rule implements: the analyzer calls a rule only there.

    A rule is pure: it reads the (frozen) view it is handed and returns findings, so
    the rules find the same in any order. What several rules need (the aligned pairs,
    the mismatches, which of them are follow-ons) the analyzer derives once while
    building the view.

    A rule module imports the analyzer and the tracer (and so torch) only for type
    checking or inside its methods: ``capturelint rules`` reads the registry's codes and
    docs without importing torch (a test keeps it so).
    """

    code: ClassVar[str]
    name: ClassVar[str]
    condition: ClassVar[Condition]
    summary: ClassVar[str]
    doc: ClassVar[str]
    message: ClassVar[str]
    hooks: ClassVar[frozenset[str]] = frozenset()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.hooks = frozenset(h for h in HOOKS if getattr(cls, h) is not getattr(Rule, h))

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

    def check_bare(self, view: BareView) -> Iterator[Finding]:
        """An event of a graph that gets no shadow: a re-bound holder of an input, a
        read of its memory that does not hold the value meant."""
        return iter(())

    def check_hazard(self, view: HazardView) -> Iterator[Finding]:
        """A hazard the emulated runtime saw happen (graph-pool memory overwritten and
        read, a stream or event across a capture boundary)."""
        return iter(())

    def check_run(self, outcome: RunOutcome) -> Iterator[Finding]:
        """The whole run: a capture stopped by a host sync, the numerical oracle."""
        return iter(())

    def check_suppressions(self, view: SuppressionView) -> Iterator[Finding]:
        """The inline suppression comments, matched to the check's findings."""
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
        return Finding.of(self, view.site(segment), op=op.op if op else "", scope=op.scope if op else None,
                          tensor=tensor, capture_frame=capture_op.frame if capture_op else None,
                          shadow_frame=shadow_op.frame if shadow_op else None, message=message,
                          capture_stack=capture_op.stack if capture_op else (), steps=(view.shadow.step,))


def where(frame: Frame | None) -> str:
    return frame.location if frame else "<unknown>"


