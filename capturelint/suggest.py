"""``capturelint suggest``: find the smallest eager region that makes replay equal eager.

**Idea.** A failing configuration's findings name the captured op and, for each, the
engine functions on its stack at capture (``Finding.capture_stack``: innermost first, up
to the captured callable). Making one of those functions an eager break re-runs it live
on every replay. Which one is enough is answered by experiment: wrap it with the
runtime's ``@eager_break_during_capture`` (the slot's ``BreakDecorator``) *at run time* (``eager_breaks``: the class or
module attribute is replaced for one run and restored; no file is edited), build a fresh
engine, and re-run the full check: the structural rules and the numerical oracle.

**What is built.**

- ``FunctionRef``: a function found on a capture-time stack, resolved to the class or
  module attribute that holds it, with the file and line of its ``def``;
- ``suggest``: collects the candidates of every failing configuration (the stack's
  functions that are not already breaks, the captured callable itself excluded: making
  it a break would leave nothing captured), groups the findings each covers, tries each
  candidate alone and then the smallest sets of candidates that together cover every
  finding (``max_candidates`` regions at most), keeps the regions that make every failing
  configuration clean, ranks them by eager ops per replay step, then by breaks, and
  checks each under every other configuration it was given (other modes, other runners:
  a region right for one runner may be wrong for another); the checks with the current
  region and the cross-checks, which do not depend on each other, run ``jobs`` at once;
- ``SuggestReport``: what was found, as JSON (byte-identical for the same command), the
  Rich form (``capturelint.render.suggest``) and a unified diff that adds the decorator
  where each function of the top region is defined (``patch``).

**A configuration is clean** when its check reports no finding and its numerical oracle
agrees (``ConfigReport.diverged`` is false). Nothing here knows an engine: an adapter
hands in ``Slot``\\ s, each of which builds a fresh engine and checks it.

**Limits.** A function is wrapped where it is defined (a class attribute, or a module
attribute and every module that imported the same function object); an engine that
holds a function in a closure, a ``<locals>`` function, or one built before the run
(at import) is not reached, and such frames are listed as skipped. A capture-time
divergence (R1) hides the findings after it in its segment, so a region that fixes some
findings and uncovers others is tried again with each function on the stacks of what
remains (regions of up to three functions). Findings whose captured op lies outside the
baked function (a branch that records *fewer* ops at capture is seen at the next op)
yield candidates that may miss it.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import itertools
import os
import sys
from typing import Any, Callable, Iterator, Sequence

from capturelint import __version__
from capturelint.finding_keys import trial_key
from capturelint.findings import Finding, Frame
from capturelint.report import ConfigReport
from capturelint.snapshot import config_map

JSON_VERSION = 1
DEFAULT_MAX_CANDIDATES = 12


@dataclasses.dataclass(frozen=True)
class BreakDecorator:
    """The decorator that makes a function an eager break in the engine's own runtime:
    ``wrap`` applies it at run time, ``name`` and ``import_line`` write it in a patch.
    Each adapter's slots carry their runtime's (capturelint's
    ``@eager_break_during_capture``; vLLM's for ``--engine vllm``: vLLM's runtime knows
    only its own breaks)."""

    wrap: Callable[[Callable], Callable]
    name: str
    import_line: str


# ----------------------------------------------------------------- functions


@dataclasses.dataclass(frozen=True, order=True)
class FunctionRef:
    """A function on a capture-time stack: ``qualname`` (``Attention._prepare``), the
    module that defines it, the file shown in findings and the line of its ``def``;
    ``source`` is the absolute file name, ``first_line`` its code object's first line
    (the first decorator's line)."""

    file: str
    def_line: int
    qualname: str
    module: str
    source: str = dataclasses.field(compare=False)
    first_line: int = dataclasses.field(compare=False)
    indent: str = dataclasses.field(default="", compare=False)

    @property
    def key(self) -> tuple[str, str]:
        return (self.source, self.qualname)

    def __str__(self) -> str:
        return f"{self.qualname} ({self.file}:{self.def_line})"

    def to_json(self) -> dict[str, Any]:
        return {"function": self.qualname, "module": self.module, "file": self.file, "line": self.def_line}


def _modules_of(source: str) -> list[Any]:
    """Every module loaded from ``source`` (one file may be imported under two names:
    ``--target FILE.py`` imports it as ``capturelint_target_FILE``, a test by its own)."""
    real = os.path.realpath(source)
    return [m for m in list(sys.modules.values()) if (f := getattr(m, "__file__", None)) and os.path.realpath(f) == real]


def _unwrap(raw: Any) -> Any:
    fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    return getattr(fn, "__wrapped__", fn) if getattr(fn, "__capturelint_break__", None) else fn


def _lookup(frame: Frame, module: Any = None) -> tuple[Any, str, Any] | str:
    """``(owner, attribute, raw value)`` holding the frame's function in ``module``
    (default: the first module loaded from its file), or why not."""
    if "<" in frame.qualname:
        return "defined inside a function (<locals>) or a lambda: no attribute holds it"
    if module is None:
        module = next(iter(_modules_of(frame.source)), None) if frame.source else None
    if module is None:
        return "its module is not imported under a name"
    owner: Any = module
    parts = frame.qualname.split(".")
    for part in parts[:-1]:
        owner = vars(owner).get(part) if hasattr(owner, "__dict__") else None
        if not isinstance(owner, type):
            return f"{part} is not a class of {module.__name__}"
    raw = vars(owner).get(parts[-1])
    fn = _unwrap(raw) if raw is not None else None
    code = getattr(fn, "__code__", None)
    if code is None or os.path.realpath(code.co_filename) != os.path.realpath(frame.source) \
            or code.co_firstlineno != frame.first_line:
        return "the attribute of that name holds another object (replaced at run time)"
    return owner, parts[-1], raw


def _def_line(source: str, name: str, first_line: int) -> tuple[int, str]:
    """The line of the ``def`` (below any decorators) and its indentation."""
    try:
        text = open(source, encoding="utf-8").read()
        tree = ast.parse(text)
    except (OSError, SyntaxError, ValueError):
        return first_line, ""
    lines = text.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            if start == first_line:
                line = lines[node.lineno - 1]
                return node.lineno, line[: len(line) - len(line.lstrip())]
    return first_line, ""


def resolve(frame: Frame) -> FunctionRef | str:
    """The ``FunctionRef`` of a recorded frame, or why it cannot be an eager break."""
    found = _lookup(frame)
    if isinstance(found, str):
        return found
    owner, _, raw = found
    fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    if getattr(fn, "__capturelint_break__", None):
        return "already an eager break"
    if not callable(fn):
        return "not a plain function"
    module = owner.__module__ if isinstance(owner, type) else owner.__name__
    line, indent = _def_line(frame.source, frame.qualname.rsplit(".", 1)[-1], frame.first_line)
    return FunctionRef(frame.file, line, frame.qualname, module, frame.source, frame.first_line, indent)


@contextlib.contextmanager
def eager_breaks(region: Sequence[FunctionRef], decorator: BreakDecorator) -> Iterator[None]:
    """Make every function of ``region`` an eager break for the duration: the class or
    module attribute that holds it, in every module loaded from its file (and every
    module attribute holding the same function object), is replaced by the function
    wrapped with ``decorator``, then restored. Files are never edited."""
    wrap = decorator.wrap
    saved: list[tuple[Any, str, Any]] = []
    try:
        for ref in region:
            frame = Frame(ref.file, ref.def_line, ref.qualname.rsplit(".", 1)[-1], ref.qualname, ref.source, ref.first_line)
            found = [_lookup(frame, m) for m in _modules_of(ref.source)] or [_lookup(frame)]
            if all(isinstance(f, str) for f in found):
                raise LookupError(f"{ref}: {found[0]}")
            for owner, name, raw in (f for f in found if not isinstance(f, str)):
                _wrap_in_place(owner, name, raw, wrap, saved)
        yield
    finally:
        for holder, attr, value in reversed(saved):
            setattr(holder, attr, value)


def _wrap_in_place(owner: Any, name: str, raw: Any, wrap: Callable[[Callable], Callable],
                   saved: list[tuple[Any, str, Any]]) -> None:
    """Replace ``owner.name`` (``raw``) by its wrapped function, noting what to restore."""
    if isinstance(raw, staticmethod):
        wrapped: Any = staticmethod(wrap(raw.__func__))
    elif isinstance(raw, classmethod):
        wrapped = classmethod(wrap(raw.__func__))
    else:
        wrapped = wrap(raw)
    holders = [(owner, name)]
    if not isinstance(owner, type):  # a module function: also where it was imported by name
        for module in list(sys.modules.values()):
            d = getattr(module, "__dict__", None)
            if module is owner or not isinstance(d, dict):
                continue
            holders.extend((module, k) for k, v in list(d.items()) if v is raw)
    for holder, attr in holders:
        saved.append((holder, attr, vars(holder)[attr]))
        setattr(holder, attr, wrapped)


# --------------------------------------------------------------- the records


@dataclasses.dataclass(frozen=True)
class Slot:
    """One configuration an adapter can build afresh and check: ``check()`` builds a
    new engine (so that it picks up the functions wrapped at that moment) and returns
    its report. ``requested`` is false for configurations checked only to cross-check
    a suggestion (another runner than the user asked for)."""

    label: str  # "runner/mode"
    runner: str
    mode: str
    check: Callable[[], ConfigReport]
    decorator: BreakDecorator  # what makes a function a break in this engine's runtime
    requested: bool = True


def is_clean(cfg: ConfigReport) -> bool:
    return not cfg.findings and not cfg.diverged and cfg.note is None


def describe_finding(f: Finding) -> str:
    where = f" at {f.capture_frame.location}" if f.capture_frame else ""
    return f"{f.runner}/{f.mode} {f.code} {f.scope} · {f.op}{where}"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One configuration checked with a region in place (or the current one)."""

    label: str
    clean: bool
    findings: tuple[str, ...]  # what remains, described
    finding_keys: frozenset
    eager_ops_per_step: float
    replay_steps: int
    max_step_error: float | None
    token_agreement: float | None
    diverged: bool
    error: str | None = None

    @classmethod
    def of(cls, label: str, cfg: ConfigReport) -> "Outcome":
        n = cfg.numerical
        return cls(label, is_clean(cfg), tuple(describe_finding(f) for f in cfg.findings),
                   frozenset(trial_key(f) for f in cfg.findings), config_map(cfg).eager_ops_per_step,
                   n.replay_steps if n else 0, n.max_step_error if n else None, n.token_agreement if n else None,
                   cfg.diverged)

    @classmethod
    def failed(cls, label: str, error: str) -> "Outcome":
        return cls(label, False, (), frozenset(), 0.0, 0, None, None, False, error)

    def to_json(self) -> dict[str, Any]:
        from capturelint.findings import json_number

        return {
            "configuration": self.label,
            "clean": self.clean,
            "findings": list(self.findings),
            "eager_ops_per_step": self.eager_ops_per_step,
            "replay_steps": self.replay_steps,
            "max_step_error": None if self.max_step_error is None else json_number(self.max_step_error),
            "token_agreement": None if self.token_agreement is None else round(self.token_agreement, 6),
            "diverged": self.diverged,
            "error": self.error,
        }


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A function to try, with the findings whose capture-time stack holds it."""

    ref: FunctionRef
    covers: tuple[str, ...]  # described findings
    keys: frozenset  # (label, trial_key)

    def to_json(self) -> dict[str, Any]:
        return {**self.ref.to_json(), "covers": len(self.covers), "findings": list(self.covers)}


@dataclasses.dataclass(frozen=True)
class Trial:
    """A region tried in the failing configurations (in order, stopping at the first
    that stays unclean)."""

    region: tuple[FunctionRef, ...]
    outcomes: tuple[Outcome, ...]

    @property
    def clean(self) -> bool:
        return all(o.clean for o in self.outcomes)

    def to_json(self) -> dict[str, Any]:
        return {"region": [r.to_json() for r in self.region], "clean": self.clean,
                "checked": [o.to_json() for o in self.outcomes]}


@dataclasses.dataclass(frozen=True)
class Suggestion:
    """A verified region: clean in every failing configuration, with its cost, what it
    fixes, and how it fares under the other configurations."""

    rank: int
    region: tuple[FunctionRef, ...]
    verification: tuple[Outcome, ...]  # the failing configurations, now clean
    current: tuple[Outcome, ...]  # the same configurations with the current region
    cross: tuple[Outcome, ...]  # the other configurations, with the region
    baseline_cross: tuple[Outcome, ...]  # the other configurations, with the current region
    uncovered: int = 0  # findings a part of the region uncovered (hidden at first), also fixed

    @property
    def eager_ops_per_step(self) -> float:
        """Averaged over the failing configurations (each one's as ``snapshot`` counts it)."""
        return round(sum(o.eager_ops_per_step for o in self.verification) / max(len(self.verification), 1), 3)

    @property
    def breaks_added(self) -> int:
        return len(self.region)

    @property
    def fixed(self) -> int:
        return sum(len(c.finding_keys - v.finding_keys) for c, v in zip(self.current, self.verification))

    def runners(self) -> dict[str, dict[str, Any]]:
        """Per runner: whether the region is safe under every mode checked, and whether
        the runner needs it (it had a failing configuration)."""
        out: dict[str, dict[str, Any]] = {}
        current = {o.label: o for o in self.current + self.baseline_cross}
        for o in self.verification + self.cross:
            runner, mode = o.label.split("/", 1)
            r = out.setdefault(runner, {"safe": True, "needs_fix": False, "modes": {}})
            r["modes"][mode] = "clean" if o.clean else ("error" if o.error else "findings")
            r["safe"] = r["safe"] and o.clean
            if not current[o.label].clean:
                r["needs_fix"] = True
        return {k: out[k] for k in sorted(out)}

    def per_runner(self) -> dict[str, Any]:
        """Whether one region for every runner will do, or the region must be chosen per
        runner (as vLLM's #52401 did): the suggested region under the runners that need
        it, the current one under the others."""
        runners = self.runners()
        unsafe_clean = sorted(r for r, v in runners.items() if not v["safe"] and not v["needs_fix"])
        use = {r: ("suggested" if v["needs_fix"] else "current") for r, v in runners.items()}
        if len(runners) < 2:
            note = "one runner checked"
        elif unsafe_clean:
            note = (f"needed: the region breaks {', '.join(unsafe_clean)}, which is clean with the current region; "
                    f"use it only under {', '.join(r for r, u in use.items() if u == 'suggested')}")
        elif all(u == "suggested" for u in use.values()):
            note = "not needed: every runner needs the region and is clean with it"
        else:
            note = (f"not needed for correctness: the region is safe under every runner; "
                    f"{', '.join(r for r, u in use.items() if u == 'current')} is already clean with the current region, "
                    "so a per-runner region keeps its eager ops lower")
        return {"needed": bool(unsafe_clean), "use": use, "note": note}

    def growth(self) -> dict[str, dict[str, Any]]:
        out = {}
        for c, v in zip(self.current, self.verification):
            before, after = c.eager_ops_per_step, v.eager_ops_per_step
            pct = None if before == 0 else round(100.0 * (after - before) / before, 1)
            out[v.label] = {"current": before, "suggested": after, "growth_percent": pct}
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "region": [r.to_json() for r in self.region],
            "breaks_added": self.breaks_added,
            "eager_ops_per_step": self.eager_ops_per_step,
            "eager_ops_by_configuration": self.growth(),
            "findings_fixed": self.fixed,
            "uncovered_findings_fixed": self.uncovered,
            "findings_before": sum(len(c.finding_keys) for c in self.current),
            "verification": [o.to_json() for o in self.verification],
            "cross_check": [o.to_json() for o in self.cross],
            "runners": self.runners(),
            "per_runner": self.per_runner(),
        }


