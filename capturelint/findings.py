"""What the checker reports: findings, their source frames, and per-configuration
numerical results. Every output format (Rich, JSON, SARIF, GitHub annotations) renders
these records and nothing else.

**Location.** Every finding names the line a developer edits (``Finding.location``):
the assignment that re-bound a captured input, the allocation that replaced it, the
branch condition whose choice differed, the line that took a view a later replay
rewrote, where a rule found one (``Finding.edit``, with its ``LineRole``);
else the captured op's line, else the step's. Every format puts it first (the rich
problem line, JSON ``location``, SARIF's first location, the GitHub annotation); the
op's own lines stay beside it (``capture_frame``, ``shadow_frame``).

**Keys.** ``capturelint.finding_keys`` is the one place a finding is keyed, each key
named for what it serves: ``order_key`` (``Finding.sort_key``, the output order),
``cause_key``/``group_id`` (one problem across layers and configurations),
``occurrence_key`` (one finding across replay steps), ``trial_key`` (one finding across
the regions ``suggest`` tries) and ``fingerprint`` (one hazard across runs, with no line
number: the SARIF ``partialFingerprints`` and the ``--accept-findings`` file both key
by it). This module re-exports ``cause_key``, ``group_id`` and ``fingerprint``.

**Groups.** One cause usually shows in many findings: the same captured branch in every
layer, under every mode that captures it. ``group_findings`` (a pure function, the one
grouping every format uses) gathers the findings that share their rule, their source
line and their cause into a ``FindingGroup``, whose ``id`` (``group_id``) names it in
the JSON and SARIF reports. Every format has one entry per group: the terminal report,
the GitHub annotations and ``Report.assert_clean`` (``FindingGroup.line``, ``why``,
``fix``), the JSON report (``FindingGroup.to_json``: the first finding, a ``count`` and
the other members) and the SARIF log (one result with ``properties.count``).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from typing import Any, Iterable, Protocol

from capturelint.finding_keys import cause_key, fingerprint, group_id, group_order, order_key  # re-exported: cause_key, fingerprint, group_id
from capturelint.lists import cut
from capturelint.runtime.protocol import Frame


class LineRole(enum.Enum):
    """Which line a finding's ``location`` is; the value is the JSON word."""

    CAPTURE = "capture"  # the captured op's line (the default)
    STEP = "step"  # the step-side op's line (a finding without a capture-side one)
    REBINDING = "re-binding"  # the assignment that replaced a captured input
    ALLOCATION = "allocation"  # the allocation of the tensor that replaced a captured input
    BRANCH = "branch"  # the condition whose choice differed between capture and step
    VIEW = "view"  # the line that took a view of graph memory a later replay rewrote
    COMMENT = "comment"  # an inline suppression comment (CL902, CL903)
    BREAK = "break"  # the eager break where a divergence from the eager twin enters (CL901)

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class EditLine:
    """The line to change that a rule found, and what that line is."""

    frame: Frame
    role: LineRole


class Condition(enum.Enum):
    """The replay-equivalence conditions of docs/replay-model.md."""

    R1 = "R1"
    R2 = "R2"
    R3 = "R3"
    R4 = "R4"
    R5 = "R5"
    R6 = "R6"
    R7 = "R7"  # graph memory, read outside the graph, holds the value meant (bare graphs)
    NUMERICAL = "numerical"
    DECLARED = "declared"  # a declared region invariant (capturelint.invariants), not a replay condition
    SUPPRESSION = "suppression"  # an inline suppression comment itself (capturelint.waivers), not the engine

    def __str__(self) -> str:
        return self.value


class Named(Protocol):
    """What a finding takes of its rule (a ``capturelint.rules.base.Rule`` or its
    ``RuleInfo``): code, name and condition."""

    code: str
    name: str
    condition: Condition


@dataclasses.dataclass(frozen=True)
class Site:
    """Where in a run a finding was seen: the configuration (``runner``, ``mode``), the
    captured graph (``graph``, its ``runtime_mode``) and the segment (``segment``, the
    label, and its ``segment_index``). A finding of the whole run (the numerical oracle)
    has only a configuration; one of a suppression comment has none (``Site()``)."""

    runner: str = ""
    mode: str = ""
    graph: str = ""
    runtime_mode: str = ""
    segment: str = ""
    segment_index: int = -1

    @classmethod
    def captured(cls, runner: str, mode: str, graph: str, runtime_mode: str, index: int) -> Site:
        """Captured segment ``index`` of ``graph``: ``"decode/4 #2 captured"``."""
        return cls(runner, mode, graph, runtime_mode, f"{graph} #{index} captured", index)


