"""CL202 declared-captured-eager (a declared invariant)."""

from __future__ import annotations

from capturelint.findings import Condition
from capturelint.invariants import Requirement
from capturelint.rules.declared import DeclaredInvariantRule


class DeclaredCapturedEager(DeclaredInvariantRule):
    code = "CL202"
    name = "declared-captured-eager"
    condition = Condition.DECLARED
    summary = "An op that a declared invariant requires to be captured ran in an eager break."
    requirement = Requirement.CAPTURED
    message = (
        "invariant {id} ({source}) requires these ops to be captured under {runner} {runtime_mode}, but {count} of "
        "{scope} ran in {segment}: {ops}. Ops in eager breaks re-run live on every replayed step.{why} Keep these ops "
        "out of eager breaks, or change the invariant if the region decision changed."
    )
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
