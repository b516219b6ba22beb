"""The analyzer: aligns a replay step with its shadow and runs the rules over them.

Input per replay step: the capture stream of the graph being replayed and the shadow
stream of the step (see ``capturelint.records``). The analyzer

1. compares the segment structure (captured / eager, and which break) of capture and
   shadow;
2. aligns each captured segment's recorded ops with the shadow's ops over the same span
   (a longest-matching-blocks diff on ``(op, scope)``), finding the first divergence and
   its extent rather than a cascade of mismatches;
3. builds ``StepView``: the aligned op pairs (up to the first divergence of a segment;
   what follows a divergence is a consequence of it), a map from capture op to shadow
   op, and every aligned op or tensor argument that fails R2, R3 or R4, each marked
   when it only follows from an earlier failure (below);
4. hands the view to every rule that checks steps and merges their findings across
   steps, graphs and configurations: one finding per (rule, scope, op, tensor, source
   lines), with the steps it was seen at.

**Follow-ons.** A tensor whose producer already fails a condition mismatches because of
that failure; it is marked ``followon`` and not reported again. The producers that
count are decided once, here, in the order of the model's conditions: the ops after a
segment's divergence (R1), the ops with a differing host value (R2), then, in op order,
the ops with a differing tensor geometry (R3); for R4 also the earlier ops that read a
stale location (an escaped eager output never counts: it lies outside every captured
condition). The views are frozen, so the rules are pure: each reads a view and returns
findings, and the rule set finds the same in any order.

**Bare graphs.** A graph used directly (``torch.cuda.CUDAGraph``) has no shadow to
align; what the runtime and the tracer's watch find about it (a freed input, a re-bound
holder of an input, a read of graph memory that does not hold the value meant) is
handed to the rules as it happens, one ``BareView`` each.

Which rules run at which point is read off the rules themselves (``Rule.hooks``: the
check methods a rule implements); the analyzer imports no rule.

The analyzer needs neither a GPU nor a dispatch mode: it reads records, so rules are
tested with hand-built streams as well as with real traces.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from types import MappingProxyType
from typing import Any, Iterable, Iterator, Mapping, Sequence

from capturelint.finding_keys import occurrence_key
from capturelint.findings import DIVERGENCE_TOLERANCE, Condition, Finding, Site
from capturelint.runtime.protocol import BreakOutputs, Frame, HeldInputEvent, HostSyncEvent, SegmentKind, StaleInputEvent
from capturelint.records import GraphMemoryRead, OpRecord, ReadKind, Segment, Stream, TensorUse


@dataclasses.dataclass(frozen=True)
class RunLabel:
    """Which configuration a step belongs to."""

    runner: str
    mode: str


@dataclasses.dataclass(frozen=True)
class Divergence:
    """The first point where a captured segment's ops and the shadow's part ways."""

    capture_op: OpRecord | None  # None: the capture's segment ended here
    shadow_op: OpRecord | None  # None: the step's segment ended here
    missing: int  # ops the step runs that the capture did not record
    extra: int  # ops the capture recorded that the step does not run
    missing_ops: tuple[str, ...] = ()  # their names, in order, without repeats
    extra_ops: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class SegmentAlignment:
    index: int
    capture_ops: tuple[OpRecord, ...]
    shadow_ops: tuple[OpRecord, ...]
    pairs: tuple[tuple[OpRecord, OpRecord], ...]  # up to the first divergence
    divergence: Divergence | None


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """An aligned captured op that fails R2 (a host value), or one of its tensor
    arguments that fails R3 (``capture_use``/``shadow_use``: the geometry) or R4
    (``problem``: the location). ``followon``: the tensor's producer already fails a
    condition (the module's doc), so the mismatch is a consequence, not a cause."""

    alignment: SegmentAlignment
    capture_op: OpRecord
    shadow_op: OpRecord
    capture_use: TensorUse | None = None
    shadow_use: TensorUse | None = None
    problem: LocationProblem | None = None
    followon: bool = False


@dataclasses.dataclass(frozen=True)
class StepView:
    """A replay step prepared for the rules; frozen, so that no rule can change what
    another reads. ``build_view`` makes it."""

    label: RunLabel
    capture: Stream
    shadow: Stream
    structure_differs: bool
    alignments: tuple[SegmentAlignment, ...]
    op_map: Mapping[int, int]  # capture op index -> aligned shadow op index (read-only)
    host_values: tuple[Mismatch, ...] = ()  # R2: aligned ops whose non-tensor arguments differ
    geometries: tuple[Mismatch, ...] = ()  # R3: the first tensor argument of an op whose geometry differs
    locations: tuple[Mismatch, ...] = ()  # R4: every tensor argument that resolves to another location

    def segment_label(self, index: int) -> str:
        seg = self.capture.segments[index] if index < len(self.capture.segments) else None
        return f"{self.capture.graph} {seg.label}" if seg else f"{self.capture.graph} #{index}"

    def site(self, index: int, segment: str | None = None) -> Site:
        """Where a finding of segment ``index`` of this capture is (``segment``: its
        label, else ``segment_label``)."""
        return Site(self.label.runner, self.label.mode, self.capture.graph, self.capture.runtime_mode,
                    self.segment_label(index) if segment is None else segment, index)

    def tensor_name(self, stream: Stream, use: TensorUse, scope: str = "") -> str:
        """A human name: parameter, runner buffer, metadata field, cache, or producer."""
        name = stream.name_of(use.storage, scope)
        if name is not None:
            return name
        origin = stream.origins.get(use.storage)
        if origin is not None and origin.producer is not None:
            prod = stream.ops[origin.producer]
            return f"output of {prod.op} in {prod.scope or '<top>'} ({prod.frame.location})"
        if origin is not None and not origin.external:
            return f"a tensor allocated inside an eager break ({use.arg})"
        return f"tensor {use.arg} (storage not named by the engine)"


@dataclasses.dataclass(frozen=True)
class RegionView:
    """One capture as a region graph (``capturelint.graph``), with the declared
    invariants that apply to it (its runner, mode and forward context), for the rules
    that check invariants (CL2xx). ``selected(inv)``: the ops an invariant's graph query
    selects, run once per capture by the analyzer."""

    label: RunLabel
    capture: Stream
    graph: Any  # networkx.MultiDiGraph, built by capturelint.graph.build_region_graph
    invariants: tuple[Any, ...]  # capturelint.invariants.Invariant
    selections: Mapping[str, tuple]  # invariant id -> the op nodes it selects (read-only)

    def selected(self, inv: Any) -> tuple:
        return self.selections[inv.id]

    def segment_label(self, index: int) -> str:
        seg = self.capture.segments[index] if 0 <= index < len(self.capture.segments) else None
        return f"{self.capture.graph} {seg.label}" if seg else f"{self.capture.graph} step"

    def site(self, index: int, segment: str | None = None) -> Site:
        """Where a finding of segment ``index`` of this capture is (``segment``: its
        label, else ``segment_label``)."""
        return Site(self.label.runner, self.label.mode, self.capture.graph, self.capture.runtime_mode,
                    self.segment_label(index) if segment is None else segment, index)


@dataclasses.dataclass(frozen=True)
class BareView:
    """One event of a bare graph (no shadow), for the rules that check such graphs:
    ``event`` is a ``HeldInputEvent`` (the runtime's) or a ``GraphMemoryRead`` (the
    tracer's watch), ``capture`` the graph's capture. ``readers`` are the captured ops
    that read ``storage`` (the event's captured input or graph memory), in op order;
    ``producer`` the captured op that allocated it, when the capture did."""

    label: RunLabel
    capture: Stream
    event: HeldInputEvent | GraphMemoryRead
    readers: tuple[OpRecord, ...] = ()
    producer: OpRecord | None = None

    @property
    def storage(self) -> int:
        event = self.event
        return event.use.storage if isinstance(event, GraphMemoryRead) else event.storage

    def tensor_name(self) -> str:
        """The graph-memory tensor read, named by the captured op that produced it."""
        name = self.capture.name_of(self.storage)
        if name is not None:
            return name
        p = self.producer
        return f"output of {p.op} ({p.frame.location})" if p else f"tensor {self.event.use.arg}"


def bare_view(label: RunLabel, capture: Stream, event: HeldInputEvent | GraphMemoryRead,
              cache: dict[tuple[int, int], tuple] | None = None) -> BareView:
    """The view of ``event``; ``cache`` keeps each storage's readers and producer (a
    read in a loop is an event per iteration)."""
    storage = event.use.storage if isinstance(event, GraphMemoryRead) else event.storage
    key = (capture.graph_id, storage)
    found = cache.get(key) if cache is not None else None
    if found is None:
        readers = tuple(op for op in capture.ops if any(u.storage == storage for u in op.inputs))
        origin = capture.origins.get(storage)
        producer = capture.ops[origin.producer] if origin is not None and origin.producer is not None else None
        found = (readers, producer)
        if cache is not None:
            cache[key] = found
    return BareView(label, capture, event, *found)


@dataclasses.dataclass(frozen=True)
class HazardView:
    """A hazard the emulated runtime saw happen, for the rules that judge one
    (``check_hazard``): ``event`` is a ``runtime.protocol.OverwrittenRead`` (graph-pool
    memory another graph's replay overwrote, then read) or ``StreamCaptureEvent`` (a
    stream or event across a capture boundary); ``captures`` the capture streams the
    tracer recorded so far, by graph id (read-only)."""

    label: RunLabel
    event: Any
    captures: Mapping[int, Stream]


@dataclasses.dataclass(frozen=True)
class LocationProblem:
    """Why a tensor read at replay is not the one the step reads (R4/R6)."""

    escaped: bool  # produced inside an eager break and not copied back
    capture_name: str
    shadow_name: str
    reason: str


def location_problem(view: StepView, c_use: TensorUse, s_use: TensorUse, scope: str) -> LocationProblem | None:
    """Check R4's location condition for one tensor argument; None when it holds."""
    cap, sh = view.capture, view.shadow
    c_origin = cap.origins.get(c_use.storage)
    s_origin = sh.origins.get(s_use.storage)
    if c_origin is None or s_origin is None:
        return None
    if c_origin.external:
        if c_use.storage == s_use.storage:
            return None
        if s_origin.external:
            reason = "the step's tensor is a different storage than the one captured: it was re-allocated after capture"
        else:
            reason = "the step computes this tensor during the forward, but the graph reads a storage that existed before the capture"
        return _problem(view, c_use, s_use, scope, False, reason)
    producer = cap.ops[c_origin.producer]
    seg = cap.segments[producer.segment]
    if seg.kind is SegmentKind.EAGER:
        if cap.break_outputs is BreakOutputs.COPY and c_use.storage in seg.returned:
            return None
        reason = f"it was allocated inside eager break {seg.name} and is not a return value the runtime copies back"
        return _problem(view, c_use, s_use, scope, True, reason)
    if s_origin.external:
        reason = "the graph reads its own capture-time intermediate, the step reads a pre-existing tensor"
        return _problem(view, c_use, s_use, scope, False, reason)
    expected = view.op_map.get(c_origin.producer)
    if expected is not None and expected != s_origin.producer:
        reason = "the step reads a tensor produced by a different op than the captured one"
        return _problem(view, c_use, s_use, scope, False, reason)
    return None


def _problem(view: StepView, c_use: TensorUse, s_use: TensorUse, scope: str, escaped: bool, reason: str) -> LocationProblem:
    # Names are looked up only for problems: this runs for every tensor of every step.
    return LocationProblem(escaped, view.tensor_name(view.capture, c_use, scope), view.tensor_name(view.shadow, s_use, scope), reason)


def _segment_ops(stream: Stream, seg: Segment) -> tuple[OpRecord, ...]:
    return tuple(stream.ops[seg.first_op : seg.end_op])


def _align(index: int, c_ops: tuple[OpRecord, ...], s_ops: tuple[OpRecord, ...]) -> tuple[SegmentAlignment, list[tuple[OpRecord, OpRecord]]]:
    """Align two op lists; returns the alignment (pairs cut at the first divergence)
    and every matched pair (for the capture-to-shadow op map)."""
    a = [op.key for op in c_ops]
    b = [op.key for op in s_ops]
    if a == b:
        pairs = list(zip(c_ops, s_ops))
        return SegmentAlignment(index, c_ops, s_ops, tuple(pairs), None), pairs
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    all_pairs: list[tuple[OpRecord, OpRecord]] = []
    before: list[tuple[OpRecord, OpRecord]] = []
    divergence: Divergence | None = None
    missing = extra = 0
    missing_ops: dict[str, None] = {}
    extra_ops: dict[str, None] = {}
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            block = list(zip(c_ops[i1:i2], s_ops[j1:j2]))
            all_pairs.extend(block)
            if divergence is None:
                before.extend(block)
            continue
        extra += i2 - i1
        missing += j2 - j1
        extra_ops.update((op.op, None) for op in c_ops[i1:i2])
        missing_ops.update((op.op, None) for op in s_ops[j1:j2])
        if divergence is None:
            divergence = Divergence(
                c_ops[i1] if i1 < len(c_ops) else None, s_ops[j1] if j1 < len(s_ops) else None, 0, 0
            )
    assert divergence is not None
    divergence = dataclasses.replace(
        divergence, missing=missing, extra=extra, missing_ops=tuple(missing_ops), extra_ops=tuple(extra_ops)
    )
    return SegmentAlignment(index, c_ops, s_ops, tuple(before), divergence), all_pairs


def build_view(label: RunLabel, capture: Stream, shadow: Stream) -> StepView:
    """Align ``capture`` with ``shadow`` and derive, once, every fact the rules read."""
    c_struct = [(s.kind, s.name) for s in capture.segments]
    s_struct = [(s.kind, s.name) for s in shadow.segments]
    alignments: list[SegmentAlignment] = []
    op_map: dict[int, int] = {}
    for i, (cs, ss) in enumerate(zip(capture.segments, shadow.segments)):
        if (cs.kind, cs.name) != (ss.kind, ss.name):
            break
        alignment, pairs = _align(i, _segment_ops(capture, cs), _segment_ops(shadow, ss))
        for c, s in pairs:
            op_map[c.index] = s.index
        if cs.kind is SegmentKind.CAPTURED:
            alignments.append(alignment)
    view = StepView(label, capture, shadow, c_struct != s_struct, tuple(alignments), MappingProxyType(op_map))
    return _with_mismatches(view)


def _with_mismatches(view: StepView) -> StepView:
    """The view with its R2, R3 and R4 mismatches, follow-ons marked (the module's doc)."""
    failed: set[int] = set()  # capture ops that fail a condition judged so far
    for al in view.alignments:
        d = al.divergence
        if d is not None and d.capture_op is not None:
            failed.update(op.index for op in al.capture_ops if op.index >= d.capture_op.index)
    origins = view.capture.origins

    def followon(use: TensorUse) -> bool:
        origin = origins.get(use.storage)
        return origin is not None and origin.producer is not None and origin.producer in failed

    host_values = tuple(Mismatch(al, c, s) for al, c, s in iter_pairs(view) if c.scalars != s.scalars)
    failed.update(m.capture_op.index for m in host_values)
    geometries = []
    for al, c, s in iter_pairs(view):
        for cu, su in zip(c.inputs, s.inputs):
            if cu[2:6] != su[2:6]:  # shape, stride, offset, dtype
                geometries.append(Mismatch(al, c, s, cu, su, followon=followon(cu)))
                failed.add(c.index)
                break
    locations = []
    for al, c, s in iter_pairs(view):
        for cu, su in zip(c.inputs, s.inputs):
            problem = location_problem(view, cu, su, s.scope)
            if problem is None:
                continue
            if not problem.escaped:
                failed.add(c.index)
            locations.append(Mismatch(al, c, s, cu, su, problem, followon=followon(cu) or _other_path(view, al, cu, su)))
    return dataclasses.replace(view, host_values=host_values, geometries=tuple(geometries), locations=tuple(locations))


def _other_path(view: StepView, al: SegmentAlignment, cu: TensorUse, su: TensorUse) -> bool:
    """A pre-existing tensor read where the capture read another pre-existing one, in a
    segment whose step took another path than its capture (R1): the ops were aligned
    across two branches (a layer skipped by a Python coin, another layer's weights),
    so the mismatch follows from the path, which CL101 reports; it is a re-allocation
    only when the step's tensor was made after the capture began."""
    if al.divergence is None:
        return False
    c_origin, s_origin = view.capture.origins.get(cu.storage), view.shadow.origins.get(su.storage)
    return (c_origin is not None and c_origin.external and s_origin is not None and s_origin.external
            and not view.shadow.allocated_after(su.storage, view.capture.allocation_mark))


class FindingSet:
    """Merges findings seen at many steps into one per location
    (``capturelint.finding_keys.occurrence_key``)."""

    MAX_STEPS = 5

    def __init__(self) -> None:
        self._by_key: dict[tuple, Finding] = {}

    def add(self, f: Finding) -> None:
        k = occurrence_key(f)
        seen = self._by_key.get(k)
        if seen is None:
            self._by_key[k] = f
            return
        steps = seen.steps if len(seen.steps) >= self.MAX_STEPS else tuple(sorted(set(seen.steps + f.steps)))[: self.MAX_STEPS]
        self._by_key[k] = dataclasses.replace(seen, steps=steps, occurrences=seen.occurrences + f.occurrences)

    def extend(self, findings: Iterable[Finding]) -> None:
        for f in findings:
            self.add(f)

    def __len__(self) -> int:
        return len(self._by_key)

    def sorted(self) -> list[Finding]:
        return sorted(self._by_key.values(), key=Finding.sort_key)


@dataclasses.dataclass(frozen=True)
class EnteredAt:
    """Where a run's divergence from its eager twin enters, where an adapter found it
    (``capturelint.adapters.vllm.break_probe``): the eager break (``name``, ``frame``:
    where it is defined) that, handed what the twin's call was handed, computed
    something else, in workload ``step``, with ``real`` real rows of the ``rows`` its
    tensors had (more rows: a padded batch)."""

    name: str
    frame: Frame
    step: int
    real: int
    rows: int


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """What a whole traced run of one configuration ended with, for the rules that
    judge a run rather than a step: the host sync that stopped its capture, if any,
    the structural findings so far, and the numerical oracle (``token_agreement`` and
    ``twin_error`` are ``None`` without an eager twin)."""

    label: RunLabel
    findings: tuple[Finding, ...]
    host_sync: HostSyncEvent | None
    replay_steps: int
    max_step_error: float
    token_agreement: float | None = None
    twin_error: float | None = None
    entered: EnteredAt | None = None  # where the divergence from the twin enters, if an adapter found it


class Analyzer:
    """Runs the given rules over each replay step, capture, stale-input event and the
    finished run of one configuration, and merges their findings. Rules are handed in
    (``capturelint.rules.RULES``, selected): the analyzer does not know them."""

    def __init__(self, label: RunLabel, rules: Sequence[type], invariants: Sequence[Any] = ()):
        self.label = label
        self.rules = [r() for r in rules]
        self.invariants = tuple(invariants)
        self.findings = FindingSet()
        self._provisional: list[Finding] = []  # findings of provisional reads, kept if the run diverged (finish)
        self._unless_agreed: list[Finding] = []  # bare graphs' unreplayed reads, dropped if the twin agreed (finish)
        self.max_step_error = 0.0
        self.steps = 0
        self._capture_checked: set[int] = set()
        self._bare_ops: dict[tuple[int, int], tuple] = {}  # (graph, storage) -> its captured readers and producer
        self.invariant_selected: dict[str, int] = {}  # invariants that applied to a capture: ops selected in all
        self._hooked: dict[str, list] = {}  # check method -> the rules that implement it (``Rule.hooks``)
        self.hooks_run: set[str] = set()  # the check methods called: each had something to check
        for rule in self.rules:
            for hook in rule.hooks:
                self._hooked.setdefault(hook, []).append(rule)

    def _rules(self, hook: str) -> list:
        self.hooks_run.add(hook)
        return self._hooked.get(hook, [])

    def rules_checked(self, also: Iterable[str] = ()) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The codes of the structural rules (all but the numerical oracle's and the
        suppression comments') that had
        something to check in this run, and of those that had nothing: a rule checked
        when one of its check methods was called (a step rule after a shadowed step, an
        invariant rule on a capture an invariant applies to), or is in ``also`` (what the
        runtime checks for the rules without calling them: a bare graph's freed inputs
        before each replay, ``check_stale``; its rebound holders and graph-memory reads, ``check_bare``)."""
        ran = self.hooks_run | set(also)
        # the numerical oracle's rule and the suppression comments' (run on the report) are not structural
        structural = [r for r in self.rules if r.condition not in (Condition.NUMERICAL, Condition.SUPPRESSION)]
        return (tuple(sorted(r.code for r in structural if r.hooks & ran)),
                tuple(sorted(r.code for r in structural if not r.hooks & ran)))

    def on_step(self, capture: Stream, shadow: Stream, error: float) -> None:
        self.steps += 1
        self.max_step_error = max(self.max_step_error, error)
        view = build_view(self.label, capture, shadow)
        for rule in self._rules("check"):
            self.findings.extend(rule.check(view))

    def on_stale(self, capture: Stream, event: StaleInputEvent) -> None:
        """A graph without a shadow found a storage it reads freed by the engine."""
        for rule in self._rules("check_stale"):
            self.findings.extend(rule.check_stale(self.label, capture, event))

    def on_bare(self, capture: Stream, event: HeldInputEvent | GraphMemoryRead) -> None:
        """An event of a graph without a shadow (``BareView``); the findings of a read of
        a capture's unwritten outputs wait for the run's outcome (``finish``): the
        emulator poisons those outputs, so an eager twin that agreed shows the value read
        never reached the result (a discarded capture pass, as vLLM's dummy runs)."""
        unreplayed = isinstance(event, GraphMemoryRead) and event.kind is ReadKind.UNREPLAYED
        provisional = unreplayed and event.provisional
        # a provisional read counts as checked only once the run's outcome keeps it (finish)
        rules = self._hooked.get("check_bare", []) if provisional else self._rules("check_bare")
        if rules:
            view = bare_view(self.label, capture, event, self._bare_ops)
            into = self._provisional if provisional else self._unless_agreed if unreplayed else self.findings
            for rule in rules:
                into.extend(rule.check_bare(view))

    def on_hazard(self, event: Any, captures: Mapping[int, Stream]) -> None:
        """The runtime saw a hazard happen (``HazardView``)."""
        view = HazardView(self.label, event, MappingProxyType(dict(captures)))
        for rule in self._rules("check_hazard"):
            self.findings.extend(rule.check_hazard(view))

    def check_capture(self, capture: Stream) -> None:
        """Rules that need only a capture (host syncs a backend did not reject)."""
        if capture.graph_id in self._capture_checked:
            return
        self._capture_checked.add(capture.graph_id)
        for rule in self._rules("check_capture"):
            self.findings.extend(rule.check_capture(self.label, capture))
        self.check_invariants(capture)

    def check_invariants(self, capture: Stream) -> None:
        """The declared invariants that apply to ``capture``, as queries on its region
        graph (CL2xx); counts what each selects, for the "selects nothing" warning."""
        applicable = tuple(
            inv for inv in self.invariants
            if inv.applies(self.label.runner, self.label.mode, capture.runtime_mode, capture.context.key)
        )
        if not applicable or not self._hooked.get("check_region"):
            return
        rules = self._rules("check_region")
        from capturelint.graph import build_region_graph, check_graph

        G = build_region_graph(capture)
        check_graph(G)
        selections = {inv.id: tuple(inv.select_ops(G)) for inv in applicable}
        for inv in applicable:
            self.invariant_selected[inv.id] = self.invariant_selected.get(inv.id, 0) + len(selections[inv.id])
        view = RegionView(self.label, capture, G, applicable, MappingProxyType(selections))
        for rule in rules:
            self.findings.extend(rule.check_region(view))

    def finish(self, outcome: RunOutcome) -> list[Finding]:
        """Rules over the whole run (a failed capture, the numerical oracle); returns
        every finding, merged and sorted."""
        agreement, twin = outcome.token_agreement, outcome.twin_error
        compared = agreement is not None or twin is not None
        diverged = ((agreement is not None and agreement < 1.0)
                    or (agreement is None and twin is not None and not twin <= DIVERGENCE_TOLERANCE))
        # the emulator poisons a capture's float memory with NaN: a non-finite error is that poison in the result
        poisoned = twin is not None and not math.isfinite(twin)
        kept = []
        if diverged and poisoned and self._provisional:  # the capture's outputs reached the result
            kept += self._provisional
            self.hooks_run.add("check_bare")
        if diverged or not compared:  # a bare graph's: nothing shows the poisoned value was dropped
            kept += self._unless_agreed
        if kept:
            self.findings.extend(kept)
            outcome = dataclasses.replace(outcome, findings=tuple(self.findings.sorted()))
        for rule in self._rules("check_run"):
            self.findings.extend(rule.check_run(outcome))
        return self.findings.sorted()


def iter_pairs(view: StepView) -> Iterator[tuple[SegmentAlignment, OpRecord, OpRecord]]:
    for alignment in view.alignments:
        for c, s in alignment.pairs:
            yield alignment, c, s


__all__ = [
    "Analyzer",
    "BareView",
    "Condition",
    "Divergence",
    "EnteredAt",
    "FindingSet",
    "HazardView",
    "LocationProblem",
    "Mismatch",
    "RunLabel",
    "RegionView",
    "RunOutcome",
    "SegmentAlignment",
    "StepView",
    "bare_view",
    "build_view",
    "location_problem",
]
