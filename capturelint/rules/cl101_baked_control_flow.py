"""CL101 baked-control-flow (R1)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Iterator

from capturelint.findings import Condition, EditLine, Finding, LineRole
from capturelint.rules.base import Rule, cut, where
from capturelint.sources import branch_line

if TYPE_CHECKING:
    from capturelint.analyzer import StepView
    from capturelint.records import OpRecord


class BakedControlFlow(Rule):
    code = "CL101"
    name = "baked-control-flow"
    condition = Condition.R1
    summary = "A captured segment recorded other ops than the step runs: the capture took another code path."
    message = (
        "captured segment {segment} {recorded} where replay step {step} {runs}: the capture recorded another branch "
        "than the step runs ({missing} ops of the step missing from the graph{missing_ops}; {extra} "
        "extra{extra_ops}). {context}Replay re-issues the recorded ops, so the step's ops never run. Move the "
        "branching code into an eager break, or make the capture take the path real steps take."
    )
    recorded = "recorded {op} at {at}"  # {recorded}, or "ended"
    runs = "runs {op} at {at}"  # {runs}, or "has no more ops"
    structure_message = (
        "the capture of graph {graph} has eager breaks [{capture_breaks}] but replay step {step} hits "
        "[{step_breaks}]; they part at segment #{segment}. {context}Replay runs the capture's segments, so the "
        "step's code path never runs. Make the capture take the path real steps take, or move the branch into an "
        "eager break."
    )
    context_note = (  # {context} of both, when the forward context differed at capture
        "The forward context differed at capture: {capture}, while at the step {step}; code that branches on it "
        "took another path at capture. "
    )
    doc = """
    ## What it does
    Aligns the ops each captured segment recorded with the ops an eager execution of the
    same step runs over the same span (the *shadow*), and reports the first point where
    they part ways, with both sides' op and source line and how many ops are missing or
    extra. It also reports a capture whose eager breaks are not the ones the step hits.

    ## Why is this bad?
    A replay re-issues the recorded ops and runs no Python. If the capture took a branch
    that real steps do not take (because the forward context was empty during the
    capture run, because a host value chose a kernel, because a cache was `None`),
    every replay runs the capture's branch: kernels the step needs never run. In vLLM,
    DeepSeek V4's narrow eager region left the KV insert inside the graph; Model Runner
    V1 captured without attention metadata, so replay never wrote the KV cache and
    GSM8K fell from 0.94 to 0.04 (vLLM #51430/#51750).

    ## Example
    ```python
    def _prepare_and_attn(self, q, kv, positions, o):
        md = get_forward_context().attn_metadata
        if not isinstance(md, dict):      # profile / dummy run
            q = F.pad(q, pad)             # recorded at capture...
        else:
            fused_qnorm_rope_kv_insert(q, kv, positions, md.slot_mapping, ...)  # ...never replayed
        self._sparse_indexer_and_attn(q, kv, positions, o)
    ```

    ## Use instead
    Put the branching code inside an eager break (`@eager_break_during_capture`), so it
    re-runs live on replay, or make the capture run take the branch real steps take
    (build real attention metadata for the capture, as Model Runner V2 does).

    ## Limitations
    Compares the sampled steps only: a branch that real steps take rarely (a long
    context, a rare batch shape) is caught when the workload reaches it. Ops are
    compared by overload and module scope, not by kernel configuration. The finding is
    located at the branch condition where the two sides parted: in the innermost
    function both sides run, the first `if`, `elif`, `while`, `for`, conditional
    expression or `match` whose arms hold one side's op line and not the other's. Where
    the step's op runs in a function the capture never entered, or no branch statement
    separates the two lines (an early `return` in a callee), it is located at the
    captured op.
    """

    def check(self, view: StepView) -> Iterator[Finding]:
        cap, sh = view.capture, view.shadow
        if view.structure_differs:
            first = next(
                (i for i, (a, b) in enumerate(zip(cap.segments, sh.segments)) if (a.kind, a.name) != (b.kind, b.name)),
                min(len(cap.segments), len(sh.segments)),
            )
            c_seg = cap.segments[first] if first < len(cap.segments) else None
            s_seg = sh.segments[first] if first < len(sh.segments) else None
            c_op = cap.ops[c_seg.first_op] if c_seg and c_seg.first_op < len(cap.ops) else None
            s_op = sh.ops[s_seg.first_op] if s_seg and s_seg.first_op < len(sh.ops) else None
            message = self.structure_message.format(
                graph=cap.graph, step=sh.step, segment=first, context=self._context_note(view),
                capture_breaks=cut([s.name for s in cap.segments if s.name]),
                step_breaks=cut([s.name for s in sh.segments if s.name]),
            )
            yield _at_branch(self.finding(view, first, c_op, s_op, None, message), c_op, s_op)
        for al in view.alignments:
            d = al.divergence
            if d is None:
                continue
            c, s = d.capture_op, d.shadow_op
            message = self.message.format(
                segment=view.segment_label(al.index), step=sh.step,
                recorded=self.recorded.format(op=c.op, at=where(c.frame)) if c else "ended",
                runs=self.runs.format(op=s.op, at=where(s.frame)) if s else "has no more ops",
                missing=d.missing, missing_ops=_names(d.missing_ops), extra=d.extra, extra_ops=_names(d.extra_ops),
                context=self._context_note(view),
            )
            yield _at_branch(self.finding(view, al.index, c, s, None, message), c, s)

    def _context_note(self, view: StepView) -> str:
        c, s = view.capture.context, view.shadow.context
        return "" if c.key == s.key else self.context_note.format(capture=c.describe(), step=s.describe())


def _at_branch(f: Finding, capture_op: OpRecord | None, shadow_op: OpRecord | None) -> Finding:
    """``f`` located at the branch condition where the two sides parted
    (``capturelint.sources.branch_line``), where one is found."""
    if capture_op is None or shadow_op is None:
        return f
    branch = branch_line(capture_op.stack or (capture_op.frame,), shadow_op.frame)
    return f if branch is None else dataclasses.replace(f, edit=EditLine(branch, LineRole.BRANCH))


def _names(ops: tuple[str, ...]) -> str:
    return f": {cut(list(ops))}" if ops else ""