@dataclasses.dataclass(frozen=True)
class SuggestReport:
    configurations: tuple[Outcome, ...]  # every slot with the current region
    requested: tuple[str, ...]
    failing: tuple[str, ...]
    candidates: tuple[Candidate, ...]
    skipped: tuple[tuple[str, str], ...]  # (frame, reason)
    suggestions: tuple[Suggestion, ...]
    trials: tuple[Trial, ...]
    max_candidates: int
    regions_planned: int
    decorator: BreakDecorator | None = None  # the slots' (None: there were none)

    @property
    def found(self) -> bool:
        return bool(self.suggestions)

    @property
    def top(self) -> Suggestion | None:
        return self.suggestions[0] if self.suggestions else None

    @property
    def exhausted(self) -> bool:
        return self.regions_planned > len(self.trials)

    @property
    def patch_text(self) -> str:
        """The top region as a unified diff (``patch``); empty without one."""
        if self.top is None or self.decorator is None:
            return ""
        return patch(self.top.region, self.decorator)

    def unsuccessful(self) -> list[Trial]:
        return [t for t in self.trials if not t.clean]

    def summary_line(self) -> str:
        if not self.failing:
            n = len(self.requested)
            return f"nothing to suggest: {n} configuration{'s' * (n != 1)} already clean"
        tried = f"{len(self.trials)} region{'s' * (len(self.trials) != 1)} tried"
        if self.top is None:
            more = (f"; the budget (--max-candidates {self.max_candidates}) left {self.regions_planned - len(self.trials)} "
                    "untried" if self.exhausted else "")
            return (f"no candidate makes {', '.join(self.failing)} clean ({tried}, {len(self.candidates)} "
                    f"candidate functions{more}): widen the region by hand, or fix the code the findings name")
        t = self.top
        names = " + ".join(r.qualname for r in t.region)
        return (f"{len(self.suggestions)} verified region{'s' * (len(self.suggestions) != 1)} ({tried}); best: {names}, "
                f"{t.eager_ops_per_step:g} eager ops per step, {t.breaks_added} break{'s' * (t.breaks_added != 1)} "
                f"added, fixes {t.fixed} finding{'s' * (t.fixed != 1)}")

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": "capturelint",
            "command": "suggest",
            "version": JSON_VERSION,
            "capturelint_version": __version__,
            "configurations": [{**o.to_json(), "requested": o.label in self.requested} for o in self.configurations],
            "failing": list(self.failing),
            "candidates": [c.to_json() for c in self.candidates],
            "skipped": [{"frame": f, "reason": r} for f, r in self.skipped],
            "suggestions": [s.to_json() for s in self.suggestions],
            "unsuccessful": [t.to_json() for t in self.unsuccessful()],
            "budget": {"max_candidates": self.max_candidates, "regions_planned": self.regions_planned,
                       "regions_tried": len(self.trials), "exhausted": self.exhausted},
            "summary": self.summary_line(),
        }