@dataclasses.dataclass(frozen=True)
class Finding:
    """One violated condition, located.

    ``segment`` is ``"<graph> #<index> <kind>[ <break name>]"`` e.g.
    ``"decode/4 #2 captured"``; ``graph`` is the batch descriptor of the captured graph
    and ``runtime_mode`` the mode it was captured in. ``tensor`` is the human name of
    the tensor concerned (parameter, runner buffer, metadata field, cache or producing
    op), or ``None`` when the finding concerns an op. ``steps`` are the replay steps
    where it was seen (first few), ``occurrences`` how many times in all.
    ``capture_stack`` is the engine frames on the stack of the captured op (or of the
    break's call) at capture, innermost first, up to the captured callable: the
    functions ``capturelint suggest`` tries as eager breaks. It is not part of the JSON.
    ``edit`` is the line to change where a rule found one other than the op's
    (``location`` reads it, see the module docstring).
    """

    code: str
    name: str
    condition: Condition
    runner: str
    mode: str
    graph: str
    runtime_mode: str
    segment: str
    segment_index: int
    op: str
    scope: str
    tensor: str | None
    capture_frame: Frame | None
    shadow_frame: Frame | None
    message: str
    steps: tuple[int, ...] = ()
    occurrences: int = 1
    allocation_frame: Frame | None = None  # where the step's replacement tensor was allocated (CL104)
    capture_stack: tuple[Frame, ...] = dataclasses.field(default=(), compare=False, repr=False)
    invariant: str | None = None  # the id of the declared invariant violated (CL2xx)
    edit: EditLine | None = None  # the line to change, where a rule found one other than the op's

    @classmethod
    def of(cls, rule: Named, site: Site, *, op: str, scope: str | None, tensor: str | None,
           capture_frame: Frame | None, shadow_frame: Frame | None, message: str, **more: Any) -> Finding:
        """The finding of ``rule`` at ``site``: what it is about (op, module scope, tensor;
        an empty scope is ``<top>``), its lines on the capture and step sides, the
        message, and ``more`` of the optional fields (``steps``, ``allocation_frame``,
        ``capture_stack``, ``edit``, ...)."""
        return cls(code=rule.code, name=rule.name, condition=rule.condition, runner=site.runner, mode=site.mode,
                   graph=site.graph, runtime_mode=site.runtime_mode, segment=site.segment,
                   segment_index=site.segment_index, op=op, scope=scope or "<top>", tensor=tensor,
                   capture_frame=capture_frame, shadow_frame=shadow_frame, message=message, **more)

    @property
    def site(self) -> Site:
        return Site(self.runner, self.mode, self.graph, self.runtime_mode, self.segment, self.segment_index)

    @property
    def location(self) -> Frame | None:
        """The line a developer edits: ``edit``'s, else the capture side's, else the
        step side's (``None``: the numerical oracle's CL901)."""
        return self.edit.frame if self.edit is not None else self.capture_frame or self.shadow_frame

    @property
    def location_role(self) -> LineRole | None:
        if self.edit is not None:
            return self.edit.role
        return LineRole.CAPTURE if self.capture_frame else LineRole.STEP if self.shadow_frame else None

    def lines(self) -> tuple[Frame, ...]:
        """Every source line the report names for this finding: its location, the
        capture side, the step side and the re-allocation, each once (an inline
        suppression on any of them applies, ``capturelint.waivers``)."""
        frames = (self.location, self.capture_frame, self.shadow_frame, self.allocation_frame)
        return tuple(dict.fromkeys(f for f in frames if f is not None))

    def sort_key(self) -> tuple:
        """The order findings are listed in (``capturelint.finding_keys.order_key``)."""
        return order_key(self)

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "name": self.name,
            "condition": str(self.condition),
            "runner": self.runner,
            "mode": self.mode,
            "graph": self.graph,
            "runtime_mode": self.runtime_mode,
            "segment": self.segment,
            "segment_index": self.segment_index,
            "op": self.op,
            "scope": self.scope,
            "tensor": self.tensor,
            "capture_frame": self.capture_frame.to_json() if self.capture_frame else None,
            "shadow_frame": self.shadow_frame.to_json() if self.shadow_frame else None,
            "allocation_frame": self.allocation_frame.to_json() if self.allocation_frame else None,
            "location": _location_json(self),
            "message": self.message,
            "steps": list(self.steps),
            "occurrences": self.occurrences,
            **({"invariant": self.invariant} if self.invariant is not None else {}),
            "group": group_id(self),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Finding:
        """The finding ``to_json`` wrote (``Finding.from_json(d).to_json() == d``); the
        engine stack at capture (``capture_stack``) is not in the JSON and stays empty."""
        return cls(
            code=doc["code"], name=doc["name"], condition=Condition(doc["condition"]), runner=doc["runner"],
            mode=doc["mode"], graph=doc["graph"], runtime_mode=doc["runtime_mode"], segment=doc["segment"],
            segment_index=doc["segment_index"], op=doc["op"], scope=doc["scope"], tensor=doc["tensor"],
            capture_frame=_frame(doc["capture_frame"]), shadow_frame=_frame(doc["shadow_frame"]),
            message=doc["message"], steps=tuple(doc["steps"]), occurrences=doc["occurrences"],
            allocation_frame=_frame(doc["allocation_frame"]), invariant=doc.get("invariant"),
            edit=_edit(doc.get("location")),
        )


