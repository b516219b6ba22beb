"""Accepting a known finding, visibly: inline suppressions and the accepted-findings file.

**Inline suppression.** A comment on one of a finding's lines,
``# capturelint: ignore[CL104]`` (several codes comma-separated, ``ignore[CL101, CL104]``;
text after the bracket is the reason, ``# capturelint: ignore[CL104] -- refreshed by
the caller``), suppresses the findings of those codes that name that line: their
``location`` (the line to change: a re-binding, an allocation, a branch condition),
their capture-side line, their step-side line or their re-allocation line
(``Finding.lines``). The comment is read from the source when the report is made
(``capturelint.sources``), in every file a finding names and every file whose code the
check traced (``traced_files``); a comment inside a string is not one. A bare
``# capturelint: ignore`` (no code), an empty ``ignore[]`` or a code that names no rule
suppresses nothing and is itself reported (CL903): a suppression says what it accepts.

**Accepted findings.** ``check --accept-findings FILE`` keys findings by
``capturelint.findings.fingerprint`` (code, file, scope, op, tensor: no line number, so
an entry survives edits that move code) and accepts every finding whose fingerprint the
file lists. A FILE that does not exist is written with the check's findings (all of them
accepted from then on), ``--update-accepted`` rewrites it with the findings of the check
(entries that no longer occur are dropped, new findings added). Printed form::

    {"format": "capturelint-accepted-findings", "version": 1,
     "findings": [{"code": "CL104", "file": "myserve/runner.py", "fingerprint": "3f2a...",
                   "name": "stale-input", "op": "aten.addmm.default", "scope": "Linear",
                   "tensor": "runner.static_x"}]}

**What is judged.** A suppression code that matched no finding is reported (CL902), and
an accepted entry that matched none is listed as no longer occurring, only where the
check could have produced the finding: the code's rule had something to check in this
check (``--select``/``--ignore``, ``--static`` and configurations without a shadowed
step leave rules out), and the check ran every configuration the project's check runs:
no shard (``merge`` of all the shards judges, as the unsharded check would), no engine
option given on the command line or to the API (``--runner``, ``--mode``, ``--steps``,
...: each may leave out the configuration or the step that finds it), no
``--invariants`` file. ``--update-accepted`` from such a narrowed check adds its new
findings and drops no entry.

Suppressed and accepted findings do not fail the check; every report counts them and
lists them as such (JSON ``suppressed``, SARIF ``suppressions``, ``--verbose``). The
unused-suppression and invalid-suppression findings (CL902, CL903) are never suppressed
or accepted: fix the comment.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import re
import tokenize
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from capturelint.errors import CapturelintError
from capturelint.findings import Condition, Finding, fingerprint
from capturelint.inputs import InputProblem, parse_json, read_text
from capturelint.limits import MAX_REPORT_BYTES
from capturelint.runtime.protocol import Frame
from capturelint.sources import SourceFiles

if TYPE_CHECKING:
    from capturelint.records import Stream

ACCEPTED_FORMAT = "capturelint-accepted-findings"
ACCEPTED_VERSION = 1
MARK = "capturelint:"
_DIRECTIVE = re.compile(r"(?P<head>#\s*capturelint:\s*ignore\b\s*(?P<codes>\[[^\]]*\])?)(?P<rest>.*)$")
_CODE = re.compile(r"^CL\d{3}$")


class WaiverKind(enum.Enum):
    """How a finding was accepted; the value is the JSON word."""

    INLINE = "inline"  # a ``# capturelint: ignore[CODE]`` comment on one of its lines
    ACCEPTED = "accepted"  # an entry of the --accept-findings file

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class Suppression:
    """One ``# capturelint: ignore[...]`` comment, and what the check made of it.

    ``file`` is the path findings show, ``line`` the comment's line, ``codes`` the codes
    it names (upper case, in its order), ``text`` the directive as written (``#
    capturelint: ignore[CL104]``) and ``reason`` the text after it. ``problem`` says why
    it suppresses nothing (bare, empty, a code that is no rule; CL903), else ``None``.
    ``used`` are the codes a finding of this check matched, ``checked`` those whose
    rule had something to check in it (``unused`` reads both)."""

    file: str
    line: int
    codes: tuple[str, ...]
    text: str
    reason: str = ""
    problem: str | None = None
    used: tuple[str, ...] = ()
    checked: tuple[str, ...] = ()

    @property
    def frame(self) -> Frame:
        return Frame(self.file, self.line, "")

    @property
    def where(self) -> str:
        return self.frame.location

    def unused(self) -> tuple[str, ...]:
        """Codes whose rule had something to check and that matched no finding."""
        return tuple(c for c in self.codes if c in self.checked and c not in self.used)

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "codes": list(self.codes), "text": self.text,
                "reason": self.reason, "problem": self.problem, "used": list(self.used), "checked": list(self.checked)}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Suppression:
        return cls(doc["file"], doc["line"], tuple(doc["codes"]), doc["text"], doc["reason"], doc["problem"],
                   tuple(doc["used"]), tuple(doc["checked"]))


@dataclasses.dataclass(frozen=True)
class AcceptedEntry:
    """One finding of the accepted-findings file: its ``fingerprint`` and the parts it
    hashes, for a reader of the file."""

    fingerprint: str
    code: str
    name: str
    file: str
    scope: str
    op: str
    tensor: str | None
    invariant: str | None = None

    @classmethod
    def of(cls, f: Finding) -> AcceptedEntry:
        frame = f.capture_frame or f.shadow_frame
        return cls(fingerprint(f), f.code, f.name, frame.file if frame else "", f.scope, f.op, f.tensor, f.invariant)

    def describe(self) -> str:
        """``CL104 stale-input in myserve/runner.py (Linear · aten.addmm.default · runner.static_x)``."""
        what = " · ".join(p for p in (self.scope, self.op, self.tensor or "") if p)
        return f"{self.code} {self.name} in {self.file or '<no source line>'} ({what})"

    def to_json(self) -> dict[str, Any]:
        doc = {"fingerprint": self.fingerprint, "code": self.code, "name": self.name, "file": self.file,
               "scope": self.scope, "op": self.op, "tensor": self.tensor}
        if self.invariant is not None:
            doc["invariant"] = self.invariant
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> AcceptedEntry:
        return cls(doc["fingerprint"], doc["code"], doc["name"], doc["file"], doc["scope"], doc["op"], doc["tensor"],
                   doc.get("invariant"))


@dataclasses.dataclass(frozen=True)
class Waived:
    """A finding that does not fail the check: suppressed by a comment at ``where``
    (``path:line``, ``INLINE``) or accepted by the file ``where`` (``ACCEPTED``)."""

    finding: Finding
    kind: WaiverKind
    where: str
    reason: str = ""

    def describe(self) -> str:
        """``suppressed by # capturelint: ignore[CL104] at prog.py:20`` / ``accepted in FILE``."""
        if self.kind is WaiverKind.INLINE:
            return f"suppressed at {self.where}" + (f" ({self.reason})" if self.reason else "")
        return f"accepted in {self.where}"

    def to_json(self) -> dict[str, Any]:
        return {**self.finding.to_json(),
                "suppression": {"kind": str(self.kind), "where": self.where, "reason": self.reason}}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Waived:
        s = doc["suppression"]
        finding = Finding.from_json({k: v for k, v in doc.items() if k != "suppression"})
        return cls(finding, WaiverKind(s["kind"]), s["where"], s["reason"])


