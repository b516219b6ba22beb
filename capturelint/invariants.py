"""Declared region invariants: the region decisions a team has made, as data, checked
as queries on the region graph (``capturelint.graph``).

A replay-equivalence check derives what must hold by running every step twice. An
invariant instead *declares* it ("under V1, attention input preparation stays eager";
"the MoE stays captured"; "at most 40 eager ops per layer"), and a capture alone is
enough to check it: ``capturelint check --static`` checks invariants without the shadow
or the eager twin.

**Printed form** (``[tool.capturelint.invariants]`` in a ``pyproject.toml``; the
``--invariants FILE`` of ``check`` and ``invariants`` reads the same tables, under
``[tool.capturelint.invariants]`` or a top-level ``[invariants]``)::

    [tool.capturelint.invariants.moe-captured]
    require = "captured"                 # eager | captured
    runners = ["v2"]                     # default: every runner
    modes = ["PIECEWISE"]                # the graph's runtime mode or the configuration's mode; default: all
    scope = "model.layers.*.ffn*"        # glob(s) on the op's module scope
    op = "aten.*mm*"                     # glob(s) on the dispatcher name (optional)
    function = "forward"                 # glob(s) on the source function that issued the op (optional)
    writes = "*kv_cache*"                # glob(s) on names of storages the op writes in place (optional)
    reads = "attn_metadata*"             # ops that read, or derive from, the value such a storage held
                                         # when the forward began (optional)
    when-context = "none"                # only captures whose forward context the adapter's probe
                                         # summarised so ("none": a profile or dummy run)
    why = "the MoE is the bulk of the step; an eager MoE costs its launch overhead on every token"

    [tool.capturelint.invariants.eager-budget]
    max-eager-ops = 40                   # instead of require: a budget per replay step
    per = "model.layers.*"               # per module matching this glob (default: the whole step)

    [tool.capturelint.invariants.dsv4-sparse-attention-eager]
    enabled = false                      # drop an invariant in force by default

An invariant with several selectors lists them as ``select = [{scope = ...}, {scope =
..., function = ...}]``: an op is selected when it matches any of them, and matches one
when it matches every field that selector sets. Globs are ``fnmatch`` patterns,
case-sensitive. An invariant of a later source replaces an earlier one with the same
id: adapter defaults, then the settings file, then the command line.

**What is checked, per captured graph whose runner and mode the invariant names:**
``require = "eager"``: every selected op ran in an eager break (CL201);
``require = "captured"``: every selected op ran in a captured segment (CL202);
``max-eager-ops = N``: at most N selected ops ran in eager breaks, per ``per`` group
(CL203). An invariant that applies to a graph but selects no op in any of them is a
warning (``check --strict``: an error): its selector probably does not say what was
meant; ``capturelint invariants --explain ID`` shows what it selects.

This module parses without torch (settings and ``capturelint rules`` read it); the
graph queries import ``capturelint.graph`` when they run.
"""

from __future__ import annotations

import dataclasses
import enum
import fnmatch
import re
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from capturelint.errors import CapturelintError
from capturelint.inputs import InputProblem, load_toml
from capturelint.options import CUDAGraphMode, Runner

if TYPE_CHECKING:
    import networkx as nx

    from capturelint.graph import OpNode

InvariantId = str

KNOWN_RUNNERS = tuple(r.value for r in Runner)
KNOWN_MODES = tuple(m.value for m in CUDAGraphMode)  # the configuration modes and the graphs' runtime modes
_ID = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_SELECTOR_KEYS = ("scope", "op", "function", "writes", "reads")
_KEYS = ("require", "max-eager-ops", "per", "runners", "modes", "when-context", "why", "select", "enabled") + _SELECTOR_KEYS


