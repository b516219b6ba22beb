"""CL114 grad-rebound (R7, captured training steps)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from capturelint.findings import Condition, Finding, LineRole
from capturelint.rules.base import Rule, where
from capturelint.rules.cl113_baked_learning_rate import hazard_finding
from capturelint.runtime.protocol import TrainingHazard, TrainingHazardEvent

if TYPE_CHECKING:
    from capturelint.analyzer import HazardView


class GradRebound(Rule):
    code = "CL114"
    name = "grad-rebound"
    condition = Condition.R7
    summary = ("A parameter's .grad was re-bound after its capture allocated it (zero_grad(set_to_none=True)): "
               "replays write gradients nobody reads.")
    message = (
        "{tensor}.grad{more} was allocated by the backward() captured in graph {graph} (begun at {first}), and is "
        "{now} at {second}: zero_grad(set_to_none=True) (zero_grad()'s default) re-binds .grad, but every replay "
        "still writes the gradients into the capture's tensors, so code that reads .grad (clipping, logging, "
        "accumulation) sees {now}. Do not zero the gradients between replays (the captured backward refills them "
        "in place), or use zero_grad(set_to_none=False)."
    )
    more_note = " (and those of {others} more parameter{s})"
    doc = """
    ## What it does
    At the end of a capture that ran an optimizer's `step()`, notes each of its
    parameters whose `.grad` tensor the capture allocated (the captured `backward()`,
    after `zero_grad(set_to_none=True)` before the capture, as PyTorch's documentation
    shows). Before each replay it checks that every such `.grad` is still that tensor,
    and reports the first re-binding once per graph, with the line that did it
    (`zero_grad(...)`, else the replay).

    ## Why is this bad?
    The graph keeps pointers to the `.grad` tensors its capture allocated and refills
    them at every replay. `optimizer.zero_grad()` after the capture sets `.grad` to
    `None` (`set_to_none=True` is the default): the replays keep writing and stepping
    with the old tensors, and everything outside the graph that reads `.grad` (gradient
    clipping, logging, accumulation across micro-batches) sees `None` or a tensor no
    replay writes.

    ## Example
    ```python
    for x, y in batches:
        optimizer.zero_grad()                # re-binds .grad to None
        static_x.copy_(x); static_y.copy_(y)
        g.replay()
        clip_grad_norm_(model.parameters(), 1.0)   # sees no gradients
    ```

    ## Use instead
    Leave `.grad` alone between replays: the captured backward overwrites it in place.
    If it must be zeroed, `zero_grad(set_to_none=False)` keeps the tensors.

    ## Limitations
    Only the parameters of optimizers stepped inside the capture are watched; a capture
    of `backward()` alone, with the optimizer outside it, is not.
    """

    def check_hazard(self, view: HazardView) -> Iterator[Finding]:
        e = view.event
        if not isinstance(e, TrainingHazardEvent) or e.kind is not TrainingHazard.GRAD_REBOUND:
            return
        capture = view.captures.get(e.graph.id)
        name = (capture.name_of(e.storage) if capture is not None and e.storage is not None else None) or "a parameter"
        more = self.more_note.format(others=e.count - 1, s="s" * (e.count > 2)) if e.count > 1 else ""
        message = self.message.format(tensor=name, more=more, graph=e.graph.label, first=where(e.first),
                                      now=e.now, second=where(e.second))
        rebinding = LineRole.REBINDING if e.changed_by else None  # the zero_grad line, when known
        yield hazard_finding(self, view, e, "backward", f"{name}.grad", message, rebinding)
