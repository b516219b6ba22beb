"""CL106 host-sync-in-capture (R5)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from capturelint.findings import Condition, Finding, Frame, Site
from capturelint.rules.base import Rule, where
from capturelint.runtime.protocol import SegmentKind, is_host_sync_op

if TYPE_CHECKING:
    from capturelint.analyzer import RunLabel, RunOutcome
    from capturelint.records import Stream


class HostSyncInCapture(Rule):
    code = "CL106"
    name = "host-sync-in-capture"
    condition = Condition.R5
    summary = "A captured segment reads a value on the host (.item(), .tolist(), nonzero, a boolean mask)."
    message = (
        "host synchronisation {op} inside captured segment {segment} at {at}: a CUDA-graph capture fails here (or "
        "bakes the value). Compute with fixed-shape tensors, or move the code into an eager break."
    )
    doc = """
    ## What it does
    Reports a host synchronisation inside a captured segment: `aten._local_scalar_dense`
    (`.item()`, `int(t)`, `bool(t)`), `.tolist()`, `.numpy()`, ops with data-dependent
    output shapes (`nonzero`, `masked_select`, boolean-mask indexing, `unique`) and
    device-to-host copies. With the emulated backend the capture itself fails on them,
    as a GPU capture does; the finding carries the op and the source line.

    ## Why is this bad?
    A CUDA graph cannot wait for the host: the capture fails (`operation not permitted
    when stream is capturing`), or, where the value was read before capture began, the
    value is baked (PyTorch #78549, onnxruntime #15002).

    ## Example
    ```python
    n = int(seq_lens.max())          # host sync inside the captured forward
    ```

    ## Use instead
    Compute with tensors of a fixed shape (masks instead of boolean indexing, a static
    upper bound instead of `max().item()`), or move the code into an eager break.

    ## Limitations
    The capture stops at the first host sync, so only the first one of a graph is
    reported per run; fix it and run again.
    """

    def check_capture(self, label: RunLabel, capture: Stream) -> Iterator[Finding]:
        for seg in capture.segments:
            if seg.kind is not SegmentKind.CAPTURED:
                continue
            for op in capture.ops[seg.first_op : seg.end_op]:
                if is_host_sync_op(op.op):
                    yield self.make(label, capture.graph, capture.runtime_mode, f"{capture.graph} {seg.label}", seg.index, op.op, op.scope, op.frame,
                                    op.stack)

    def check_run(self, outcome: RunOutcome) -> Iterator[Finding]:
        e = outcome.host_sync
        if e is None:
            return
        graph = e.graph.label if e.graph else "graph"
        mode = e.graph.mode if e.graph else ""
        yield self.make(outcome.label, graph, mode, f"{graph} #{e.segment} captured", e.segment, e.op, "", e.frame, e.stack)

    def make(self, label: RunLabel, graph: str, runtime_mode: str, segment: str, index: int, op: str, scope: str, frame: Frame | None,
             stack: tuple[Frame, ...] = ()) -> Finding:
        message = self.message.format(op=op, segment=segment, at=where(frame))
        site = Site(label.runner, label.mode, graph, runtime_mode, segment, index)
        return Finding.of(self, site, op=op, scope=scope, tensor=None, capture_frame=frame, shadow_frame=None,
                          message=message, capture_stack=stack)