class Requirement(enum.Enum):
    """What an invariant requires of the ops it selects."""

    EAGER = "eager"  # every selected op runs in an eager break
    CAPTURED = "captured"  # every selected op runs in a captured segment
    BUDGET = "budget"  # at most max_eager_ops selected ops run eagerly per step (per group)

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class Selector:
    """Which ops: every field set must match (an empty field matches anything)."""

    scope: tuple[str, ...] = ()
    op: tuple[str, ...] = ()
    function: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()

    def describe(self) -> str:
        """``scope ~ model.layers.*.attn & function ~ _prepare_and_attn``."""
        parts = [f"{key} ~ {'|'.join(getattr(self, key))}" for key in _SELECTOR_KEYS if getattr(self, key)]
        return " & ".join(parts) or "every op"

    def to_toml(self) -> dict[str, Any]:
        return {k: list(getattr(self, k)) if len(getattr(self, k)) != 1 else getattr(self, k)[0]
                for k in _SELECTOR_KEYS if getattr(self, k)}


@dataclasses.dataclass(frozen=True)
class Invariant:
    """One declared invariant (see the module docstring for each field's meaning).
    ``source`` says where it comes from: ``default``, the settings file, or the command
    line."""

    id: InvariantId
    requirement: Requirement
    selectors: tuple[Selector, ...]
    runners: tuple[str, ...] = ()
    modes: tuple[str, ...] = ()
    when_context: str | None = None
    max_eager_ops: int | None = None
    per: str | None = None
    why: str = ""
    source: str = "default"
    enabled: bool = True

    def applies(self, runner: str, mode: str, runtime_mode: str, context_key: str) -> bool:
        """Whether a graph of ``runner`` and configuration ``mode``, captured in
        ``runtime_mode`` with a forward context summarised as ``context_key``, is held to it."""
        if self.runners and runner not in self.runners:
            return False
        if self.modes and mode not in self.modes and runtime_mode not in self.modes:
            return False
        return self.when_context is None or context_key == self.when_context

    def select_ops(self, G: nx.MultiDiGraph) -> list[OpNode]:
        """The op nodes of region graph ``G`` the invariant selects, in execution order."""
        from capturelint import graph as rg

        chosen: set[OpNode] = set()
        for sel in self.selectors:
            chosen.update(rg.find_ops(G, op=sel.op or None, scope=sel.scope or None, function=sel.function or None,
                                      writes=sel.writes or None, reads=sel.reads or None))
        return sorted(chosen, key=lambda n: n[1])

    def query(self) -> str:
        """The graph query in words, for ``capturelint invariants --explain``."""
        selects = " | ".join(f"find_ops(G, {s.describe()})" for s in self.selectors)
        if self.requirement is Requirement.BUDGET:
            per = f"per module matching {self.per}" if self.per else "in the whole step"
            check = f"count(segment_kind == eager) <= {self.max_eager_ops} {per}"
        else:
            check = f"every op has segment_kind == {self.requirement}"
        return f"{selects}  =>  {check}"

    def requirement_text(self) -> str:
        if self.requirement is Requirement.BUDGET:
            return f"at most {self.max_eager_ops} eager ops per step" + (f" per {self.per}" if self.per else "")
        return f"must be {self.requirement}"

    def scope_text(self) -> str:
        runners = ", ".join(self.runners) or "every runner"
        modes = ", ".join(self.modes) or "every mode"
        context = f", forward context '{self.when_context}'" if self.when_context else ""
        return f"{runners}; {modes}{context}"


# ----------------------------------------------------------------------- parsing


def _pattern_problem(value: str) -> str | None:
    if not value:
        return "is empty"
    if any(c.isspace() for c in value):
        return "contains white space"
    depth = 0
    for c in value:
        if c == "[":
            depth += 1
        elif c == "]" and depth:
            depth -= 1
    if depth:
        return "has an unclosed '['"
    return None


