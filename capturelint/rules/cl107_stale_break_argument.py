"""CL107 stale-break-argument (R6)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from capturelint.findings import Condition, Finding
from capturelint.rules.base import Rule, where
from capturelint.runtime.protocol import SegmentKind

if TYPE_CHECKING:
    from capturelint.analyzer import StepView


class StaleBreakArgument(Rule):
    code = "CL107"
    name = "stale-break-argument"
    condition = Condition.R6
    summary = "An eager break is replayed with a capture-time argument that differs from the step's."
    message = (
        "eager break {name} (segment {segment}, called at {at}) is replayed with its capture-time {path}, but replay "
        "step {step} passes {passed}: the break re-runs on the frozen argument. Read per-step data inside the break "
        "(forward context or a persistent buffer) instead of passing it in."
    )
    kind_passed = "a different kind of value"  # {passed}: a tensor for a scalar, or the reverse
    value_passed = "{passed} (captured {captured})"
    geometry_passed = "{name} as {passed} (captured {captured})"
    location_passed = "{name}, while the capture passed {captured}: {reason}"
    doc = """
    ## What it does
    Compares the arguments the capture handed to each eager break with the arguments the
    step hands to it: non-tensor values must be equal, tensors must have the same view
    geometry and resolve to the same location (the R2-R4 conditions, applied to breaks).

    ## Why is this bad?
    A breakable graph replays an eager break by calling it with the arguments it got at
    capture. The break's Python re-runs, but on the capture step's tensors and numbers:
    a per-step tensor passed in (fresh metadata, a re-allocated buffer, a Python int)
    is frozen, although the break itself is eager.

    ## Example
    ```python
    lens = torch.tensor(seq_lens)          # new tensor every step
    self.attn_break(q, lens)               # replay passes the capture's `lens`
    ```

    ## Use instead
    Read per-step data inside the break (from the forward context or a persistent
    buffer), and pass only tensors that live in persistent or graph memory.

    ## Limitations
    Arguments are compared inside tuples, lists, dicts, NamedTuples, dataclasses and
    objects with attributes (four levels deep) and named by path (`meta.slot_mapping`);
    modules and callables passed to a break are not compared.
    """

    def check(self, view: StepView) -> Iterator[Finding]:
        cap, sh = view.capture, view.shadow
        for cs, ss in zip(cap.segments, sh.segments):
            if cs.kind is not SegmentKind.EAGER or (cs.kind, cs.name) != (ss.kind, ss.name):
                continue
            for ca, sa in zip(cs.break_args, ss.break_args):
                problem = self._problem(view, ca, sa)
                if problem is None:
                    continue
                tensor, detail = problem
                message = self.message.format(
                    name=cs.name, segment=view.segment_label(cs.index), at=where(cs.break_frame), path=ca.path,
                    step=sh.step, passed=detail,
                )
                f = self.finding(view, cs.index, None, None, tensor, message)
                yield _at(f, cs, ss)

    def _problem(self, view: StepView, ca, sa) -> tuple[str, str] | None:
        """The argument's name and what the step passes (``{passed}``), or None."""
        if (ca.tensor is None) != (sa.tensor is None):
            return ca.path, self.kind_passed
        if ca.tensor is None:
            if ca.scalar != sa.scalar:
                return f"argument {ca.path}", self.value_passed.format(passed=sa.scalar, captured=ca.scalar)
            return None
        from capturelint.analyzer import location_problem

        cu, su = ca.tensor, sa.tensor
        if cu.geometry != su.geometry:
            name = _name(view, su, sa.path)
            return name, self.geometry_passed.format(name=name, passed=su.describe_geometry(),
                                                     captured=cu.describe_geometry())
        problem = location_problem(view, cu, su, "")
        if problem is not None:
            name = _name(view, su, sa.path)
            return name, self.location_passed.format(name=name, captured=_name(view, cu, ca.path, view.capture),
                                                     reason=problem.reason)
        return None


def _name(view: StepView, use, path: str, stream=None) -> str:
    """A break argument is named by the engine's name for its storage, else by its path
    in the call (``meta.slot_mapping``: a field of a dataclass passed as ``meta``)."""
    stream = stream if stream is not None else view.shadow
    named = stream.name_of(use.storage)
    return named if named is not None else f"argument {path}"


def _at(f: Finding, cs, ss) -> Finding:
    import dataclasses

    return dataclasses.replace(f, op=f"break {cs.name}", capture_frame=cs.break_frame,
                               capture_stack=cs.break_stack, shadow_frame=ss.break_frame, scope=cs.scope or "<top>")