# ---------------------------------------------------------------- the search


def _run(slot: Slot, region: Sequence[FunctionRef]) -> tuple[Outcome, ConfigReport | None]:
    from capturelint.errors import CapturelintError

    try:
        with eager_breaks(region, slot.decorator):
            cfg = slot.check()
        return Outcome.of(slot.label, cfg), cfg
    except (CapturelintError, LookupError) as e:
        # a region can make an engine fail (a break whose return value cannot be copied
        # back): that region is no fix, and the search goes on
        return Outcome.failed(slot.label, " ".join(str(e).split())), None


def collect_candidates(failing: dict[str, ConfigReport]) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """The functions on the capture-time stacks of the failing configurations' findings,
    innermost first (the captured callable excluded), with the findings each covers."""
    order: list[tuple] = []
    refs: dict[tuple, FunctionRef] = {}
    covers: dict[tuple, list[tuple[tuple, str]]] = {}
    skipped: dict[str, str] = {}
    for label, cfg in failing.items():
        for f in cfg.findings:
            fkey = (label, trial_key(f))
            for frame in f.capture_stack[:-1]:
                ref = resolve(frame)
                if isinstance(ref, str):
                    skipped.setdefault(f"{frame.qualname or frame.function} ({frame.file})", ref)
                    continue
                if ref.key not in refs:
                    refs[ref.key] = ref
                    order.append(ref.key)
                    covers[ref.key] = []
                if fkey not in [k for k, _ in covers[ref.key]]:
                    covers[ref.key].append((fkey, describe_finding(f)))
    cands = [Candidate(refs[k], tuple(d for _, d in covers[k]), frozenset(fk for fk, _ in covers[k])) for k in order]
    # more findings covered first; among equals, the innermost (smallest) first
    cands = [c for _, c in sorted(enumerate(cands), key=lambda ic: (-len(ic[1].keys), ic[0]))]
    return cands, sorted(skipped.items())


