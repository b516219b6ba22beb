"""Findings as a SARIF 2.1.0 log, for code-scanning uploads.

The log has one run. Its ``tool.driver.rules`` are the rules handed in, sorted by code;
each result points at its rule by ``ruleId`` and ``ruleIndex``. The check's reporter
puts in the run's ``properties`` what each configuration checked (``checked``: runner,
mode and the JSON report's ``configurations[].checked`` record, so a log without results
still says whether replay was compared with eager) and, for a shard, its ``shard``. Printed form of a result
(abridged)::

    {"ruleId": "CL101", "ruleIndex": 0, "level": "error",
     "message": {"text": "..."},
     "locations": [{"physicalLocation": {
         "artifactLocation": {"uri": "engine/model.py", "uriBaseId": "%SRCROOT%"},
         "region": {"startLine": 42}}, ...}],
     "relatedLocations": [{"id": 1, "message": {"text": "shadow side ..."}, ...}],
     "partialFingerprints": {"capturelint/v1": "3f2a..."},
     "properties": {"runner": "v1", "mode": "PIECEWISE", "graph": "decode/4", ..., "group": "1fcd90973aaf"}}

**Location.** The primary location is the finding's ``location``, the line to change
(``capturelint.findings``: a re-binding, an allocation or a branch condition where a
rule found one, else the capture-side frame, else the shadow-side one); a finding with
none is located at ``fallback_uri`` if given. The op's own lines follow as related
locations: the capture side when it is not the primary one, the shadow side whenever
it is not the primary one, and the re-allocation line when it is not. Relative paths are relative to ``%SRCROOT%`` (the
checked project); absolute paths become ``file://`` URIs; frames that name no file
(``<string>``, ``<unknown>``) give no location.

**Fingerprint.** ``partialFingerprints["capturelint/v1"]`` is
``capturelint.findings.fingerprint``: it hashes the code, the file of the op's line,
the scope, the op and the tensor, and no line number, so an alert survives edits that
move code; the same hazard found under several runners or modes shares a fingerprint.

**Suppressions.** A finding suppressed by an inline comment or accepted by the
accepted-findings file (``capturelint.waivers``) is a result too, with the standard
``suppressions``: ``[{"kind": "inSource", "status": "accepted", "location": <the
comment>, "justification": <the text after it>}]``, or ``[{"kind": "external", ...,
"justification": "accepted in FILE"}]``; code scanning shows it as dismissed.

**One result a problem.** The findings of one cause (the same rule, source line and
cause in several layers, graphs or configurations: ``capturelint.findings.group_findings``;
a break handed one stale metadata object, whichever tensors inside it differ) are one
result: its first finding's, with ``properties.count`` (the findings) and, for several,
``properties.members`` (per configuration, ``runner/mode``: its findings, graphs and
module scopes) and the message's last paragraph saying where else the cause was seen,
as the GitHub annotation says it (``Same cause in 8 findings: model.layers.{0..3}.attn;
decode/4 in v1/PIECEWISE``). Their lines are one line by construction (the group key
holds them), so there are no other locations to relate. Findings waived alike (one
comment, or the accepted file) are grouped the same way, each waiver its own result.
``properties.group`` is the group id (``capturelint.findings.group_id``); it names the
line, so unlike the fingerprint it changes when code moves; the fingerprint is the
first finding's.

**Determinism.** Results follow ``Finding.sort_key``; the log has no timestamps, no
absolute paths of its own and no environment details: the same findings give the same
dictionary, and ``json.dumps`` of it gives the same bytes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePath
from typing import Any, Sequence
from urllib.parse import quote

from capturelint.errors import CapturelintError
from capturelint.findings import Finding, FindingGroup, Frame, RuleInfo, fingerprint, group_findings, group_id
from capturelint.waivers import Waived, WaiverKind

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA_URI = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
SRCROOT = "%SRCROOT%"
FINGERPRINT_KEY = "capturelint/v1"
RULE_TAGS = ("correctness", "cuda-graph", "replay-equivalence")


def to_sarif(
    findings: Sequence[Finding],
    rules: Sequence[RuleInfo],
    tool_version: str,
    *,
    fallback_uri: str | None = None,
    run_properties: dict[str, Any] | None = None,
    waived: Sequence[Waived] = (),
) -> dict[str, Any]:
    """A SARIF 2.1.0 log of ``findings``; ``rules`` must contain the rule of every
    finding (extra rules are listed too, so the log documents the whole rule set).

    ``fallback_uri`` (a path relative to ``%SRCROOT%``, e.g. the ``pyproject.toml``
    that configured the check) locates findings that have no source frame (the
    numerical oracle's); without it they have no location, which the SARIF schema
    allows but GitHub code scanning rejects ("expected at least one location").
    ``run_properties`` become the run's ``properties`` (a shard's ``shard`` object,
    ``capturelint.shard``). ``waived`` are the findings suppressed inline or accepted
    (``capturelint.waivers``): results too, each with its ``suppressions``."""
    descriptors, index = _rules(rules)
    results = []
    entries: list[tuple[FindingGroup, Waived | None]] = [(g, None) for g in group_findings(findings)]
    by_waiver: dict[tuple[WaiverKind, str, str], tuple[Waived, list[Finding]]] = {}  # waived alike: one result
    for w in waived:
        by_waiver.setdefault((w.kind, w.where, w.reason), (w, []))[1].append(w.finding)
    for w, members in by_waiver.values():
        entries += [(g, w) for g in group_findings(members)]
    for group, waiver in sorted(entries, key=lambda e: e[0].first.sort_key()):
        finding = group.first
        if finding.code not in index:
            known = ", ".join(sorted(index)) or "none"
            raise CapturelintError(
                f"finding {finding.code} ({finding.name}) has no rule in the SARIF rule list "
                f"(rules given: {known}); pass every registered rule to to_sarif"
            )
        result = _result(finding, index[finding.code], fallback_uri)
        if len(group.findings) > 1:
            result["message"]["text"] = f"{finding.message}\n\n{group.same_cause()}"
            result["properties"]["members"] = group.members()
            result["properties"]["count"] = len(group.findings)
        if waiver is not None:
            result["suppressions"] = [_suppression(waiver)]
        results.append(result)
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "capturelint",
                "version": tool_version,
                "rules": descriptors,
            }
        },
        "results": results,
    }
    if run_properties:
        run["properties"] = dict(run_properties)
    return {"$schema": SARIF_SCHEMA_URI, "version": SARIF_VERSION, "runs": [run]}


def _rules(rules: Sequence[RuleInfo]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    by_code: dict[str, RuleInfo] = {}
    for rule in rules:
        seen = by_code.get(rule.code)
        if seen is not None and seen != rule:
            raise CapturelintError(
                f"two different rules share the code {rule.code} ({seen.name}, {rule.name}); "
                "give every rule its own code"
            )
        by_code[rule.code] = rule
    ordered = [by_code[code] for code in sorted(by_code)]
    return [_rule(r) for r in ordered], {r.code: i for i, r in enumerate(ordered)}


def _rule(rule: RuleInfo) -> dict[str, Any]:
    text = markdown_to_text(rule.doc)
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": text, "markdown": rule.doc},
        "help": {"text": text, "markdown": rule.doc},
        "defaultConfiguration": {"level": "error"},
        "properties": {"tags": [*RULE_TAGS, str(rule.condition)], "condition": str(rule.condition)},
    }


def _result(finding: Finding, rule_index: int, fallback_uri: str | None) -> dict[str, Any]:
    result: dict[str, Any] = {
        "ruleId": finding.code,
        "ruleIndex": rule_index,
        "level": "error",
        "message": {"text": finding.message},
    }
    frame = finding.location
    primary = _location(frame)
    if primary is None and fallback_uri is not None:
        primary = _location(Frame(fallback_uri, 1, ""))
    if primary is not None:
        result["locations"] = [primary]
    related = []
    if finding.edit is not None and finding.capture_frame is not None:  # the op recorded, beside the line to change
        related.append((finding.capture_frame, f"captured op: {finding.capture_frame.function}"))
    if finding.shadow_frame is not None and finding.shadow_frame != frame:
        related.append((finding.shadow_frame, f"shadow (eager) side: {finding.shadow_frame.function}"))
    if finding.allocation_frame is not None and finding.allocation_frame != frame:
        related.append((finding.allocation_frame,
                        f"the step's tensor is re-allocated here: {finding.allocation_frame.function}"))
    for where, text in related:
        located = _location(where)
        if located is not None:
            result.setdefault("relatedLocations", []).append(
                {"id": len(result.get("relatedLocations", [])) + 1, **located, "message": {"text": text}})
    result["partialFingerprints"] = {FINGERPRINT_KEY: fingerprint(finding)}
    result["properties"] = {
        "runner": finding.runner,
        "mode": finding.mode,
        "graph": finding.graph,
        "runtimeMode": finding.runtime_mode,
        "segment": finding.segment,
        "segmentIndex": finding.segment_index,
        "scope": finding.scope,
        "op": finding.op,
        "tensor": finding.tensor,
        "condition": str(finding.condition),
        "steps": list(finding.steps),
        "occurrences": finding.occurrences,
        "group": group_id(finding),
        "count": 1,  # findings of its problem: to_sarif writes one result a problem
    }
    if finding.invariant is not None:
        result["properties"]["invariant"] = finding.invariant
    return result


def result_of(finding: Finding, rule_index: int) -> dict[str, Any]:
    """The result of one finding that has a source line, as ``to_sarif`` writes it
    (``capturelint merge`` writes the suppression comments' results with it)."""
    return _result(finding, rule_index, None)


def _suppression(w: Waived) -> dict[str, Any]:
    """A SARIF ``suppression``: ``inSource`` at the comment that accepts the finding,
    ``external`` for the accepted-findings file."""
    if w.kind is WaiverKind.INLINE:
        file, _, line = w.where.rpartition(":")
        out: dict[str, Any] = {"kind": "inSource", "status": "accepted"}
        located = _location(Frame(file, int(line), "")) if line.isdigit() else None
        if located is not None:
            out["location"] = located
        if w.reason:
            out["justification"] = w.reason
        return out
    return {"kind": "external", "status": "accepted", "justification": f"accepted in {w.where}"}


def _location(frame: Frame | None) -> dict[str, Any] | None:
    if frame is None or not frame.file or frame.file.startswith("<"):
        return None
    if os.path.isabs(frame.file):
        artifact: dict[str, Any] = {"uri": Path(frame.file).as_uri()}
    else:
        artifact = {"uri": quote(PurePath(frame.file).as_posix(), safe="/"), "uriBaseId": SRCROOT}
    physical: dict[str, Any] = {"artifactLocation": artifact}
    if frame.line >= 1:
        physical["region"] = {"startLine": frame.line}
    location: dict[str, Any] = {"physicalLocation": physical}
    if frame.function:
        location["logicalLocations"] = [{"name": frame.function, "kind": "function"}]
    return location


_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)]+)\)")
_EMPHASIS = re.compile(r"(\*\*|__)(.+?)\1")


def markdown_to_text(markdown: str) -> str:
    """Plain text of a rule doc: heading marks, code fences, emphasis and backticks
    removed, links written as ``text (url)``; line structure kept."""
    lines = []
    for line in markdown.strip().splitlines():
        if _FENCE.match(line):
            continue
        line = _HEADING.sub("", line)
        line = _LINK.sub(r"\1 (\2)", line)
        line = _EMPHASIS.sub(r"\2", line)
        lines.append(line.replace("`", "").rstrip())
    return "\n".join(lines)
