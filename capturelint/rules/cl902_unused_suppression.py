"""CL902 unused-suppression (an inline suppression that no longer matches a finding)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from capturelint.findings import Condition, EditLine, Finding, LineRole, Site
from capturelint.rules.base import Rule

if TYPE_CHECKING:
    from capturelint.waivers import Suppression, SuppressionView


class UnusedSuppression(Rule):
    code = "CL902"
    name = "unused-suppression"
    condition = Condition.SUPPRESSION
    summary = "An inline `# capturelint: ignore[CODE]` comment names a code that no finding on its line has any more."
    message = (
        "`{text}` at {at} names {codes}, and no {codes} finding of this check is on its line, though {them} had "
        "something to check. A suppression that matches nothing hides the next finding that lands on its line. Remove "
        "the unused codes from the comment, or the comment when it names no other."
    )
    doc = """
    ## What it does
    After the check's findings are matched to the inline suppression comments of the
    source it ran (`# capturelint: ignore[CL104]` on one of a finding's lines: its
    location, capture, step or re-allocation line), reports each comment that names a
    code no finding on its line had, as ruff's RUF100 reports an unused `noqa`.

    ## Why is this bad?
    The hazard it accepted is gone (fixed, or the code moved), but the comment stays and
    silently accepts the next finding of that code on the line: a new bug would pass
    the gate unseen.

    ## Example
    ```python
    self.static_x.copy_(x)  # capturelint: ignore[CL104]   (the re-binding was fixed)
    ```

    ## Use instead
    Remove the comment, or the unused codes from it.

    ## Limitations
    A code is judged only where the check could have found it: its rule had something
    to check, and the check ran every configuration the project's check runs (no
    `--shard`, no engine option such as `--runner`, `--mode` or `--steps` given on the
    command line or to the API, no `--invariants` file). A narrowed check, or a rule
    that had nothing to check, leaves the comment unjudged rather than risk calling a
    suppression unused when the configuration that finds it did not run; `merge` of
    all the shards of a check judges as the unsharded check does. Comments are read in
    the files the check's findings name and the files whose code its captures ran.
    """

    def check_suppressions(self, view: SuppressionView) -> Iterator[Finding]:
        if not view.judged:
            return
        for s in view.suppressions:
            unused = s.unused()
            if s.problem is None and unused:
                yield self.make(s, unused)

    def make(self, s: Suppression, unused: tuple[str, ...]) -> Finding:
        codes = ", ".join(unused)
        message = self.message.format(text=s.text, at=s.where, codes=codes,
                                      them="its rule" if len(unused) == 1 else "their rules")
        return Finding.of(self, Site(), op=s.text, scope=None, tensor=None, capture_frame=s.frame, shadow_frame=None,
                          message=message, edit=EditLine(s.frame, LineRole.COMMENT))
