"""CL903 invalid-suppression (an inline suppression that names no rule code)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from capturelint.findings import Condition, EditLine, Finding, LineRole, Site
from capturelint.rules.base import Rule

if TYPE_CHECKING:
    from capturelint.waivers import SuppressionView


class InvalidSuppression(Rule):
    code = "CL903"
    name = "invalid-suppression"
    condition = Condition.SUPPRESSION
    summary = "An inline `# capturelint: ignore` comment names no rule code (bare, empty or unknown): it suppresses nothing."
    message = (
        "`{text}` at {at} {problem}: a suppression must name the codes it accepts, and capturelint refuses one that "
        "could hide any finding. It suppresses nothing, so the findings on its line still fail the check. Name the "
        "codes the line accepts, `# capturelint: ignore[CL104]` (capturelint rules lists them)."
    )
    doc = """
    ## What it does
    Reports every `# capturelint: ignore` comment in the source the check ran that
    does not name rule codes: a bare `# capturelint: ignore`, an empty
    `ignore[]`, an unclosed bracket, or a code that is no rule (`ignore[CL999]`),
    as ruff's PGH004 reports a blanket `noqa`.

    ## Why is this bad?
    A suppression without a code would accept any finding on its line, today's and
    every later one: a gate that a new hazard passes unseen. capturelint refuses it
    and says so instead of guessing what was meant; the findings on the line are
    reported as if the comment were not there.

    ## Example
    ```python
    self.static_x = x.to("cuda")  # capturelint: ignore
    ```

    ## Use instead
    ```python
    self.static_x = x.to("cuda")  # capturelint: ignore[CL104] -- the old batch is kept by the caller
    ```

    ## Limitations
    Comments are read in the files the check's findings name and the files whose
    code its captures ran; a comment elsewhere is not seen. A directive inside a
    string is not a comment and is ignored.
    """

    def check_suppressions(self, view: SuppressionView) -> Iterator[Finding]:
        for s in view.suppressions:
            if s.problem is not None:
                message = self.message.format(text=s.text, at=s.where, problem=s.problem)
                yield Finding.of(self, Site(), op=s.text, scope=None, tensor=None, capture_frame=s.frame,
                                 shadow_frame=None, message=message, edit=EditLine(s.frame, LineRole.COMMENT))
