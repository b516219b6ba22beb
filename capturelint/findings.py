"""What the checker reports: findings, their source frames, and per-configuration
numerical results. Every output format (Rich, JSON, SARIF, GitHub annotations) renders
these records and nothing else."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from capturelint.runtime.protocol import Frame


class Condition(enum.Enum):
    """The replay-equivalence conditions of docs/replay-model.md."""

    R1 = "R1"
    R2 = "R2"
    R3 = "R3"
    R4 = "R4"
    R5 = "R5"
    R6 = "R6"
    R7 = "R7"  # graph memory, read outside the graph, holds the value meant (bare graphs)
    NUMERICAL = "numerical"
    DECLARED = "declared"  # a declared region invariant (capturelint.invariants), not a replay condition

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class Finding:
    """One violated condition, located.

    ``segment`` is ``"<graph> #<index> <kind>[ <break name>]"`` e.g.
    ``"decode/4 #2 captured"``; ``graph`` is the batch descriptor of the captured graph
    and ``runtime_mode`` the mode it was captured in. ``tensor`` is the human name of
    the tensor concerned (parameter, runner buffer, metadata field, cache or producing
    op), or ``None`` when the finding concerns an op. ``steps`` are the replay steps
    where it was seen (first few), ``occurrences`` how many times in all.
    ``capture_stack`` is the engine frames on the stack of the captured op (or of the
    break's call) at capture, innermost first, up to the captured callable: the
    functions ``capturelint suggest`` tries as eager breaks. It is not part of the JSON.
    """

    code: str
    name: str
    condition: Condition
    runner: str
    mode: str
    graph: str
    runtime_mode: str
    segment: str
    segment_index: int
    op: str
    scope: str
    tensor: str | None
    capture_frame: Frame | None
    shadow_frame: Frame | None
    message: str
    steps: tuple[int, ...] = ()
    occurrences: int = 1
    allocation_frame: Frame | None = None  # where the step's replacement tensor was allocated (CL104)
    capture_stack: tuple[Frame, ...] = dataclasses.field(default=(), compare=False, repr=False)
    invariant: str | None = None  # the id of the declared invariant violated (CL2xx)

    def sort_key(self) -> tuple:
        frame = self.capture_frame or self.shadow_frame or Frame("", 0, "")
        return (self.runner, self.mode, frame.file, frame.line, self.code, self.graph, self.segment_index, self.scope, self.op,
                self.tensor or "", self.invariant or "")

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "name": self.name,
            "condition": str(self.condition),
            "runner": self.runner,
            "mode": self.mode,
            "graph": self.graph,
            "runtime_mode": self.runtime_mode,
            "segment": self.segment,
            "segment_index": self.segment_index,
            "op": self.op,
            "scope": self.scope,
            "tensor": self.tensor,
            "capture_frame": self.capture_frame.to_json() if self.capture_frame else None,
            "shadow_frame": self.shadow_frame.to_json() if self.shadow_frame else None,
            "allocation_frame": self.allocation_frame.to_json() if self.allocation_frame else None,
            "message": self.message,
            "steps": list(self.steps),
            "occurrences": self.occurrences,
            **({"invariant": self.invariant} if self.invariant is not None else {}),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Finding:
        """The finding ``to_json`` wrote (``Finding.from_json(d).to_json() == d``); the
        engine stack at capture (``capture_stack``) is not in the JSON and stays empty."""
        return cls(
            code=doc["code"], name=doc["name"], condition=Condition(doc["condition"]), runner=doc["runner"],
            mode=doc["mode"], graph=doc["graph"], runtime_mode=doc["runtime_mode"], segment=doc["segment"],
            segment_index=doc["segment_index"], op=doc["op"], scope=doc["scope"], tensor=doc["tensor"],
            capture_frame=_frame(doc["capture_frame"]), shadow_frame=_frame(doc["shadow_frame"]),
            message=doc["message"], steps=tuple(doc["steps"]), occurrences=doc["occurrences"],
            allocation_frame=_frame(doc["allocation_frame"]), invariant=doc.get("invariant"),
        )


def _frame(doc: dict[str, Any] | None) -> Frame | None:
    """A ``Frame`` from its JSON (file, line, function), or ``None``."""
    return None if doc is None else Frame(doc["file"], doc["line"], doc["function"])


@dataclasses.dataclass(frozen=True)
class RuleInfo:
    """What an output format needs to know of a rule: its stable code, its kebab-case
    name, the condition it checks, a one-sentence summary and the full Markdown doc
    (sections: what it does, why it is bad, example, use instead, limitations)."""

    code: str
    name: str
    condition: Condition
    summary: str
    doc: str


DIVERGENCE_TOLERANCE = 1e-4
"""Replay-versus-eager differences at or below this are float noise."""


@dataclasses.dataclass(frozen=True)
class Numerical:
    """The numerical oracle for one runner and mode: token agreement of the captured
    run with its eager twin, and the largest per-step difference between a replay's
    output and its shadow's. A user's target (``check --target``) has no token
    agreement (``None``); ``max_logit_error`` is then the largest difference between
    its output and its ``eager()`` twin's, or ``None`` without one."""

    runner: str
    mode: str
    token_agreement: float | None  # None: the target has no eager twin
    max_step_error: float
    max_logit_error: float | None
    replay_steps: int

    @property
    def diverged(self) -> bool:
        """Whether replay computed something else than eager execution: tokens that
        disagree with the eager twin, a twin error (targets without tokens) or a
        replay-versus-shadow step error above ``DIVERGENCE_TOLERANCE``."""
        agreement, twin = self.token_agreement, self.max_logit_error
        return (
            (agreement is not None and agreement < 1.0)
            or (agreement is None and twin is not None and not twin <= DIVERGENCE_TOLERANCE)
            or not self.max_step_error <= DIVERGENCE_TOLERANCE
        )

    def describe(self) -> str:
        """``token agreement 0.18, max step error 3.2``: what the oracle measured."""
        parts = []
        if self.token_agreement is not None:
            parts.append(f"token agreement {self.token_agreement:.2f}")
        elif self.max_logit_error is not None:
            parts.append(f"eager-twin error {self.max_logit_error:.3g}")
        parts.append(f"max step error {self.max_step_error:.3g}")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "runner": self.runner,
            "mode": self.mode,
            "token_agreement": None if self.token_agreement is None else round(self.token_agreement, 6),
            "max_step_error": _number(self.max_step_error),
            "max_logit_error": None if self.max_logit_error is None else _number(self.max_logit_error),
            "replay_steps": self.replay_steps,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Numerical:
        """The record ``to_json`` wrote, with its values as the JSON rounded them (6
        significant digits): ``Numerical.from_json(d).to_json() == d``."""
        return cls(doc["runner"], doc["mode"], _optional_number(doc["token_agreement"]),
                   _from_number(doc["max_step_error"]), _optional_number(doc["max_logit_error"]),
                   doc["replay_steps"])


def _number(x: float) -> float | str:
    """A float for JSON: 6 significant digits; ``"inf"`` or ``"nan"`` where it is not
    finite (JSON has no such numbers)."""
    if x != x:
        return "nan"
    if x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    return float(f"{x:.6g}")


def _from_number(x: float | str) -> float:
    """The inverse of ``_number``: ``"nan"``, ``"inf"`` and ``"-inf"`` are read back as floats."""
    if isinstance(x, str):
        if x not in ("nan", "inf", "-inf"):
            raise ValueError(f"{x!r} is not a number")
        return float(x)
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ValueError(f"{x!r} is not a number")
    return float(x)


def _optional_number(x: float | str | None) -> float | None:
    return None if x is None else _from_number(x)
