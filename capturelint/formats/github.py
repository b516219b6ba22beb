"""Findings as GitHub Actions workflow commands: one ``::error`` annotation a line, and
a ``::warning`` for each configuration whose replay was not compared with eager execution.

Printed form::

    ::error file=engine/model.py,line=42,title=CL101 baked-control-flow::capture recorded ...
    ::warning title=replay not compared with eager (torch/cudagraph)::replay NOT compared ...

A finding is located at its capture-side frame, else its shadow-side frame; without
either the annotation has a title only. Escaping follows the Actions toolkit
(``@actions/core`` ``command.ts``): in the message ``%``, ``\\r`` and ``\\n`` become
``%25``, ``%0D`` and ``%0A``; in property values ``:`` and ``,`` also become ``%3A`` and
``%2C``, so a multi-line message stays one workflow command.
"""

from __future__ import annotations

from typing import Sequence

from capturelint.findings import Finding


def to_github(findings: Sequence[Finding], warnings: Sequence[tuple[str, str]] = ()) -> str:
    """One annotation line per finding, in ``Finding.sort_key`` order, then one
    ``::warning`` line per ``(title, message)`` of ``warnings`` (what the check could not
    compare), each ending in a newline; the empty string for neither."""
    lines = [annotation(f) for f in sorted(findings, key=Finding.sort_key)]
    lines += [f"::warning title={escape_property(title)}::{escape_data(message)}" for title, message in warnings]
    return "".join(line + "\n" for line in lines)


def annotation(finding: Finding) -> str:
    """The ``::error`` workflow command of one finding (no trailing newline)."""
    frame = finding.capture_frame or finding.shadow_frame
    props: list[tuple[str, str]] = []
    if frame is not None and frame.file and not frame.file.startswith("<"):
        props.append(("file", frame.file))
        if frame.line >= 1:
            props.append(("line", str(frame.line)))
    props.append(("title", f"{finding.code} {finding.name}"))
    rendered = ",".join(f"{key}={escape_property(value)}" for key, value in props)
    return f"::error {rendered}::{escape_data(finding.message)}"


def escape_data(text: str) -> str:
    """Escape a workflow command's message."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """Escape a workflow command's property value."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")
