"""CL203 eager-budget-exceeded (a declared invariant)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from capturelint.findings import Condition, Finding
from capturelint.invariants import Requirement
from capturelint.rules.base import where
from capturelint.rules.declared import DeclaredInvariantRule

if TYPE_CHECKING:
    from capturelint.analyzer import RegionView
    from capturelint.invariants import Invariant, Violation


class EagerBudgetExceeded(DeclaredInvariantRule):
    code = "CL203"
    name = "eager-budget-exceeded"
    condition = Condition.DECLARED
    summary = "More ops run in eager breaks per replayed step than a declared invariant allows."
    requirement = Requirement.BUDGET
    message = (
        "invariant {id} ({source}) allows at most {budget} eager ops per replayed step {group} under {runner} "
        "{runtime_mode}, but graph {graph} runs {eager}; the first over the budget is {op} at {at}. Each eager op "
        "re-runs live on every step.{why} Narrow the eager region, or raise the budget as a reviewed decision."
    )
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

    def fields(self, view: RegionView, inv: Invariant, v: Violation, f: Finding) -> dict[str, Any]:
        return super().fields(view, inv, v, f) | dict(
            budget=inv.max_eager_ops, group=f"in {v.group}" if v.group else "in the step", eager=v.count, op=f.op,
            at=where(f.capture_frame),
        )