class _InvariantReader:
    def __init__(self, file: str, where: str, inv_id: str, table: dict[str, Any]):
        self.file = file
        self.where = where
        self.id = inv_id
        self.table = table

    def error(self, key: str | None, text: str) -> CapturelintError:
        at = f"{self.file}: [{self.where}.{self.id}]" + (f" {key}" if key else "")
        return CapturelintError(f"{at} {text}")

    def strings(self, key: str, value: Any, example: str) -> tuple[str, ...]:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items or not all(isinstance(v, str) for v in items):
            raise self.error(key, f"must be a string or a non-empty list of strings; write for example {key} = {example}")
        return tuple(items)

    def patterns(self, key: str, value: Any, example: str) -> tuple[str, ...]:
        items = self.strings(key, value, example)
        for p in items:
            problem = _pattern_problem(p)
            if problem is not None:
                raise self.error(key, f"has the pattern {p!r}, which {problem}; write a glob such as {example}")
        return items

    def selector(self, table: dict[str, Any], key: str) -> Selector:
        for k in table:
            if k not in _SELECTOR_KEYS:
                raise self.error(key, f"has unknown key '{k}'; a selector has {', '.join(_SELECTOR_KEYS)}")
        examples = {"scope": '"model.layers.*.attn"', "op": '"aten.mm*"', "function": '"forward"', "writes": '"*kv_cache*"',
                    "reads": '"attn_metadata*"'}
        fields = {k: self.patterns(f"{key}.{k}" if key else k, table[k], examples[k]) for k in _SELECTOR_KEYS if k in table}
        if not fields:
            raise self.error(key, f"selects every op; give at least one of {', '.join(_SELECTOR_KEYS)}")
        return Selector(**fields)

    def choices(self, key: str, known: tuple[str, ...], normalise: Any) -> tuple[str, ...]:
        items = self.strings(key, self.table[key], f'["{known[0]}"]')
        out = []
        for item in items:
            if normalise(item) not in known:
                raise self.error(key, f"has unknown entry {item!r}; use {', '.join(known)}")
            out.append(normalise(item))
        return tuple(dict.fromkeys(out))


def parse_invariant(file: str, where: str, inv_id: Any, table: Any, source: str) -> Invariant:
    """One invariant from its TOML table; errors name ``file`` and the table ``where``
    (``tool.capturelint.invariants``) and the key."""
    if not isinstance(inv_id, str) or not _ID.match(inv_id):
        raise CapturelintError(
            f"{file}: [{where}] has the invariant id {inv_id!r}; ids are lower-case letters, digits, '-', '_' and "
            "'.', e.g. moe-captured"
        )
    r = _InvariantReader(file, where, inv_id, table)
    if not isinstance(table, dict):
        raise r.error(None, f"must be a table, got {type(table).__name__}; write [{where}.{inv_id}] with require and scope")
    for key in table:
        if key not in _KEYS:
            raise r.error(None, f"has unknown key '{key}'; known keys: {', '.join(sorted(_KEYS))}")
    enabled = table.get("enabled", True)
    if not isinstance(enabled, bool):
        raise r.error("enabled", "must be true or false; write for example enabled = false")
    if not enabled:
        return Invariant(inv_id, Requirement.EAGER, (), source=source, enabled=False)
    require = table.get("require")
    budget = table.get("max-eager-ops")
    if (require is None) == (budget is None):
        raise r.error(None, 'needs exactly one of require ("eager" or "captured") and max-eager-ops (a count)')
    max_eager = None
    if budget is not None:
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise r.error("max-eager-ops", "must be a whole number >= 0; write for example max-eager-ops = 40")
        requirement, max_eager = Requirement.BUDGET, budget
    else:
        if not isinstance(require, str) or require.lower() not in ("eager", "captured"):
            raise r.error("require", 'must be "eager" or "captured"; write for example require = "eager"')
        requirement = Requirement(require.lower())
    per = None
    if "per" in table:
        if requirement is not Requirement.BUDGET:
            raise r.error("per", "groups an eager-op budget; use it with max-eager-ops, or remove it")
        per = r.patterns("per", table["per"], '"model.layers.*"')
        if len(per) != 1:
            raise r.error("per", 'must be one glob; write for example per = "model.layers.*"')
        per = per[0]
    if "select" in table:
        if any(k in table for k in _SELECTOR_KEYS):
            raise r.error("select", f"and {', '.join(k for k in _SELECTOR_KEYS if k in table)} both select ops; "
                                    "move them into the select list")
        items = table["select"]
        if not isinstance(items, list) or not items or not all(isinstance(t, dict) for t in items):
            raise r.error("select", 'must be a non-empty list of tables; write for example select = [{scope = "model.layers.*.ffn*"}]')
        selectors = tuple(r.selector(t, "select") for t in items)
    elif any(k in table for k in _SELECTOR_KEYS):
        selectors = (r.selector({k: table[k] for k in _SELECTOR_KEYS if k in table}, ""),)
    elif requirement is Requirement.BUDGET:
        selectors = (Selector(scope=("*",)),)
    else:
        raise r.error(None, 'selects no op; give scope (a glob on module scopes, e.g. "model.layers.*.ffn*"), op, '
                            "function, writes or select")
    runners = r.choices("runners", KNOWN_RUNNERS, str.lower) if "runners" in table else ()
    modes = r.choices("modes", KNOWN_MODES, str.upper) if "modes" in table else ()
    when = table.get("when-context")
    if when is not None and (not isinstance(when, str) or not when):
        raise r.error("when-context", 'must be a context key such as "none" (a profile or dummy run) or "metadata"')
    why = table.get("why", "")
    if not isinstance(why, str):
        raise r.error("why", 'must be a string; write for example why = "the MoE must stay captured"')
    return Invariant(inv_id, requirement, selectors, runners, modes, when, max_eager, per, why.strip(), source)


