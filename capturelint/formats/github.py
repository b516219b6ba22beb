"""Findings as GitHub Actions workflow commands: one ``::error`` annotation a problem
(a ``capturelint.findings.FindingGroup``: the findings of one cause in several layers,
graphs or configurations), and a ``::warning`` for each configuration whose replay was
not compared with eager execution.

Printed form::

    ::error file=engine/model.py,line=42,title=CL101 baked-control-flow::capture recorded ...%0A%0A
    Same cause in 8 findings: model.layers.{0..3}.attn; mixed/32 in v1/PIECEWISE, v1/FULL_AND_PIECEWISE
    ::warning title=replay not compared with eager (torch/cudagraph)::replay NOT compared ...
    ::notice title=findings accepted::2 findings suppressed, 1 accepted: they do not fail the check; ...

(the first line is one line). The annotation of a group carries the message of its
first finding, and, for a group of several, where else the cause was seen.

A finding is located at its ``location``, the line to change (``capturelint.findings``:
a re-binding, an allocation or a branch condition where a rule found one, else the
capture-side frame, else the shadow-side one); without one the annotation has a title
only. Escaping follows the Actions toolkit
(``@actions/core`` ``command.ts``): in the message ``%``, ``\\r`` and ``\\n`` become
``%25``, ``%0D`` and ``%0A``; in property values ``:`` and ``,`` also become ``%3A`` and
``%2C``, so a multi-line message stays one workflow command.
"""

from __future__ import annotations

from typing import Sequence

from capturelint.findings import Finding, FindingGroup, group_findings


def to_github(findings: Sequence[Finding], warnings: Sequence[tuple[str, str]] = (),
              notices: Sequence[tuple[str, str]] = ()) -> str:
    """One annotation line per group of findings (``group_findings``, in the order of
    their first findings' ``Finding.sort_key``), then one ``::warning`` line per
    ``(title, message)`` of ``warnings`` (what the check could not compare) and one
    ``::notice`` line per one of ``notices`` (the findings suppressed or accepted, as
    counted), each ending in a newline; the empty string for none."""
    lines = [group_annotation(g) for g in group_findings(findings)]
    lines += [f"::warning title={escape_property(title)}::{escape_data(message)}" for title, message in warnings]
    lines += [f"::notice title={escape_property(title)}::{escape_data(message)}" for title, message in notices]
    return "".join(line + "\n" for line in lines)


def group_annotation(group: FindingGroup) -> str:
    """The ``::error`` workflow command of a group: its first finding's, and where else
    the cause was seen when the group has several findings."""
    if len(group.findings) == 1:
        return annotation(group.first)
    return annotation(group.first, f"{group.first.message}\n\n{group.same_cause()}")


def annotation(finding: Finding, message: str | None = None) -> str:
    """The ``::error`` workflow command of one finding (no trailing newline), with
    ``message`` instead of the finding's own when given."""
    frame = finding.location
    props: list[tuple[str, str]] = []
    if frame is not None and frame.file and not frame.file.startswith("<"):
        props.append(("file", frame.file))
        if frame.line >= 1:
            props.append(("line", str(frame.line)))
    props.append(("title", f"{finding.code} {finding.name}"))
    rendered = ",".join(f"{key}={escape_property(value)}" for key, value in props)
    return f"::error {rendered}::{escape_data(finding.message if message is None else message)}"


def escape_data(text: str) -> str:
    """Escape a workflow command's message."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """Escape a workflow command's property value."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")