def plan_regions(candidates: Sequence[Candidate], max_size: int = 3) -> list[tuple[Candidate, ...]]:
    """Each candidate alone, then the smallest sets of candidates that together cover
    every finding while none of them does alone (two inner functions can beat the one
    function that calls both), in candidate order."""
    regions: list[tuple[Candidate, ...]] = [(c,) for c in candidates]
    everything = frozenset().union(*(c.keys for c in candidates)) if candidates else frozenset()
    partial = [c for c in candidates if not c.keys >= everything]
    for size in range(2, max_size + 1):
        covers = [combo for combo in itertools.combinations(partial, size)
                  if frozenset().union(*(c.keys for c in combo)) >= everything]
        if covers:
            return regions + covers
    return regions


def _current(slots: Sequence[Slot], jobs: int, tick: Callable[[str], None]) -> list[tuple[Outcome, ConfigReport | None]]:
    """Each slot checked with the current region, in order: independent checks, so
    ``jobs`` at once in worker processes (reports come back without their capture
    streams, which hold the engine's storages; the search reads findings and graph maps).
    A requested configuration that fails with its own region is the user's error and is
    raised (the first in order, as serially); another is an outcome that failed."""
    def one(slot: Slot) -> tuple[Outcome, ConfigReport | None]:
        if slot.requested:
            cfg = slot.check()  # an engine that fails with its own region is the user's error
            return Outcome.of(slot.label, cfg), cfg
        return _run(slot, ())

    if jobs <= 1 or len(slots) <= 1:
        out = []
        for slot in slots:
            tick(f"{slot.label} · current region")
            out.append(one(slot))
        return out
    from capturelint.pipeline import parallel_map

    def light(slot: Slot) -> tuple[Outcome, ConfigReport | None]:
        outcome, cfg = one(slot)
        return outcome, dataclasses.replace(cfg, captures=[]) if cfg is not None else None

    return parallel_map([lambda s=s: light(s) for s in slots], jobs,
                        lambda i: tick(f"{slots[i].label} · current region"),
                        [f"{s.label} with the current region" for s in slots])


