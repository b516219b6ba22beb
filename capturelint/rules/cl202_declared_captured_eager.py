"""CL202 declared-captured-eager (a declared invariant)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Iterator

from capturelint.findings import Condition, Finding
from capturelint.rules.base import Rule, explanation, op_list, violation_finding

if TYPE_CHECKING:
    from capturelint.analyzer import RegionView


class DeclaredCapturedEager(Rule):
    code = "CL202"
    name = "declared-captured-eager"
    condition = Condition.DECLARED
    summary = "An op that a declared invariant requires to be captured ran in an eager break."
    doc = """
    ## What it does
    Checks every invariant with `require = "captured"` on each captured graph of the
    runners and modes it names: the ops its selector picks out of the region graph must
    all lie in captured segments. Reports, per eager segment and module instance
    (layer), the invariant's id, the eager ops and their scopes, the source line of the
    first and the invariant's explanation. Needs only the capture (`check --static`).

    ## Why is this bad?
    Every op of an eager break re-runs on the host on every replayed step, with its
    kernel launches: an eager MoE or an eager projection costs latency on every token.
    Widening an eager region is the quick fix for a replay hazard, so the hot path can
    slip out of the graph unnoticed; the invariant makes that a reviewed decision.

    ## Example
    ```toml
    [tool.capturelint.invariants.moe-captured]
    require = "captured"
    runners = ["v2"]
    scope = "model.layers.*.ffn*"
    ```
    with a change that wraps the MoE in `@eager_break_during_capture`.

    ## Use instead
    Keep the selected code out of eager breaks: make it capture-safe (fixed shapes,
    buffers updated in place, no host reads) instead of re-running it live.

    ## Limitations
    Graphs captured whole (FULL modes) have no eager segments: the invariant holds
    there trivially. Scope it with `modes` to the modes where it means something.
    """

    def check_region(self, view: RegionView) -> Iterator[Finding]:
        from capturelint.invariants import Requirement, violations

        for inv in view.invariants:
            if inv.requirement is not Requirement.CAPTURED:
                continue
            for v in violations(inv, view.graph, view.selected(inv)):
                f = violation_finding(self, view, v, "")
                message = (
                    f"invariant {inv.id} ({inv.source}) requires these ops to be captured under "
                    f"{view.label.runner} {view.capture.runtime_mode}, but {len(v.ops)} of {f.scope} ran in "
                    f"{f.segment}: {op_list(view, v.ops)}. They re-run live on every replayed step.{explanation(v)} "
                    f"Keep them out of eager breaks, or change the invariant if the region decision changed."
                )
                yield dataclasses.replace(f, message=message)
