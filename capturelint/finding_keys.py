"""Every way a finding is keyed, each named for what it serves.

A finding is compared with another for five reasons, and each reason leaves out
different fields:

- ``order_key``: the order every format lists findings in (``Finding.sort_key``):
  configuration, then the line to change, then the rule and the rest, so the same
  command prints the same order.
- ``cause_key`` (and its hash ``group_id``): one *problem* across layers, graphs and
  configurations: the rule, the source lines on both sides, the op and tensor with
  module indices abstracted; ``group_order`` orders the groups as ruff orders its lines.
- ``occurrence_key``: one finding of one configuration seen at many replay steps
  (the analyzer's ``FindingSet`` merges them, counting the steps).
- ``trial_key``: one finding across the regions ``capturelint suggest`` tries: its
  segment index moves as breaks are added, so it is left out, as are the
  configuration (the caller pairs the key with it) and the step side.
- ``fingerprint``: one *hazard* across runs (32 hex digits, no line number, so it
  survives edits that move code): SARIF's ``partialFingerprints`` and the
  ``--accept-findings`` file key by it.

The keys read a finding's fields by name; they import nothing of ``findings`` (which
imports them), so the fields they read are listed in ``Keyed``.
"""

from __future__ import annotations

import hashlib
import re
from typing import Protocol

from capturelint.runtime.protocol import Frame


class Keyed(Protocol):
    """The fields of a ``capturelint.findings.Finding`` the keys read."""

    code: str
    runner: str
    mode: str
    graph: str
    segment_index: int
    op: str
    scope: str
    tensor: str | None
    capture_frame: Frame | None
    shadow_frame: Frame | None
    allocation_frame: Frame | None
    invariant: str | None

    @property
    def location(self) -> Frame | None: ...


class KeyedGroup(Protocol):
    """The fields of a ``capturelint.findings.FindingGroup`` ``group_order`` reads."""

    @property
    def code(self) -> str: ...

    @property
    def frame(self) -> Frame | None: ...

    @property
    def first(self) -> Keyed: ...


_NOWHERE = Frame("", 0, "")


def order_key(f: Keyed) -> tuple:
    """The order findings are listed in: runner, mode, the line to change, rule, graph,
    segment, scope, op, tensor, invariant."""
    frame = f.location or _NOWHERE
    return (f.runner, f.mode, frame.file, frame.line, f.code, f.graph, f.segment_index, f.scope, f.op,
            f.tensor or "", f.invariant or "")


def cause_key(f: Keyed) -> tuple[str, ...]:
    """What makes two findings one problem: the rule, the declared invariant, the source
    lines on both sides (capture, step, re-allocation), the op and the tensor, with
    module indices abstracted (``model.layers.3.attn.kv_cache`` is
    ``model.layers.*.attn.kv_cache``). Scope, graph, configuration, replay steps and
    the message's counts and op lists are evidence of one occurrence, not the cause,
    and are left out: they differ from layer to layer for one and the same branch. A
    stale break argument (CL107) is one problem per argument the break was handed,
    whichever tensors inside it differ (``break_argument``)."""
    tensor = f.tensor or ""
    if f.code in _ONE_PER_ARGUMENT:
        # a break handed one stale object (vLLM's attention metadata, with hundreds of
        # tensors, each read by many ops) is one problem: the argument it was handed
        tensor, op = break_argument(tensor), ""
    else:
        op = f.op
    return (f.code, f.invariant or "", _where(f.location), _where(f.capture_frame), _where(f.shadow_frame),
            _where(f.allocation_frame), abstract_indices(op), abstract_indices(tensor))


_ONE_PER_ARGUMENT = frozenset({"CL107"})  # rules whose finding names a path inside a break's argument
_ARGUMENT_ROOT = re.compile(r"^(?:argument )?([A-Za-z_][A-Za-z0-9_]*)")


def break_argument(path: str) -> str:
    """The argument of an eager break a CL107 path is inside: ``meta.slot_mapping``,
    ``argument meta['layer.0'].block_table`` -> ``meta``."""
    found = _ARGUMENT_ROOT.match(path)
    return found.group(1) if found else path


def group_id(f: Keyed) -> str:
    """The id of ``f``'s group: 12 hex digits hashed from ``cause_key``, so the same
    command gives the same ids (and the members of a group the same one)."""
    return hashlib.sha256("\x1f".join(cause_key(f)).encode("utf-8")).hexdigest()[:12]


def group_order(g: KeyedGroup) -> tuple:
    """The order of problems, as ruff orders its lines: by file, line and code (groups
    without a source line, the numerical oracle's, last), then their first finding."""
    return (g.frame is None, g.frame.file if g.frame else "", g.frame.line if g.frame else 0, g.code,
            order_key(g.first))


def occurrence_key(f: Keyed) -> tuple:
    """One finding of one configuration, whichever replay step showed it: the rule,
    configuration, scope, op, tensor, the lines on both sides and the invariant."""
    return (f.code, f.runner, f.mode, f.scope, f.op, f.tensor, _line(f.capture_frame), _line(f.shadow_frame),
            f.invariant)


def trial_key(f: Keyed) -> tuple:
    """One finding across the regions ``suggest`` tries (its segment index moves when
    breaks are added): the rule, scope, op, tensor and the capture-side line."""
    return (f.code, f.scope, f.op, f.tensor or "", _line(f.capture_frame))


def fingerprint(f: Keyed) -> str:
    """The identity of a finding across runs (32 hex digits): a hash of its code, the
    file of its op's line (capture side, else step side), its scope, op and tensor (and
    declared invariant), and no line number, so it survives edits that move code; the
    same hazard under several runners, modes or graphs shares it. SARIF's
    ``partialFingerprints`` and the ``--accept-findings`` file key findings by it."""
    frame = f.capture_frame or f.shadow_frame
    parts = (f.code, frame.file if frame else "", f.scope, f.op, f.tensor or "")
    if f.invariant is not None:  # two invariants may flag the same op
        parts += (f.invariant,)
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:32]


_INDEX = re.compile(r"(?<=[A-Za-z_]\.)\d+\b")


def abstract_indices(name: str) -> str:
    """``model.layers.3.attn`` -> ``model.layers.*.attn``: numeric components of dotted names."""
    return _INDEX.sub("*", name)


def _where(frame: Frame | None) -> str:
    return frame.location if frame is not None else ""


def _line(frame: Frame | None) -> tuple[str, int] | None:
    return (frame.file, frame.line) if frame is not None else None


__all__ = ["Keyed", "KeyedGroup", "abstract_indices", "break_argument", "cause_key", "fingerprint", "group_id", "group_order",
           "occurrence_key", "order_key", "trial_key"]