def _cross_checks(checks: Sequence[tuple[Slot, tuple[FunctionRef, ...]]], jobs: int,
                  tick: Callable[[str], None]) -> list[Outcome]:
    """The outcome of each (slot, region) check, in order. The cross-checks of the
    verified regions do not depend on each other (each builds a fresh engine with its
    region wrapped), so with ``jobs > 1`` they run in forked worker processes
    (``pipeline.parallel_map``; only the ``Outcome`` comes back) and the progress names
    each as it arrives; serially, each is named before it runs."""
    def describe(check: tuple[Slot, tuple[FunctionRef, ...]]) -> str:
        slot, region = check
        return f"{slot.label} · cross-check {' + '.join(r.qualname for r in region)}"

    if jobs <= 1 or len(checks) <= 1:
        out = []
        for check in checks:
            tick(describe(check))
            out.append(_run(*check)[0])
        return out
    from capturelint.pipeline import parallel_map

    return parallel_map([lambda c=c: _run(*c)[0] for c in checks], jobs, lambda i: tick(describe(checks[i])),
                        [describe(c) for c in checks])


def suggest(slots: Sequence[Slot], max_candidates: int = DEFAULT_MAX_CANDIDATES,
            progress: Callable[[str, int], None] | None = None, jobs: int = 1) -> SuggestReport:
    """Find, verify and rank eager regions for the failing configurations among
    ``slots`` (see the module docstring). ``progress(description, total)`` hears each run;
    ``jobs`` checks at once where they are independent: each configuration with the
    current region (``_current``), the cross-checks (``_cross_checks``); the trials stay
    in order (each stops at the first configuration it leaves unclean)."""
    total = [len(slots)]

    def tick(text: str) -> None:
        if progress is not None:
            progress(text, total[0])

    current = dict(zip((s.label for s in slots), _current(slots, jobs, tick)))
    requested = tuple(s.label for s in slots if s.requested)
    failing = {s.label: current[s.label][1] for s in slots if s.requested and not current[s.label][0].clean}
    failing_slots = [s for s in slots if s.label in failing]
    candidates, skipped = collect_candidates(failing)  # type: ignore[arg-type]
    queue: list[tuple[FunctionRef, ...]] = [tuple(c.ref for c in combo) for combo in plan_regions(candidates)]
    seen = {frozenset(r) for r in queue}
    known = {c.ref.key for c in candidates}
    extra: list[Candidate] = []
    trials: list[Trial] = []
    total[0] += len(failing_slots) * min(len(queue), max_candidates)
    while queue and len(trials) < max_candidates:
        region = queue.pop(0)
        if any(t.clean and set(t.region) <= set(region) for t in trials):
            continue  # a clean region inside it was found: this one only adds breaks
        outcomes, reports = [], []
        for slot in failing_slots:
            tick(f"{slot.label} · {' + '.join(r.qualname for r in region)}")
            o, cfg = _run(slot, region)
            outcomes.append(o)
            reports.append((slot.label, cfg))
            if not o.clean:
                break
        trial = Trial(region, tuple(outcomes))
        trials.append(trial)
        last_label, last_cfg = reports[-1]
        progressed = last_cfg is not None and not (current[last_label][0].finding_keys <= outcomes[-1].finding_keys)
        if not trial.clean and progressed and len(region) < 3:
            # It fixed findings and uncovered others (a capture-time divergence hides the
            # ones after it): try it with each function on the stacks of what remains.
            more, more_skipped = collect_candidates({last_label: last_cfg})  # type: ignore[dict-item]
            skipped = sorted(set(skipped) | set(more_skipped))
            for c in more:
                grown = tuple(sorted(set(region) | {c.ref}, key=lambda r: (region + (c.ref,)).index(r)))
                if frozenset(grown) not in seen and c.ref not in region:
                    seen.add(frozenset(grown))
                    queue.append(grown)
                    total[0] += len(failing_slots)
                if c.ref.key not in known:
                    known.add(c.ref.key)
                    extra.append(c)
    clean = [t for t in trials if t.clean]
    clean.sort(key=lambda t: (round(sum(o.eager_ops_per_step for o in t.outcomes), 3), len(t.region), t.region))
    others = [s for s in slots if s.label not in failing]
    total[0] += len(clean) * len(others)
    checks = [(slot, t.region) for t in clean for slot in others]
    crossed = _cross_checks(checks, jobs, tick)
    suggestions = []
    for rank, t in enumerate(clean, 1):
        cross = [crossed.pop(0) for _ in others]
        before = set().union(*(current[s.label][0].finding_keys for s in failing_slots))
        hidden = set().union(*(o.finding_keys for u in trials if set(u.region) < set(t.region) for o in u.outcomes))
        suggestions.append(Suggestion(rank, t.region, t.outcomes, tuple(current[s.label][0] for s in failing_slots),
                                      tuple(cross), tuple(current[s.label][0] for s in others), len(hidden - before)))
    return SuggestReport(tuple(current[s.label][0] for s in slots), requested, tuple(failing),
                         tuple(candidates) + tuple(extra), tuple(skipped), tuple(suggestions), tuple(trials),
                         max_candidates, len(trials) + len(queue), slots[0].decorator if slots else None)


