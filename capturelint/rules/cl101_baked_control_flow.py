"""CL101 baked-control-flow (R1)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from capturelint.findings import Condition, Finding
from capturelint.rules.base import Rule, cut, where

if TYPE_CHECKING:
    from capturelint.analyzer import StepView


class BakedControlFlow(Rule):
    code = "CL101"
    name = "baked-control-flow"
    condition = Condition.R1
    summary = "A captured segment recorded other ops than the step runs: the capture took another code path."
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
    compared by overload and module scope, not by kernel configuration.
    """

    def check(self, view: StepView) -> Iterator[Finding]:
        cap, sh = view.capture, view.shadow
        if view.structure_differs:
            c_breaks = [s.name for s in cap.segments if s.name]
            s_breaks = [s.name for s in sh.segments if s.name]
            first = next(
                (i for i, (a, b) in enumerate(zip(cap.segments, sh.segments)) if (a.kind, a.name) != (b.kind, b.name)),
                min(len(cap.segments), len(sh.segments)),
            )
            c_seg = cap.segments[first] if first < len(cap.segments) else None
            s_seg = sh.segments[first] if first < len(sh.segments) else None
            c_op = cap.ops[c_seg.first_op] if c_seg and c_seg.first_op < len(cap.ops) else None
            s_op = sh.ops[s_seg.first_op] if s_seg and s_seg.first_op < len(sh.ops) else None
            message = (
                f"the capture of graph {cap.graph} has eager breaks [{cut(c_breaks)}] but replay step {sh.step} "
                f"hits [{cut(s_breaks)}]; they part at segment #{first}. "
                f"{_context_note(view)}Replay runs the capture's segments, so the step's code path never runs. "
                "Make the capture take the path real steps take, or move the branch into an eager break."
            )
            yield self.finding(view, first, c_op, s_op, None, message)
        for al in view.alignments:
            d = al.divergence
            if d is None:
                continue
            if d.capture_op is not None:
                view.tainted.update(op.index for op in al.capture_ops if op.index >= d.capture_op.index)
            recorded = f"recorded {d.capture_op.op} at {where(d.capture_op.frame)}" if d.capture_op else "ended"
            runs = f"runs {d.shadow_op.op} at {where(d.shadow_op.frame)}" if d.shadow_op else "has no more ops"
            message = (
                f"captured segment {view.segment_label(al.index)} {recorded} where replay step {sh.step} {runs}: "
                f"the capture recorded another branch than the step runs "
                f"({d.missing} ops of the step missing from the graph{_names(d.missing_ops)}; "
                f"{d.extra} extra{_names(d.extra_ops)}). "
                f"{_context_note(view)}"
                "Replay re-issues the recorded ops, so the step's ops never run. "
                "Move the branching code into an eager break, or make the capture take the path real steps take."
            )
            yield self.finding(view, al.index, d.capture_op, d.shadow_op, None, message)


def _names(ops: tuple[str, ...]) -> str:
    return f": {cut(list(ops))}" if ops else ""


def _context_note(view: StepView) -> str:
    c, s = view.capture.context, view.shadow.context
    if c.key == s.key:
        return ""
    return (
        f"The forward context differed at capture: {c.describe()}, while at the step {s.describe()}; "
        "code that branches on it took another path at capture. "
    )