def parse_invariants(file: str, where: str, table: Any, source: str) -> tuple[Invariant, ...]:
    """Every invariant of an ``invariants`` table (one sub-table per id)."""
    if not isinstance(table, dict):
        raise CapturelintError(f"{file}: [{where}] must be a table of invariants, one [{where}.ID] per invariant")
    return tuple(parse_invariant(file, where, k, v, source) for k, v in table.items())


def shipped_defaults(text: str, file: str) -> tuple[Invariant, ...]:
    """An adapter's default invariants, written in ``file`` as the TOML ``text`` of a
    ``[tool.capturelint.invariants]`` table (as a project writes them), with source
    ``default``."""
    import tomllib

    table = tomllib.loads(text)["tool"]["capturelint"]["invariants"]
    return parse_invariants(file, "tool.capturelint.invariants", table, "default")


def read_invariants_file(path: str) -> tuple[Invariant, ...]:
    """The invariants of a TOML file named on the command line (``--invariants FILE``):
    its ``[tool.capturelint.invariants]`` or top-level ``[invariants]`` tables."""
    try:
        doc = load_toml(path)
    except InputProblem as e:
        fix = {
            "missing": "--invariants takes a TOML file with [invariants.ID] tables",
            "syntax": "fix the file",
            "nested": "an invariants table is a few levels deep: fix the file",
        }.get(e.kind, "--invariants takes a UTF-8 TOML file")
        raise CapturelintError(f"{path}: {e.state}; {fix}") from None
    tool = doc.get("tool", {}).get("capturelint", {}) if isinstance(doc.get("tool"), dict) else {}
    if isinstance(tool, dict) and "invariants" in tool:
        return parse_invariants(path, "tool.capturelint.invariants", tool["invariants"], f"command line ({path})")
    if "invariants" in doc:
        return parse_invariants(path, "invariants", doc["invariants"], f"command line ({path})")
    raise CapturelintError(f"{path}: no [invariants] or [tool.capturelint.invariants] table; add [invariants.ID] tables")


def in_force(*layers: Iterable[Invariant]) -> tuple[Invariant, ...]:
    """The invariants in force: later layers replace earlier ones by id (defaults, then
    settings, then command line); ``enabled = false`` drops one. Sorted by id.

    ``enabled = false`` for an id that no earlier layer declares is an error naming the
    ids there are: a misspelt id would otherwise drop nothing, silently."""
    by_id: dict[str, Invariant] = {}
    for layer in layers:
        for inv in layer:
            if not inv.enabled and inv.id not in by_id:
                known = ", ".join(sorted(by_id)) or "none"
                raise CapturelintError(
                    f"{inv.source}: invariant {inv.id} has enabled = false, but no invariant {inv.id} is declared before "
                    f"it to disable (known ids: {known}); correct the id, or remove its table"
                )
            by_id[inv.id] = inv
    return tuple(sorted((i for i in by_id.values() if i.enabled), key=lambda i: i.id))


# -------------------------------------------------------------------- evaluation