# -------------------------------------------------------------------- patch


def _import_line(tree: ast.Module, name: str) -> int | None:
    """The line after which the decorator's import goes, or ``None`` when the module
    already binds the name."""
    last = 0
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name) == name for a in node.names):
                return None
            last = node.end_lineno or node.lineno
        elif isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant) and last == 0 \
                and node is tree.body[0]:
            last = node.end_lineno or node.lineno  # the module docstring
    return last


def _shown_path(source: str) -> str:
    """The patch's path of ``source``, never absolute (``git apply`` refuses ``a//abs``):

    - installed code: its import path (``vllm/models/...``: the path in the package's
      own checkout), also when the virtual environment lies below the working directory;
    - below the working directory: relative to it;
    - in a git checkout elsewhere: relative to the checkout's top (the nearest folder
      above that holds ``.git``), where ``git apply`` in that checkout takes it;
    - else relative to the folder above its top package (the nearest folders up with an
      ``__init__.py``): its import path, or its file name for a lone module.
    """
    from capturelint.runtime.frames import installed_path

    absolute = os.path.abspath(source)
    cwd = os.getcwd()
    installed = installed_path(absolute)
    if installed is not None:
        return installed.replace(os.sep, "/")
    if absolute.startswith(cwd + os.sep):
        return os.path.relpath(absolute, cwd).replace(os.sep, "/")
    folder = os.path.dirname(absolute)
    while True:
        if os.path.exists(os.path.join(folder, ".git")):
            return os.path.relpath(absolute, folder).replace(os.sep, "/")
        if os.path.dirname(folder) == folder:
            break
        folder = os.path.dirname(folder)
    top = os.path.dirname(absolute)
    while os.path.exists(os.path.join(top, "__init__.py")) and os.path.dirname(top) != top:
        top = os.path.dirname(top)
    return os.path.relpath(absolute, top).replace(os.sep, "/")