@dataclasses.dataclass(frozen=True)
class Waivers:
    """What a check made of the suppressions and the accepted findings.

    ``suppressions``: every suppression comment found in the source the check read,
    with its use. ``accepted_file``: the accepted-findings file given (as given), with
    ``accepted_entries`` entries, of which ``unmatched`` matched no finding. ``whole``:
    the check ran every configuration the project's check runs, apart from a shard
    (module docstring); a report judges (``judged``) only when it is also no shard's.
    ``rules``: the suppression rules selected, which judge the comments."""

    suppressions: tuple[Suppression, ...] = ()
    accepted_file: str | None = None
    accepted_entries: int = 0
    unmatched: tuple[AcceptedEntry, ...] = ()
    whole: bool = True
    rules: tuple[str, ...] = ()  # the suppression rules selected (CL902, CL903): what judges the comments

    @property
    def empty(self) -> bool:
        return not self.suppressions and self.accepted_file is None

    def stale(self, judged: bool, checked: Iterable[str]) -> tuple[AcceptedEntry, ...]:
        """The accepted entries that no longer occur: unmatched, in a check that judges,
        of a rule that had something to check."""
        codes = set(checked)
        return tuple(e for e in self.unmatched if judged and e.code in codes)

    def to_json(self) -> dict[str, Any]:
        return {
            "suppressions": [s.to_json() for s in self.suppressions],
            "accepted_file": self.accepted_file,
            "accepted_entries": self.accepted_entries,
            "unmatched": [e.to_json() for e in self.unmatched],
            "whole": self.whole,
            "rules": list(self.rules),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Waivers:
        return cls(tuple(Suppression.from_json(s) for s in doc["suppressions"]), doc["accepted_file"],
                   doc["accepted_entries"], tuple(AcceptedEntry.from_json(e) for e in doc["unmatched"]), doc["whole"],
                   tuple(doc["rules"]))

    def merged(self, other: Waivers) -> Waivers:
        """The record of two shards of one check: a suppression's uses and checked codes
        joined, an entry unmatched in both stays unmatched."""
        by_line: dict[tuple[str, int], Suppression] = {}
        for s in self.suppressions + other.suppressions:
            seen = by_line.get((s.file, s.line))
            if seen is None:
                by_line[(s.file, s.line)] = s
            else:
                by_line[(s.file, s.line)] = dataclasses.replace(
                    seen, used=_ordered(seen.codes, seen.used + s.used), checked=_ordered(seen.codes, seen.checked + s.checked))
        theirs = {e.fingerprint for e in other.unmatched}
        return dataclasses.replace(self, suppressions=tuple(sorted(by_line.values(), key=lambda s: (s.file, s.line))),
                                   unmatched=tuple(e for e in self.unmatched if e.fingerprint in theirs),
                                   whole=self.whole and other.whole)


@dataclasses.dataclass(frozen=True)
class SuppressionView:
    """What the suppression rules (CL902, CL903) judge: every comment found, and whether
    this check may call one unused (``judged``, the module docstring)."""

    suppressions: tuple[Suppression, ...]
    judged: bool


def _ordered(codes: tuple[str, ...], some: Iterable[str]) -> tuple[str, ...]:
    chosen = set(some)
    return tuple(c for c in codes if c in chosen)


# ------------------------------------------------------------------- comments


def parse_comment(comment: str, known: frozenset[str]) -> tuple[tuple[str, ...], str, str, str | None] | None:
    """``(codes, directive, reason, problem)`` of a comment token that holds a
    ``capturelint: ignore`` directive, else ``None``; ``problem`` is ``None`` for a
    well-formed one, else why it suppresses nothing."""
    m = _DIRECTIVE.search(comment)
    if m is None:
        return None
    directive, rest = m.group("head").rstrip(), m.group("rest")
    reason = rest.strip().lstrip("-—:;,").strip()
    if m.group("codes") is None and rest.lstrip().startswith("["):
        return (), directive, reason, "has no closing bracket after its codes"
    if m.group("codes") is None:
        return (), directive, reason, "names no code"
    codes = tuple(dict.fromkeys(c.strip().upper() for c in m.group("codes")[1:-1].split(",") if c.strip()))
    if not codes:
        return (), directive, reason, "names no code between its brackets"
    bad = [c for c in codes if not _CODE.match(c) or c not in known]
    if bad:
        return codes, directive, reason, f"names {', '.join(bad)}, which {'is' if len(bad) == 1 else 'are'} no rule code"
    return codes, directive, reason, None


def comments_in(lines: Sequence[str], file: str, known: frozenset[str]) -> list[Suppression]:
    """The suppression comments of one file's ``lines`` (Python comments only: a
    directive inside a string is none), each as a ``Suppression`` of ``file``."""
    if not any(MARK in line for line in lines):
        return []
    out: list[Suppression] = []
    readline = io.StringIO("\n".join(lines) + "\n").readline
    try:
        for tok in tokenize.generate_tokens(readline):
            if tok.type == tokenize.COMMENT and MARK in tok.string:
                parsed = parse_comment(tok.string, known)
                if parsed is not None:
                    codes, text, reason, problem = parsed
                    out.append(Suppression(file, tok.start[0], codes, text, reason, problem))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # a file tokenize cannot finish: the comments before the fault are kept
    return out


def find_suppressions(frames: Iterable[Frame], known: frozenset[str], sources: SourceFiles | None = None
                      ) -> tuple[Suppression, ...]:
    """The suppression comments of every file ``frames`` name (each read once), in
    file and line order."""
    sources = sources or SourceFiles()
    files: dict[str, Frame] = {}
    for frame in frames:
        if frame.file and not frame.file.startswith("<"):
            files.setdefault(frame.file, frame)
    out: list[Suppression] = []
    for file, frame in sorted(files.items()):
        lines = sources.lines(frame)
        if not isinstance(lines, str):
            out.extend(comments_in(lines, file, known))
    return tuple(out)


def traced_files(captures: Iterable[Stream]) -> tuple[Frame, ...]:
    """One frame per file of engine or model code the captures ran (their ops' lines
    and the engine stacks above them), to look for suppression comments in."""
    seen_lines: set[Frame] = set()
    files: dict[str, Frame] = {}
    for capture in captures:
        for op in capture.ops:
            if op.frame in seen_lines:
                continue
            seen_lines.add(op.frame)
            for frame in (op.frame, *op.stack):
                files.setdefault(frame.file, Frame(frame.file, 0, "", source=frame.source))
    return tuple(files[f] for f in sorted(files))


# ------------------------------------------------------------------ matching


def waive(findings: Sequence[Finding], suppressions: Sequence[Suppression], accepted: Sequence[AcceptedEntry],
          accepted_file: str | None) -> tuple[list[Finding], list[Waived], tuple[Suppression, ...], tuple[AcceptedEntry, ...]]:
    """Split ``findings`` into those that stay and those waived, a comment on one of
    their lines first, else an accepted entry; the comments with the codes they
    matched (``used``), and the accepted entries no finding matched. Pure: the same
    arguments give the same result in any order of ``findings``."""
    by_line = {(s.file, s.line): s for s in suppressions if s.problem is None}
    by_print = {e.fingerprint: e for e in accepted}
    used: dict[tuple[str, int], set[str]] = {}
    matched: set[str] = set()
    kept: list[Finding] = []
    waived: list[Waived] = []
    for f in findings:
        if f.condition is Condition.SUPPRESSION:  # a finding about a comment: fix the comment
            kept.append(f)
            continue
        comment = next((by_line[(fr.file, fr.line)] for fr in f.lines()
                        if (fr.file, fr.line) in by_line and f.code in by_line[(fr.file, fr.line)].codes), None)
        if comment is not None:
            used.setdefault((comment.file, comment.line), set()).add(f.code)
            waived.append(Waived(f, WaiverKind.INLINE, comment.where, comment.reason))
            continue
        key = fingerprint(f)
        if key in by_print and accepted_file is not None:
            matched.add(key)
            waived.append(Waived(f, WaiverKind.ACCEPTED, accepted_file))
            continue
        kept.append(f)
    marked = tuple(dataclasses.replace(s, used=_ordered(s.codes, used.get((s.file, s.line), ()))) for s in suppressions)
    return kept, waived, marked, tuple(e for e in accepted if e.fingerprint not in matched)


def with_checked(suppressions: Sequence[Suppression], checked: Iterable[str]) -> tuple[Suppression, ...]:
    """The comments with ``checked`` set: their codes whose rule had something to check."""
    codes = set(checked)
    return tuple(dataclasses.replace(s, checked=tuple(c for c in s.codes if c in codes)) for s in suppressions)


# ------------------------------------------------------------ the accepted file


def load_accepted(path: str) -> tuple[AcceptedEntry, ...]:
    """The entries of the accepted-findings file at ``path``; every fault is one line
    naming the file and what to do."""
    redo = f"record it again with capturelint check --accept-findings {path} --update-accepted"
    try:
        doc = parse_json(read_text(path, MAX_REPORT_BYTES), path)
    except InputProblem as e:
        raise CapturelintError(f"--accept-findings: {path} {e.problem}; {redo}") from None
    except ValueError as e:
        raise CapturelintError(f"--accept-findings: {path} is not JSON ({' '.join(str(e).split())}); {redo}") from None
    if not isinstance(doc, dict) or doc.get("format") != ACCEPTED_FORMAT:
        raise CapturelintError(f"--accept-findings: {path} is not a capturelint accepted-findings file (no \"format\": "
                               f"\"{ACCEPTED_FORMAT}\"); name the file check --accept-findings wrote, or a new path")
    if doc.get("version") != ACCEPTED_VERSION:
        raise CapturelintError(f"--accept-findings: {path} is of version {doc.get('version')!r}, and this capturelint "
                               f"reads version {ACCEPTED_VERSION}; {redo}")
    try:
        entries = tuple(AcceptedEntry.from_json(e) for e in doc["findings"])
        for e in entries:
            if not isinstance(e.fingerprint, str) or not re.fullmatch(r"[0-9a-f]{32}", e.fingerprint):
                raise ValueError(f"fingerprint {e.fingerprint!r} is not 32 hex digits")
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        detail = f"field {e} is missing" if isinstance(e, KeyError) else " ".join(str(e).split())
        raise CapturelintError(f"--accept-findings: {path} is not a well-formed accepted-findings file ({detail}); "
                               f"{redo}") from None
    return entries


def dump_accepted(entries: Iterable[AcceptedEntry]) -> str:
    """The accepted-findings file of ``entries``: one per fingerprint, in file, code
    and fingerprint order, so the same findings give the same bytes."""
    import json

    unique = {e.fingerprint: e for e in entries}
    ordered = sorted(unique.values(), key=lambda e: (e.file, e.code, e.fingerprint))
    doc = {"format": ACCEPTED_FORMAT, "version": ACCEPTED_VERSION, "findings": [e.to_json() for e in ordered]}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


__all__ = ["ACCEPTED_FORMAT", "AcceptedEntry", "Suppression", "SuppressionView", "WaiverKind", "Waived", "Waivers",
           "comments_in", "dump_accepted", "find_suppressions", "load_accepted", "parse_comment", "traced_files", "waive",
           "with_checked"]
