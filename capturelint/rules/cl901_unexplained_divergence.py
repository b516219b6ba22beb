"""CL901 unexplained-divergence (the numerical oracle; a coverage gap of capturelint)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from capturelint.findings import DIVERGENCE_TOLERANCE, Condition, EditLine, Finding, LineRole, Site
from capturelint.rules.base import Rule

if TYPE_CHECKING:
    from capturelint.analyzer import EnteredAt, RunLabel, RunOutcome

STEP_TOLERANCE = DIVERGENCE_TOLERANCE


class UnexplainedDivergence(Rule):
    code = "CL901"
    name = "unexplained-divergence"
    condition = Condition.NUMERICAL
    summary = "Replay output differs from eager output, and no structural rule explains why."
    message = (
        "replay diverges from eager execution (max per-step error {max_step_error:.3g}{tokens}) but no structural "
        "rule found a cause: a coverage gap of capturelint. Bisect the eager region with `capturelint diff` and "
        "report the case."
    )
    entered_message = (
        "replay diverges from eager execution (max per-step error {max_step_error:.3g}{tokens}) and no structural "
        "rule found a cause: replay computes what its shadow computes, but the eager break {name} computes other "
        "values than the eager twin's from the same inputs (first at step {step}, {rows}). {why} Make the break "
        "compute the real rows alike whatever the batch is padded to, or report the case if it does."
    )
    padded_why = (
        "The graph run pads the batch to its capture size and its shadow is padded alike, while the twin runs it "
        "unpadded: code in the break that depends on the padding (a branch on the real token count against the "
        "rows it is handed) takes another path in the graph run."
    )
    unpadded_why = "The divergence enters in that break, not at a replay."
    tokens_note = ", token agreement {agreement:.2f}"
    twin_note = ", eager-twin error {error:.3g}"
    doc = """
    ## What it does
    Compares each replay's output with its shadow's (max abs difference) and the
    captured run's tokens with an eager twin's. When they diverge and no structural
    rule (CL1xx) reported anything for the configuration, it reports the gap. Under
    `--engine vllm` the finding is located at the eager break where the divergence
    from the twin enters, where one does: the first break that, handed what the
    twin's call was handed, computed something else (a break that branches on a
    padded batch's real token count against the rows it is handed: the shadow is
    padded too, so replay equals it and no condition of the replay model fails).

    ## Why is this bad?
    The outputs are wrong and capturelint cannot say why: a hazard outside its model
    (a stream race, a buffer refreshed in place with wrong values, a kernel that is
    not deterministic). It is reported as capturelint's own coverage gap, never
    swallowed: a structural finding without divergence is still a finding, and a
    divergence without a structural finding is this one.

    ## Example
    A runner that refreshes its slot-mapping buffer in place but with an off-by-one:
    every storage and shape matches, the values do not.

    ## Use instead
    Bisect the region (`capturelint diff`), compare the replay and eager outputs per
    layer, and report the case to capturelint with the trace.

    ## Limitations
    Replay-versus-shadow differences below 1e-4 are float noise. Token agreement is
    measured over the sampled workload only. Findings of declared invariants (CL2xx)
    do not count as an explanation: they say what was decided, not why replay differs.
    """

    def check_run(self, outcome: RunOutcome) -> Iterator[Finding]:
        if outcome.host_sync is not None:
            return  # the capture failed: nothing was replayed
        agreement, twin = outcome.token_agreement, outcome.twin_error
        diverged = (
            (agreement is not None and agreement < 1.0)
            or (agreement is None and twin is not None and twin > STEP_TOLERANCE)
            or outcome.max_step_error > STEP_TOLERANCE
        )
        # a declared invariant's finding (CL2xx) records a decision, not why replay differs
        explained = any(f.code != self.code and f.condition is not Condition.DECLARED for f in outcome.findings)
        if diverged and not explained:
            yield self.make(outcome.label, agreement, outcome.max_step_error, twin, outcome.entered)

    def make(self, label: RunLabel, token_agreement: float | None, max_step_error: float,
             twin_error: float | None = None, entered: EnteredAt | None = None) -> Finding:
        """The finding; located at the break where the divergence enters when an adapter
        found it (``RunOutcome.entered``), else at no source line."""
        tokens = "" if token_agreement is None else self.tokens_note.format(agreement=token_agreement)
        if twin_error is not None:
            tokens += self.twin_note.format(error=twin_error)
        if entered is None:
            message = self.message.format(max_step_error=max_step_error, tokens=tokens)
            return Finding.of(self, Site(label.runner, label.mode), op="", scope=None, tensor=None, capture_frame=None,
                              shadow_frame=None, message=message)
        padded = entered.rows > entered.real
        rows = (f"{entered.real} real rows padded to {entered.rows}" if padded else f"{entered.real} rows")
        message = self.entered_message.format(max_step_error=max_step_error, tokens=tokens, name=entered.name,
                                              step=entered.step, rows=rows,
                                              why=self.padded_why if padded else self.unpadded_why)
        return Finding.of(self, Site(label.runner, label.mode), op=f"break {entered.name}", scope=None, tensor=None,
                          capture_frame=None, shadow_frame=None, message=message,
                          edit=EditLine(entered.frame, LineRole.BREAK))