def patch(region: Sequence[FunctionRef], decorator: BreakDecorator) -> str:
    """A unified diff (``git apply``; paths as ``_shown_path`` says) that adds
    ``decorator`` directly above the ``def`` of each function of ``region``, and its
    import where the module lacks it."""
    by_file: dict[str, list[FunctionRef]] = {}
    for ref in region:
        by_file.setdefault(ref.source, []).append(ref)
    out = []
    for source in sorted(by_file):
        text = open(source, encoding="utf-8").read()
        old = text.splitlines(keepends=True)
        inserts: dict[int, list[str]] = {}  # 0-based line index -> lines inserted before it
        for ref in sorted(by_file[source], key=lambda r: r.def_line):
            inserts.setdefault(ref.def_line - 1, []).append(f"{ref.indent}@{decorator.name}\n")
        after = _import_line(ast.parse(text), decorator.name)
        if after is not None:
            inserts.setdefault(after, []).insert(0, decorator.import_line + "\n")
        new: list[str] = []
        for i, line in enumerate(old + [""]):
            new.extend(inserts.get(i, []))
            if line:
                new.append(line)
        path = _shown_path(source)
        out.extend(difflib.unified_diff(old, new, f"a/{path}", f"b/{path}"))
    return "".join(out)


__all__ = [
    "BreakDecorator", "Candidate", "FunctionRef", "Outcome", "Slot", "Suggestion", "SuggestReport", "Trial", "collect_candidates",
    "eager_breaks", "is_clean", "patch", "plan_regions", "resolve", "suggest",
]
