"""CL203 eager-budget-exceeded (a declared invariant)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Iterator

from capturelint.findings import Condition, Finding
from capturelint.rules.base import Rule, explanation, violation_finding, where

if TYPE_CHECKING:
    from capturelint.analyzer import RegionView


class EagerBudgetExceeded(Rule):
    code = "CL203"
    name = "eager-budget-exceeded"
    condition = Condition.DECLARED
    summary = "More ops run in eager breaks per replayed step than a declared invariant allows."
    doc = """
    ## What it does
    Checks every invariant with `max-eager-ops = N` on each captured graph of the
    runners and modes it names: of the ops its selector picks (every op without one),
    at most N may lie in eager breaks, in the whole replayed step or, with
    `per = "model.layers.*"`, per module matching the glob (per layer). Reports the
    invariant's id, the group, the count, and the source line of the first op over the
    budget. Needs only the capture (`check --static`).

    ## Why is this bad?
    Eager ops re-run on the host on every replayed step; their launch overhead is the
    latency a CUDA graph exists to remove. A budget turns "no more than N eager ops per
    layer" into a check on every pull request.

    ## Example
    ```toml
    [tool.capturelint.invariants.eager-budget]
    max-eager-ops = 20
    per = "model.layers.*"
    runners = ["v1"]
    ```
    with `--eager-region wide` under V1, whose attention preparation adds dozens of
    eager ops to every layer.

    ## Use instead
    Narrow the eager region back to what must re-run live, or raise the budget in the
    same pull request as a reviewed decision. `capturelint diff` shows which ops moved.

    ## Limitations
    Counts dispatcher ops, not kernel launches or time: a view counts as much as a
    matmul. `check --baseline` with `--max-eager-growth` gates growth relative to a
    snapshot instead of an absolute budget.
    """

    def check_region(self, view: RegionView) -> Iterator[Finding]:
        from capturelint.invariants import Requirement, violations

        for inv in view.invariants:
            if inv.requirement is not Requirement.BUDGET:
                continue
            for v in violations(inv, view.graph, view.selected(inv)):
                f = violation_finding(self, view, v, "")
                group = f"in {v.group}" if v.group else "in the step"
                message = (
                    f"invariant {inv.id} ({inv.source}) allows at most {inv.max_eager_ops} eager ops per replayed "
                    f"step {group} under {view.label.runner} {view.capture.runtime_mode}, but graph "
                    f"{view.capture.graph} runs {v.count}; the first over the budget is {f.op} at "
                    f"{where(f.capture_frame)}. Each re-runs live on every step.{explanation(v)} Narrow the eager "
                    f"region, or raise the budget as a reviewed decision."
                )
                yield dataclasses.replace(f, message=message)