@dataclasses.dataclass(frozen=True)
class Violation:
    """Ops of one capture that break one invariant: one finding's worth.

    ``ops`` are op indices in execution order; ``group`` is the module instance they
    belong to (the scope up to its first numbered part, ``model.layers.3``) for
    placement, or the budget's group; ``first`` is the op whose source line the
    finding points at (the first violating op)."""

    invariant: Invariant
    segment: int | None
    group: str
    ops: tuple[int, ...]
    first: int
    count: int = 0  # budget: eager ops counted


def instance_of(scope: str) -> str:
    """``model.layers.3.attn.wq_b`` -> ``model.layers.3``: the scope up to its first
    numbered part (a ModuleList entry: a layer); the whole scope when it has none."""
    parts = scope.split(".")
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return scope


def group_of(scope: str, pattern: str) -> str | None:
    """The shortest dotted prefix of ``scope`` that matches ``pattern`` (``None``: none)."""
    parts = scope.split(".")
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        if fnmatch.fnmatchcase(prefix, pattern):
            return prefix
    return None


def violations(inv: Invariant, G: nx.MultiDiGraph, selected: Sequence[OpNode] | None = None) -> list[Violation]:
    """The violations of ``inv`` in region graph ``G`` (which it applies to)."""
    from capturelint.runtime.protocol import SegmentKind

    nodes = inv.select_ops(G) if selected is None else list(selected)
    attrs = G.nodes
    if inv.requirement is Requirement.BUDGET:
        groups: dict[str, list[int]] = defaultdict(list)
        for n in nodes:
            d = attrs[n]
            if d["segment_kind"] is not SegmentKind.EAGER:
                continue
            group = group_of(d["scope"], inv.per) if inv.per else ""
            if group is not None:
                groups[group].append(n[1])
        limit = inv.max_eager_ops or 0
        return [Violation(inv, None, g, tuple(ops), ops[limit], len(ops)) for g, ops in sorted(groups.items())
                if len(ops) > limit]
    wrong = SegmentKind.CAPTURED if inv.requirement is Requirement.EAGER else SegmentKind.EAGER
    found: dict[tuple[int, str], list[int]] = defaultdict(list)
    for n in nodes:
        d = attrs[n]
        if d["segment_kind"] is wrong:
            found[(d["segment"], instance_of(d["scope"]))].append(n[1])
    return [Violation(inv, seg, group, tuple(ops), ops[0]) for (seg, group), ops in sorted(found.items(), key=lambda kv: kv[1][0])]


def explain_selection(inv: Invariant, config: Any) -> dict[str, Any]:
    """What ``inv`` selects in one configuration's captures (a ``ConfigReport`` that kept
    them), for ``capturelint invariants --explain``: per graph it applies to, the selected
    ops by scope, op and placement (``captured`` or ``eager``) with counts; graphs with
    the same selection share an entry (listed by the first)."""
    from collections import Counter

    from capturelint.graph import build_region_graph
    from capturelint.runtime.protocol import SegmentKind

    graphs = []
    seen: dict[tuple, dict[str, Any]] = {}
    for capture in config.captures:
        if not inv.applies(config.runner, config.mode, capture.runtime_mode, capture.context.key):
            continue
        G = build_region_graph(capture)
        counts: Counter = Counter()
        for n in inv.select_ops(G):
            d = G.nodes[n]
            where = "eager" if d["segment_kind"] is SegmentKind.EAGER else "captured"
            counts[(d["scope"] or "<top>", d["op"], where)] += 1
        key = tuple(sorted(counts.items()))
        if key in seen:
            seen[key]["graphs"].append(capture.graph)
            continue
        entry = {"graphs": [capture.graph], "runtime_mode": capture.runtime_mode, "selected": sum(counts.values()),
                 "ops": [{"scope": s, "op": o, "placement": p, "count": c} for (s, o, p), c in sorted(counts.items())]}
        seen[key] = entry
        graphs.append(entry)
    return {"runner": config.runner, "mode": config.mode, "eager_region": config.eager_region,
            "applies": bool(graphs), "selections": graphs}


__all__ = [
    "Invariant", "Requirement", "Selector", "Violation", "explain_selection", "group_of", "in_force", "instance_of",
    "parse_invariant",
    "parse_invariants", "read_invariants_file", "shipped_defaults", "violations",
]