def _frame(doc: dict[str, Any] | None) -> Frame | None:
    """A ``Frame`` from its JSON (file, line, function), or ``None``."""
    return None if doc is None else Frame(doc["file"], doc["line"], doc["function"])


def _location_json(f: Finding) -> dict[str, Any] | None:
    """``{"file", "line", "function", "role"}`` of ``f.location``, or ``None``."""
    frame = f.location
    return None if frame is None else {**frame.to_json(), "role": str(f.location_role)}


def _edit(doc: dict[str, Any] | None) -> EditLine | None:
    """The ``edit`` a JSON ``location`` says: one whose role is not the op's own line."""
    if doc is None or doc["role"] in (LineRole.CAPTURE.value, LineRole.STEP.value):
        return None
    return EditLine(Frame(doc["file"], doc["line"], doc["function"]), LineRole(doc["role"]))


# ------------------------------------------------------------------------ groups


@dataclasses.dataclass(frozen=True)
class MessageParts:
    """A finding's message in three sentences: ``what`` replay gets wrong, ``why``
    (the cause the rule found, or the declared invariant's own reason) and ``fix``.

    Rule messages name cause, consequence and fix (``capturelint.rules.base.Rule``),
    in that order: the first sentence states the evidence, the last one is the fix,
    and the sentences between say what replay does (the last of them before any
    ``Why:`` is ``what``) and, for a declared invariant, its ``Why:`` (``why``; else
    the sentences before ``what``, as CL101's forward-context note, else the evidence).
    A two-sentence message has its consequence after the last colon of the first
    sentence, outside brackets (``... passes n=5: replay computes with the capture's
    value.``): ``what`` is that, ``why`` the evidence before it.
    """

    what: str
    why: str
    fix: str

    @classmethod
    def of(cls, message: str) -> MessageParts:
        sentences = _split_top(message.strip(), _SENTENCE_END)
        if len(sentences) < 2:
            return cls(_sentence(message, upper=False), "", "")
        first, middle, fix = sentences[0], sentences[1:-1], sentences[-1]
        why_at = next((i for i, s in enumerate(middle) if s.startswith("Why: ")), len(middle))
        stated, reasons = middle[:why_at], middle[why_at:]
        if stated:
            what, why = stated[-1], " ".join(reasons)[5:] or " ".join(stated[:-1]) or first
        else:
            head, _, tail = _rsplit_top(first, ": ")
            what, why = (tail, head) if tail else (first, "")
            why = " ".join(reasons)[5:] or why
        return cls(_sentence(what, upper=False), _sentence(why), _sentence(fix))


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`])")


def _depths(text: str) -> list[int]:
    """The bracket depth before each character of ``text``."""
    depth, out = 0, []
    for ch in text:
        out.append(depth)
        if ch in "([{":
            depth += 1
        elif ch in ")]}" and depth:
            depth -= 1
    return out


def _split_top(text: str, pattern: re.Pattern[str]) -> list[str]:
    """``text`` split where ``pattern`` matches outside brackets."""
    depths, parts, start = _depths(text), [], 0
    for m in pattern.finditer(text):
        if depths[m.start()] == 0:
            parts.append(text[start:m.start()])
            start = m.end()
    parts.append(text[start:])
    return [p for p in (p.strip() for p in parts) if p]


def _rsplit_top(text: str, sep: str) -> tuple[str, str, str]:
    """``str.rpartition`` at the last ``sep`` outside brackets."""
    depths = _depths(text)
    at = text.rfind(sep)
    while at >= 0 and depths[at]:
        at = text.rfind(sep, 0, at)
    return (text[:at], sep, text[at + len(sep):]) if at >= 0 else (text, "", "")


def _sentence(text: str, upper: bool = True) -> str:
    """``text`` as a sentence ending in a full stop, its first word capitalised
    (``upper``) or not, as ruff's messages begin; a first word that is not a plain word
    (``aten.mm.default``, ``CUDA``) is left as it is."""
    text = text.strip()
    if not text:
        return ""
    word = text.split(None, 1)[0]
    if upper and word.isalpha() and word.islower():
        text = text[0].upper() + text[1:]
    elif not upper and word.isalpha() and word[0].isupper() and (len(word) == 1 or word[1:].islower()):
        text = text[0].lower() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."


def where(f: Finding) -> str:
    """``path:line`` of a finding's ``location`` (the line to change), or ``<no
    source line>`` (the numerical oracle's CL901)."""
    return f.location.location if f.location is not None else "<no source line>"


@dataclasses.dataclass(frozen=True)
class FindingGroup:
    """The findings of one problem (``cause_key``), in ``Finding.sort_key`` order;
    ``findings[0]`` speaks for the group."""

    id: str
    findings: tuple[Finding, ...]

    @property
    def first(self) -> Finding:
        return self.findings[0]

    @property
    def code(self) -> str:
        return self.first.code

    @property
    def frame(self) -> Frame | None:
        """Where the group is located: its first finding's ``location``."""
        return self.first.location

    @property
    def where(self) -> str:
        """``path:line``, or ``<no source line>`` (the numerical oracle's CL901)."""
        return where(self.first)

    @property
    def parts(self) -> MessageParts:
        return MessageParts.of(self.first.message)

    @property
    def occurrences(self) -> int:
        """Replay steps (or captures) where the group's findings were seen, in all."""
        return sum(f.occurrences for f in self.findings)

    def scopes(self) -> str:
        """``model.layers.{0..3}.attn``: the module scopes of the members, compacted."""
        return compact_names([f.scope for f in self.findings])

    def graphs(self) -> str:
        """``mixed/32 in v1/PIECEWISE, v1/FULL_AND_PIECEWISE``: the graphs of the
        members, per set of configurations (runner/mode) they were found in."""
        return graphs_text({label: m["graphs"] for label, m in self.members().items()})

    def members(self) -> dict[str, dict[str, Any]]:
        """Per configuration (``runner/mode``, in the members' order) how many members
        it holds and their distinct graphs and scopes: all a report needs to say where
        the cause was seen (``same_cause``), and what ``capturelint merge`` adds up when
        one problem's findings come from several shards (each configuration is one
        shard's). A suppression comment's finding is of no configuration: left out."""
        out: dict[str, dict[str, Any]] = {}
        for f in self.findings:
            if not f.runner and not f.mode:
                continue
            m = out.setdefault(f"{f.runner}/{f.mode}", {"findings": 0, "graphs": [], "scopes": []})
            m["findings"] += 1
            if f.graph and f.graph not in m["graphs"]:
                m["graphs"].append(f.graph)
            if f.scope not in m["scopes"]:
                m["scopes"].append(f.scope)
        return out

    def same_cause(self) -> str:
        """``Same cause in 8 findings: model.layers.{0..3}.attn; mixed/32 in v1/PIECEWISE``
        (empty for a group of one): what the GitHub annotation and the SARIF result of a
        group add to their first finding's message."""
        if len(self.findings) == 1:
            return ""
        return same_cause_text(len(self.findings), [f.scope for f in self.findings], self.graphs())

    def to_json(self) -> dict[str, Any]:
        """The problem as the JSON report lists it: its first finding's fields, its
        ``count`` of findings and, for a group of several, ``members``: each other
        finding as the fields in which it differs from the first, so that a tool that
        wants every finding (``capturelint merge``) has each, and a reader has one
        entry per problem (``problem_findings`` reads it back)."""
        first = self.first.to_json()
        doc: dict[str, Any] = {**first, "count": len(self.findings)}
        if len(self.findings) > 1:
            doc["members"] = [{k: v for k, v in f.to_json().items() if k not in first or v != first[k]}
                              for f in self.findings[1:]]
        return doc

    def line(self) -> str:
        """The group as ruff and flake8 print a finding: ``path:line: CODE what
        [N findings: invariant ID; scopes; graphs]`` (one line; ``parts`` has the why
        and the fix)."""
        n = len(self.findings)
        invariant = f"invariant {self.first.invariant}" if self.first.invariant else ""
        scopes = self.scopes()
        seen = "; ".join(p for p in (invariant, scopes if scopes != "<top>" else "", self.graphs()) if p)
        what = self.parts.what.rstrip(".")
        about = f"{f'{n} findings: ' if n > 1 else ''}{seen}"
        return f"{self.where}: {self.code} {what}" + (f" [{about}]" if about else "")


def problem_findings(doc: dict[str, Any]) -> list[Finding]:
    """The findings of one problem of a JSON report (``FindingGroup.to_json``): the
    first, then each member with the first's fields where it names none; a ``count``
    that disagrees with them is a ``ValueError`` (an entry of one finding, as
    ``problem_entries`` gives them, has none)."""
    entries = problem_entries(doc)
    if doc.get("count", 1) != len(entries):
        raise ValueError(f"problem {doc.get('group')} says count {doc.get('count')!r} and lists {len(entries)} findings")
    return [Finding.from_json(e) for e in entries]


def problem_entries(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON of each finding of one problem of a JSON report: the first (the entry
    without ``count`` and ``members``), then each member with the first's fields where it
    names none. An entry of a report of version 1 (one entry a finding) is its own."""
    base = {k: v for k, v in doc.items() if k not in ("count", "members")}
    return [base] + [{**base, **m} for m in doc.get("members", ())]


def graphs_text(by_config: dict[str, list[str]]) -> str:
    """``mixed/32 in v1/PIECEWISE, v1/FULL_AND_PIECEWISE``: graphs per configuration
    (``runner/mode``, in order), the configurations with the same graphs named together."""
    by_graphs: dict[str, list[str]] = {}
    for label, graphs in by_config.items():
        by_graphs.setdefault(compact_graphs(graphs), []).append(label)
    return "; ".join(f"{graphs} in {', '.join(labels)}" if graphs else ", ".join(labels)
                     for graphs, labels in by_graphs.items())


def same_cause_text(count: int, scopes: Iterable[str], graphs: str) -> str:
    """``Same cause in COUNT findings: SCOPES; GRAPHS`` (``FindingGroup.same_cause``)."""
    scoped = compact_names(scopes)
    return f"Same cause in {count} findings: " + "; ".join(p for p in (scoped, graphs) if p and p != "<top>")


def group_findings(findings: Iterable[Finding]) -> list[FindingGroup]:
    """The findings grouped by cause (``cause_key``): one ``FindingGroup`` per problem,
    ordered as ruff orders its lines, by file, line and code (groups without a source
    line, the numerical oracle's, last). Pure: the same findings give the same groups
    in any order."""
    groups: dict[str, list[Finding]] = {}
    for f in sorted(findings, key=Finding.sort_key):
        groups.setdefault(group_id(f), []).append(f)
    out = [FindingGroup(gid, tuple(members)) for gid, members in groups.items()]
    return sorted(out, key=group_order)


_NAME_INDEX = re.compile(r"((?<=[A-Za-z_]\.)\d+\b)")


def compact_names(names: Iterable[str]) -> str:
    """``model.layers.{0..3}.attn``: distinct dotted names that differ in one numeric
    component written once, with the numbers as runs (``{0..3,6}``); other names
    listed, at most five."""
    patterns: dict[tuple[str, ...], list[list[str]]] = {}
    for name in dict.fromkeys(names):
        parts = _NAME_INDEX.split(name)  # text, index, text, index, ...
        patterns.setdefault(tuple(p if i % 2 == 0 else "#" for i, p in enumerate(parts)), []).append(parts)
    out: list[str] = []
    for members in patterns.values():
        varying = [i for i in range(1, len(members[0]), 2) if len({m[i] for m in members}) > 1]
        if len(members) == 1 or len(varying) != 1:
            out.extend("".join(m) for m in members)
            continue
        at = varying[0]
        numbers = sorted({int(m[at]) for m in members})
        out.append("".join(members[0][:at]) + "{" + _runs(numbers) + "}" + "".join(members[0][at + 1:]))
    return cut(out)


def compact_graphs(graphs: list[str]) -> str:
    """``mixed/1-32 (6 graphs), decode/4``: graphs of one kind (``kind/size``) as the
    range of their sizes when there are more than two."""
    kinds: dict[str, list[str]] = {}
    for g in graphs:
        kind, sep, size = g.rpartition("/")
        kinds.setdefault(kind if sep and size.isdigit() else g, []).append(g)
    out = []
    for kind, members in kinds.items():
        if len(members) > 2:
            sizes = sorted(int(g.rpartition("/")[2]) for g in members)
            out.append(f"{kind}/{sizes[0]}-{sizes[-1]} ({len(members)} graphs)")
        else:
            out.extend(members)
    return ", ".join(out)


def _runs(numbers: list[int]) -> str:
    """``0..3,6``: sorted numbers with runs of three or more as ranges."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ",".join(f"{r[0]}..{r[-1]}" if len(r) >= 3 else ",".join(map(str, r)) for r in runs)


@dataclasses.dataclass(frozen=True)
class RuleInfo:
    """What an output format needs to know of a rule: its stable code, its kebab-case
    name, the condition it checks, a one-sentence summary and the full Markdown doc
    (sections: what it does, why it is bad, example, use instead, limitations)."""

    code: str
    name: str
    condition: Condition
    summary: str
    doc: str


DIVERGENCE_TOLERANCE = 1e-4
"""Replay-versus-eager differences at or below this are float noise."""


@dataclasses.dataclass(frozen=True)
class Numerical:
    """The numerical oracle for one runner and mode: token agreement of the captured
    run with its eager twin, and the largest per-step difference between a replay's
    output and its shadow's. A user's target (``check --target``) has no token
    agreement (``None``); ``max_logit_error`` is then the largest difference between
    its output and its ``eager()`` twin's, or ``None`` without one."""

    runner: str
    mode: str
    token_agreement: float | None  # None: the target has no eager twin
    max_step_error: float
    max_logit_error: float | None
    replay_steps: int

    @property
    def diverged(self) -> bool:
        """Whether replay computed something else than eager execution: tokens that
        disagree with the eager twin, a twin error (targets without tokens) or a
        replay-versus-shadow step error above ``DIVERGENCE_TOLERANCE``."""
        agreement, twin = self.token_agreement, self.max_logit_error
        return (
            (agreement is not None and agreement < 1.0)
            or (agreement is None and twin is not None and not twin <= DIVERGENCE_TOLERANCE)
            or not self.max_step_error <= DIVERGENCE_TOLERANCE
        )

    def describe(self) -> str:
        """``token agreement 0.18, max step error 3.2``: what the oracle measured."""
        parts = []
        if self.token_agreement is not None:
            parts.append(f"token agreement {self.token_agreement:.2f}")
        elif self.max_logit_error is not None:
            parts.append(f"eager-twin error {self.max_logit_error:.3g}")
        parts.append(f"max step error {self.max_step_error:.3g}")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "runner": self.runner,
            "mode": self.mode,
            "token_agreement": None if self.token_agreement is None else round(self.token_agreement, 6),
            "max_step_error": json_number(self.max_step_error),
            "max_logit_error": None if self.max_logit_error is None else json_number(self.max_logit_error),
            "replay_steps": self.replay_steps,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Numerical:
        """The record ``to_json`` wrote, with its values as the JSON rounded them (6
        significant digits): ``Numerical.from_json(d).to_json() == d``."""
        return cls(doc["runner"], doc["mode"], _optional_number(doc["token_agreement"]),
                   _from_number(doc["max_step_error"]), _optional_number(doc["max_logit_error"]),
                   doc["replay_steps"])


def json_number(x: float) -> float | str:
    """A float for JSON: 6 significant digits; ``"inf"`` or ``"nan"`` where it is not
    finite (JSON has no such numbers)."""
    if x != x:
        return "nan"
    if x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    return float(f"{x:.6g}")


def _from_number(x: float | str) -> float:
    """The inverse of ``json_number``: ``"nan"``, ``"inf"`` and ``"-inf"`` are read back as floats."""
    if isinstance(x, str):
        if x not in ("nan", "inf", "-inf"):
            raise ValueError(f"{x!r} is not a number")
        return float(x)
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ValueError(f"{x!r} is not a number")
    return float(x)


def _optional_number(x: float | str | None) -> float | None:
    return None if x is None else _from_number(x)
