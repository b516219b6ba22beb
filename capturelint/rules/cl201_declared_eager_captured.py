"""CL201 declared-eager-captured (a declared invariant)."""

from __future__ import annotations

from capturelint.findings import Condition
from capturelint.invariants import Requirement
from capturelint.rules.declared import DeclaredInvariantRule


class DeclaredEagerCaptured(DeclaredInvariantRule):
    code = "CL201"
    name = "declared-eager-captured"
    condition = Condition.DECLARED
    summary = "An op that a declared invariant requires to run in an eager break was captured."
    requirement = Requirement.EAGER
    message = (
        "invariant {id} ({source}) requires these ops to run in an eager break under {runner} {runtime_mode}, but "
        "{count} of {scope} ran in {segment}: {ops}. A captured op replays what it did at capture instead of "
        "re-running every step.{why} Move these ops into an eager break (a wider eager region), or change the invariant "
        "if the region decision changed."
    )
    doc = """
    ## What it does
    Checks every invariant with `require = "eager"` (`[tool.capturelint.invariants]`,
    the adapter's defaults, `--invariants FILE`) on each captured graph of the runners
    and modes it names: the ops its selector picks out of the region graph (module
    scope, op name, source function, storages written or read) must all lie in eager
    breaks. Reports, per segment and module instance (layer), the invariant's id, the
    captured ops and their scopes, the source line of the first and the invariant's own
    explanation. Needs only the capture: `capturelint check --static` runs it.

    ## Why is this bad?
    An invariant records a region decision the team made, usually because the full
    check once failed without it: under Model Runner V1 the PIECEWISE capture runs
    without attention metadata, so attention input preparation captured there replays
    its profile-run branch on every step (vLLM #51430). A refactor that moves such code
    back into the captured region breaks the decision silently until a replay diverges.

    ## Example
    ```toml
    [tool.capturelint.invariants.attn-prep-eager]
    require = "eager"
    runners = ["v1"]
    modes = ["PIECEWISE"]
    scope = "model.layers.*.attn.wq_b"
    ```
    with `--eager-region narrow`: the q projection of every layer is captured.

    ## Use instead
    Move the selected code into an eager break (`@eager_break_during_capture`, a wider
    eager region), or, if the decision changed, change the invariant in the same pull
    request. `capturelint invariants --explain ID` shows what a selector selects.

    ## Limitations
    Ops are attributed to the innermost source function that issued them: ops of a
    helper shared by two paths (a RoPE helper) carry the helper's name, so select them
    by the caller's module scope. Code that issues no torch op is invisible. Only the
    ops a capture ran are checked: a branch the capture did not take selects nothing.
    """
