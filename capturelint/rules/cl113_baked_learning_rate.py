"""CL113 baked-learning-rate (R2, captured training steps)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from capturelint.findings import Condition, EditLine, Finding, LineRole, Site
from capturelint.rules.base import Rule, where
from capturelint.runtime.protocol import TrainingHazard, TrainingHazardEvent

if TYPE_CHECKING:
    from capturelint.analyzer import HazardView


def hazard_finding(rule: Rule, view: HazardView, e: TrainingHazardEvent, op: str, tensor: str | None,
                   message: str, edit: LineRole | None = None) -> Finding:
    """A finding about a captured training step: at ``first`` (what the capture kept)
    and ``second`` (where it went wrong); ``edit``: ``second`` is the line to change."""
    site = Site.captured(view.label.runner, view.label.mode, e.graph.label, e.graph.mode, 0)
    return Finding.of(rule, site, op=op, scope=None, tensor=tensor, capture_frame=e.first, shadow_frame=e.second,
                      message=message, edit=EditLine(e.second, edit) if edit is not None else None)


class BakedLearningRate(Rule):
    code = "CL113"
    name = "baked-learning-rate"
    condition = Condition.R2
    summary = ("A captured optimizer step took its learning rate as a Python float, and the program changed it "
               "after the capture: every replay steps with the capture's rate.")
    message = (
        "{subject} was {captured} when optimizer.step() at {first} was captured in graph {graph}, and is {now} at "
        "{second}{by}: the step's kernels took the float as a launch argument, so every replay still steps with "
        "{captured}. Make the learning rate a tensor the graph reads (lr=torch.tensor(...) with "
        "capturable=True; schedulers fill_ it in place), or capture again after changing it."
    )
    by_note = " (changed by {scheduler}.step())"
    doc = """
    ## What it does
    Watches the optimizers whose `step()` runs inside a capture (a training step captured
    whole, as PyTorch's documentation shows). Before each replay it compares every
    parameter group's learning rate that is a Python number with its value at capture,
    and reports the first change, with the captured `optimizer.step()` line and the line
    that changed it (the scheduler's `step()`, else the replay).

    ## Why is this bad?
    A CUDA graph freezes launch arguments. The optimizer's kernels take a float learning
    rate as one (`param.add_(grad, alpha=-lr)`, Adam's step size), so the graph keeps the
    capture's rate: a scheduler that sets `param_groups[i]["lr"]` changes nothing the
    replays compute, and the schedule silently never happens.

    ## Example
    ```python
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, capturable=True)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    with torch.cuda.graph(g):
        loss_fn(model(static_x), static_y).backward()
        optimizer.step()
    for x, y in batches:
        static_x.copy_(x); static_y.copy_(y)
        g.replay()
        scheduler.step()                     # the graph still uses 0.01
    ```

    ## Use instead
    `torch.optim.Adam(params, lr=torch.tensor(0.01), capturable=True)`: the graph reads
    the tensor at every replay and schedulers update it in place (`fill_`).

    ## Limitations
    Only optimizers whose `step()` ran inside the capture are watched, and only a
    group's `"lr"` (other float hyper-parameters, betas or weight decay, are not
    compared). A change made by assigning `param_groups[i]["lr"]` directly is located
    at the replay that first ran with it.
    """

    def check_hazard(self, view: HazardView) -> Iterator[Finding]:
        e = view.event
        if not isinstance(e, TrainingHazardEvent) or e.kind is not TrainingHazard.BAKED_LR:
            return
        by = self.by_note.format(scheduler=e.changed_by) if e.changed_by else ""
        message = self.message.format(subject=e.subject, captured=e.captured, now=e.now, first=where(e.first),
                                      second=where(e.second), graph=e.graph.label, by=by)
        yield hazard_finding(self, view, e, "optimizer.step", e.subject, message)
