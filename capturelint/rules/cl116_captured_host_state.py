"""CL116 captured-host-state (R7, bare graphs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from capturelint.findings import Condition, Finding, LineRole
from capturelint.rules.base import Rule, where
from capturelint.rules.cl113_baked_learning_rate import hazard_finding
from capturelint.runtime.protocol import TrainingHazard, TrainingHazardEvent

if TYPE_CHECKING:
    from capturelint.analyzer import HazardView


class CapturedHostState(Rule):
    code = "CL116"
    name = "captured-host-state"
    condition = Condition.R7
    summary = ("Captured code stored a tensor on a Python attribute or container, and the program re-bound or "
               "removed it after the capture: captured Python runs once, so no replay stores it again.")
    message = (
        "{holder}{more} was filled at {first} by the code captured in graph {graph} with a tensor of the graph's "
        "memory, and was {how} at {second} ({replay}): captured Python runs once, at capture, so no replay stores "
        "a new tensor there; every replay writes the capture's tensor, and code that reads {holder} gets what "
        "the program put there instead of the step's value. Keep the captured tensor and copy into it in place "
        "(.copy_(), .zero_()), or read the step's value from the graph's output."
    )
    more_note = " (and {others} more slot{s} the capture filled)"
    doc = """
    ## What it does
    For a graph used directly (`torch.cuda.CUDAGraph`, `torch.cuda.graph`), finds at
    capture end the Python slots (instance attributes, module buffers, list and dict
    slots, globals) that hold a tensor of the graph's memory and that the captured code
    filled itself: the line filling the slot (`self.hidden = h`, `cache.append(k)`) is
    in a function that made the tensor during the capture and had returned when the
    capture ended. Before each replay it looks at them again, and reports the first
    one that the program re-bound (`model.hidden = torch.zeros(...)`) or took out of its
    container (`cache.clear()`), with the line that filled it inside the capture and the
    line that re-bound it (else the replay).

    ## Why is this bad?
    A replay runs the captured kernels, not the Python that launched them: the
    attribute assignment or `append` of a captured forward ran once, at capture, and
    the slot holds that capture's tensor, which every replay rewrites. A program that
    treats the slot as per-step state (resets a recurrent state between sequences,
    empties a cache and expects the forward to refill it) reads its own value where it
    expects the step's, or an empty container, and the graph keeps writing a tensor
    nobody reads (PyTorch issue #114844).

    ## Example
    ```python
    class Net(torch.nn.Module):
        def forward(self, x):
            h = torch.tanh(self.lin(x))
            self.hidden = h                      # runs once, at capture
            return self.out(h)

    with torch.cuda.graph(g):
        static_y = net(static_x)
    for x in batches:
        net.hidden = torch.zeros(4, 8)           # reset per step: the graph never sees it
        static_x.copy_(x); g.replay()
        log(net.hidden)                          # zeros, not the step's hidden state
    ```

    ## Use instead
    Keep the tensor the capture stored and change it in place (`net.hidden.zero_()`),
    or read the step's values from the graph's outputs after each replay (and
    `.clone()` what must outlive the next replay).

    ## Limitations
    A slot that the captured code filled and that the program only reads after replays
    is not reported: each read sees the latest replay's values, as eager execution
    would (CL109 reports a reference kept across replays). A slot is found only where
    its filling line is an assignment to its name or a container call (`append`,
    `extend`, `insert`, `add`, `update`, `setdefault`, `x[k] = v`) in a function that made
    the tensor; slots are found as CL108 finds holders (from the running frames, the
    program's own objects); graphs of a breakable runtime are not watched; one finding
    per graph.
    """

    def check_hazard(self, view: HazardView) -> Iterator[Finding]:
        e = view.event
        if not isinstance(e, TrainingHazardEvent) or e.kind is not TrainingHazard.HOST_STATE:
            return
        more = self.more_note.format(others=e.count - 1, s="s" * (e.count > 2)) if e.count > 1 else ""
        message = self.message.format(holder=e.subject, more=more, first=where(e.first), graph=e.graph.label,
                                      how=e.now, second=where(e.second), replay=f"before {e.captured}")
        rebinding = LineRole.REBINDING if e.changed_by else None  # the re-binding line, when found
        yield hazard_finding(self, view, e, "capture", e.subject, message, rebinding)
