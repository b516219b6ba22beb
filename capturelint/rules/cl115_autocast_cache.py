"""CL115 autocast-cache (R4, captures under autocast)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from capturelint.findings import Condition, Finding
from capturelint.rules.base import Rule, where
from capturelint.rules.cl113_baked_learning_rate import hazard_finding
from capturelint.runtime.protocol import TrainingHazard, TrainingHazardEvent

if TYPE_CHECKING:
    from capturelint.analyzer import HazardView


class AutocastCache(Rule):
    code = "CL115"
    name = "autocast-cache"
    condition = Condition.R4
    summary = "A capture runs under torch.autocast with its weight cache on: cache_enabled must be False."
    message = (
        "torch.autocast entered at {first} has its cast cache on (cache_enabled=True, the default) around the capture "
        "of graph {graph} at {second}: the lower-precision copies of the weights are cached per autocast region, so "
        "the graph reads copies made once (or freed when the region exits) that the optimizer's updates never reach. "
        "Use torch.autocast(..., cache_enabled=False) for captures, as PyTorch requires."
    )
    doc = """
    ## What it does
    Follows `torch.autocast` regions (and `torch.cuda.amp.autocast`) during the run and
    reports a capture that begins inside a region with its cast cache on, or a region
    with its cache on entered during a capture: once per graph, with the `autocast` line
    and the capture's.

    ## Why is this bad?
    Autocast caches the lower-precision copy of each weight (a leaf tensor that
    requires grad) for the rest of its region. In a capture the copy is made once, in
    graph memory, or taken from the cache filled before the capture and freed when the
    region exits; either way the replays read a copy the optimizer's updates never
    reach, or memory that is no longer theirs. PyTorch's CUDA-graph documentation and
    `make_graphed_callables` require `cache_enabled=False`.

    ## Example
    ```python
    with torch.cuda.graph(g):
        with torch.autocast("cuda"):          # cache_enabled defaults to True
            loss = loss_fn(model(static_x), static_y)
    ```

    ## Use instead
    `with torch.autocast("cuda", cache_enabled=False):` around or inside the capture.

    ## Limitations
    A region with its cache on that no capture overlaps is not reported, nor is one
    entered through `torch.set_autocast_enabled` directly.
    """

    def check_hazard(self, view: HazardView) -> Iterator[Finding]:
        e = view.event
        if not isinstance(e, TrainingHazardEvent) or e.kind is not TrainingHazard.AUTOCAST_CACHE:
            return
        message = self.message.format(first=where(e.first), graph=e.graph.label, second=where(e.second))
        yield hazard_finding(self, view, e, "torch.autocast", None, message)
