"""The check report: the records every output format renders, and their JSON form.

JSON is byte-deterministic for a given command: sorted keys, no addresses, no
timestamps, floats rounded. ``findings`` lists one entry per *problem*
(``capturelint.findings.group_findings``; ``Report.groups``; format version 2): its
first finding's fields, its ``group`` id, its ``count`` of findings and, for several,
``members``, each other finding as the fields in which it differs from the first (a
break handed one stale metadata object is one entry with a count, not one per tensor
inside it); ``summary`` counts findings and ``problems``; ``Report.from_json`` reads
each finding back. ``suppressed`` lists the waived findings one by one. The other
formats are reporters (``capturelint.reporters``): the Rich form
(``capturelint.render.check``) prints the ``verdict_line``, one entry per group and
the one-line summary, and with ``--verbose`` every finding's evidence grouped by runner
and mode.

**The summary tells the truth.** "replay matches eager execution" is said only when no
finding was reported, every configuration compared its replays with eager execution
(``Checked.with_eager``: every replay step shadowed, or an eager twin) and every
numerical oracle agrees. A configuration that compared nothing (a bare CUDA graph has
no shadow, and no eager twin was given) is named with what it did check: "structural
rules only, replay NOT compared with eager". With the rules that would report a
divergence deselected, the summary says that replay differs and where, even though the
exit status (what the user asked for) stays 0.

**Suppressed and accepted findings** (``capturelint.waivers``) leave a configuration's
``findings`` for its ``waived`` list: they do not fail the check, every format counts
them, and the JSON lists them under ``suppressed`` (each finding with its
``suppression``: ``inline`` at a comment, or ``accepted`` in the file). A configuration
with waived findings is never said to match eager execution. The findings about the
comments themselves (CL902, CL903) belong to no configuration: ``suppression_findings``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

from typing import TYPE_CHECKING

from capturelint import __version__
from capturelint.findings import Finding, FindingGroup, Numerical, group_findings, problem_findings
from capturelint.lists import cut
from capturelint.regions import GraphMap
from capturelint.shard import ShardInfo
from capturelint.waivers import AcceptedEntry, Waived, WaiverKind, Waivers

if TYPE_CHECKING:
    from capturelint.records import Stream
    from capturelint.runtime.protocol import Frame

JSON_VERSION = 2


@dataclasses.dataclass(frozen=True)
class Checked:
    """What the check of one configuration looked at: the structural rules that had
    something to check (``rules``) and those selected that had nothing
    (``unchecked_rules``: the step rules without a shadowed step, the invariant rules
    without an invariant that applies), the replay steps compared with their eager
    shadow, the replays of bare graphs (no Python re-runs on their replay, so no
    shadow: only their freed inputs are checked), and whether an eager twin's output
    was compared with the run's. The numerical oracle's own rule (CL901) is in neither
    list: the counts and the twin say what it compared. ``exercised`` says what those
    steps were, so that a reviewer knows what "matches" covers: the engine's steps as it
    ran them where its adapter describes them (the bundled engine: ``prefill: 7 tokens
    (eager)``, ``decode: 2, 3->4 x3 tokens (replayed FULL)``: sizes in tokens,
    ``real->padded`` where padded to a captured size, ``xN`` steps of that size), else the
    graphs replayed with a shadow and how often (``replayed decode/4 x3``). Printed form
    (Rich)::

        checked: rules CL104, CL106; 3 bare-graph replays, not shadowed; no eager twin
    """

    rules: tuple[str, ...] = ()
    unchecked_rules: tuple[str, ...] = ()
    shadowed_steps: int = 0
    bare_replays: int = 0
    eager_twin: bool = False
    exercised: tuple[str, ...] = ()
    unchecked_graphs: tuple[str, ...] = ()  # runtimes that captured CUDA graphs on their own, and where

    @property
    def with_eager(self) -> bool:
        """Whether replay was compared with eager execution: the run's output with an
        eager twin's, or every replay step with its shadow; never where a runtime
        captured graphs capturelint did not see (``unchecked_graphs``)."""
        return (self.eager_twin or (self.shadowed_steps > 0 and self.bare_replays == 0)) and not self.unchecked_graphs

    @property
    def replayed(self) -> bool:
        return self.shadowed_steps + self.bare_replays > 0

    def not_compared(self) -> str:
        """Why replay was not compared with eager (for a configuration not ``with_eager``)."""
        if not self.replayed:
            return "no replay ran"
        if self.unchecked_graphs:
            return f"graphs of {_count(len(self.unchecked_graphs), 'self-capturing call')} not checked"
        if self.shadowed_steps:
            return f"{_count(self.bare_replays, 'bare-graph replay')} not shadowed, no eager twin given"
        return "bare graph, no eager twin given"

    def describe(self) -> str:
        """``rules CL104, CL106; 3 bare-graph replays, not shadowed; no eager twin``."""
        parts = [f"rules {code_ranges(self.rules)}" if self.rules else "no structural rule"]
        if self.shadowed_steps:
            parts.append(f"{_count(self.shadowed_steps, 'replay step')} shadowed")
        if self.bare_replays:
            parts.append(f"{_count(self.bare_replays, 'bare-graph replay')}, not shadowed")
        if not self.replayed:
            parts.append("no replay")
        parts.append("eager twin compared" if self.eager_twin else "no eager twin")
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "rules": list(self.rules),
            "unchecked_rules": list(self.unchecked_rules),
            "shadowed_steps": self.shadowed_steps,
            "bare_replays": self.bare_replays,
            "eager_twin": self.eager_twin,
            "exercised": list(self.exercised),
        } | ({"unchecked_graphs": list(self.unchecked_graphs)} if self.unchecked_graphs else {})

    def exercised_text(self) -> str:
        """``prefill: 7 tokens (eager); decode: 2 x3 tokens (replayed FULL)``; empty when
        nothing was described."""
        return "; ".join(self.exercised)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Checked:
        return cls(tuple(doc["rules"]), tuple(doc["unchecked_rules"]), doc["shadowed_steps"], doc["bare_replays"],
                   doc["eager_twin"], tuple(doc.get("exercised", ())), tuple(doc.get("unchecked_graphs", ())))


@dataclasses.dataclass
class ConfigReport:
    """One runner and mode: its findings, numerical oracle (``None`` where nothing was
    compared), captured graphs, and what its check looked at (``checked``)."""

    runner: str
    mode: str
    eager_region: str
    findings: list[Finding]
    numerical: Numerical | None
    graphs: list[GraphMap]
    captures: list[Stream] = dataclasses.field(default_factory=list, repr=False)
    note: str | None = None
    eager_region_option: str | None = None  # what was asked (per-runner), when not the region in effect
    invariant_selected: dict[str, int] = dataclasses.field(default_factory=dict)  # applied invariants: ops selected
    static: bool = False  # captures only: replay equivalence was not checked
    checked: Checked = Checked()  # what the check looked at and compared
    waived: list[Waived] = dataclasses.field(default_factory=list)  # findings suppressed or accepted
    traced: tuple[Frame, ...] = dataclasses.field(default=(), repr=False)  # a frame per file its captures ran
    target: str | None = None  # a user's target: the source it came from (capturelint.adapters.plain.target.Source.name)

    @property
    def label(self) -> str:
        return f"{self.runner}/{self.mode}"

    @property
    def region_title(self) -> str:
        """``narrow``, or ``per-runner (wide under v1)`` when asked per runner."""
        option = self.eager_region_option
        if option and option != self.eager_region:
            return f"{option} ({self.eager_region} under {self.runner})"
        return self.eager_region

    @property
    def diverged(self) -> bool:
        return self.numerical is not None and self.numerical.diverged

    def to_json(self) -> dict[str, Any]:
        return {
            "runner": self.runner,
            "mode": self.mode,
            "eager_region": self.eager_region,
            "findings": len(self.findings),
            "graphs": [g.to_json() for g in sorted(self.graphs, key=graph_order)],
            "note": self.note,
            "checked": self.checked.to_json(),
            **({"suppressed": len(self.waived)} if self.waived else {}),
            **({"target": self.target} if self.target is not None else {}),
        }

    def unchecked_text(self) -> str | None:
        """For a configuration whose replay was not compared with eager execution, what
        that leaves unchecked and how to compare it; ``None`` when it was compared (or
        nothing replayed: its note says why)."""
        c = self.checked
        if c.with_eager or not c.replayed or self.static:
            return None
        skipped = f"; rules with nothing to check: {code_ranges(c.unchecked_rules)}" if c.unchecked_rules else ""
        return (f"replay NOT compared with eager ({c.not_compared()}): a replay that computes other values than eager "
                f"execution goes unseen unless a rule checked names its cause{skipped}; give an eager twin (a Target's "
                "eager=) for a numerical comparison (--require-oracle makes its absence an error)")


@dataclasses.dataclass(frozen=True)
class InvariantRecord:
    """A declared invariant as a report lists it (read back from a JSON report): what
    ``Report.to_json`` needs of a ``capturelint.invariants.Invariant``."""

    id: str
    source: str
    requires: str
    applies_to: str

    def requirement_text(self) -> str:
        return self.requires

    def scope_text(self) -> str:
        return self.applies_to


@dataclasses.dataclass(repr=False)
class Report:
    configs: list[ConfigReport]
    region_changes: Any = None  # filled by the gate (capturelint.snapshot)
    invariants: tuple[Any, ...] = ()  # the declared invariants in force (capturelint.invariants.Invariant)
    static: bool = False  # check --static: captures only, replay equivalence not checked
    shard: ShardInfo | None = None  # check --shard K/N: which shard of which plan (capturelint.shard)
    waivers: Waivers | None = None  # the suppression comments and accepted findings (capturelint.waivers)
    suppression_findings: list[Finding] = dataclasses.field(default_factory=list)  # CL902, CL903: of no configuration
    subject: dict[str, Any] | None = None  # what was checked: {"engine": "bundled"}, {"targets": [...]} (subject_text)

    def __repr__(self) -> str:
        """The summary line, not every record (a test's failed ``assert`` prints it)."""
        return f"<Report: {self.summary_line()}>"

    def subject_text(self) -> str | None:
        """What was checked, in words: ``engine bundled``, ``targets tests/t.py:targets``,
        ``script x.py`` (``None``: not known, a report read back without it)."""
        return subject_text(self.subject)

    def invariant_selection(self) -> dict[str, int | None]:
        """Per invariant in force: the ops it selected over every capture it applied to
        (``None``: it applied to no capture of these configurations)."""
        out: dict[str, int | None] = {inv.id: None for inv in self.invariants}
        for c in self.configs:
            for inv_id, n in c.invariant_selected.items():
                out[inv_id] = (out.get(inv_id) or 0) + n
        return out

    @property
    def empty_invariants(self) -> list[str]:
        """Invariants that applied to captures here but selected no op in any: their
        selector probably does not say what was meant (a warning; ``--strict``: an error)."""
        return [i for i, n in self.invariant_selection().items() if n == 0]

    @property
    def findings(self) -> list[Finding]:
        """The findings that fail the check: the configurations' and the suppression
        comments' (CL902, CL903)."""
        out: list[Finding] = list(self.suppression_findings)
        for c in self.configs:
            out.extend(c.findings)
        return sorted(out, key=Finding.sort_key)

    @property
    def waived(self) -> list[Waived]:
        """The findings suppressed inline or accepted, in ``Finding.sort_key`` order."""
        out: list[Waived] = []
        for c in self.configs:
            out.extend(c.waived)
        return sorted(out, key=lambda w: w.finding.sort_key())

    def waived_counts(self) -> tuple[int, int]:
        """How many findings were suppressed inline, and how many accepted."""
        kinds = [w.kind for w in self.waived]
        return kinds.count(WaiverKind.INLINE), kinds.count(WaiverKind.ACCEPTED)

    @property
    def judged(self) -> bool:
        """Whether this report may call a suppression unused or an accepted finding gone
        (``capturelint.waivers``): a whole check, and no shard of one."""
        return self.waivers is not None and self.waivers.whole and self.shard is None and not self.static

    def checked_codes(self) -> set[str]:
        """The rules that had something to check in some configuration (the numerical
        oracle's when some configuration compared numbers)."""
        codes = {code for c in self.configs for code in c.checked.rules}
        if any(c.numerical is not None for c in self.configs):
            codes.add("CL901")
        return codes

    def stale_accepted(self) -> tuple[AcceptedEntry, ...]:
        """Accepted findings that no longer occur (only a report that ``judged`` says)."""
        return self.waivers.stale(self.judged, self.checked_codes()) if self.waivers is not None else ()

    def waived_text(self) -> str:
        """``2 findings suppressed, 3 accepted`` (empty when none)."""
        inline, accepted = self.waived_counts()
        parts = [f"{_count(inline, 'finding')} suppressed"] if inline else []
        if accepted:
            parts.append(f"{accepted} accepted" if parts else f"{_count(accepted, 'finding')} accepted")
        return ", ".join(parts)

    @property
    def groups(self) -> list[FindingGroup]:
        """The findings grouped by cause (``capturelint.findings.group_findings``): one
        entry per problem, as the terminal report and ``assert_clean`` print them."""
        return group_findings(self.findings)

    @property
    def failed(self) -> bool:
        return bool(self.findings) or bool(self.region_changes is not None and self.region_changes.failed)

    @property
    def diverged(self) -> list[ConfigReport]:
        """Configurations whose replay computed something else than eager execution."""
        return [c for c in self.configs if c.diverged]

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "tool": "capturelint",
            "version": JSON_VERSION,
            "capturelint_version": __version__,
            "findings": [g.to_json() for g in self.groups],
            "suppressed": [w.to_json() for w in self.waived],
            "numerical": [c.numerical.to_json() for c in self.configs if c.numerical is not None],
            "configurations": [c.to_json() for c in self.configs],
            "summary": self.summary_json(),
        }
        if self.region_changes is not None:
            doc["region_changes"] = self.region_changes.to_json()
        if self.invariants:
            selection = self.invariant_selection()
            doc["invariants"] = [
                {"id": inv.id, "source": inv.source, "requires": inv.requirement_text(), "applies_to": inv.scope_text(),
                 "selected_ops": selection.get(inv.id)}
                for inv in self.invariants
            ]
        if self.static:
            doc["static"] = True
        if self.shard is not None:
            doc["shard"] = self.shard.to_json()
        if self.subject is not None:
            doc["subject"] = self.subject
        if self.waivers is not None and not self.waivers.empty:
            doc["waivers"] = {**self.waivers.to_json(), "no_longer_occur": [e.to_json() for e in self.stale_accepted()]}
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Report:
        """The report ``to_json`` wrote, for ``capturelint merge``:
        ``Report.from_json(d).to_json() == d`` for the reports of this capturelint version.

        What the JSON does not hold is not restored: capture streams, the engine stack of
        each finding, the eager region asked for (``per-runner``; titles show the region
        in effect) and the baseline gate's region changes (a ``ValueError``). Findings and
        numerical results are given back to their configuration by runner and mode, in
        order; the invariants' selected-op totals are kept on the first configuration,
        since only the totals are in the JSON."""
        if "region_changes" in doc:
            raise ValueError("a report with the baseline gate's region_changes cannot be read back")
        static = bool(doc.get("static", False))
        configs = []
        for c in doc["configurations"]:
            configs.append(ConfigReport(c["runner"], c["mode"], c["eager_region"], [], None,
                                        [GraphMap.from_json(g) for g in c["graphs"]], note=c["note"], static=static,
                                        checked=Checked.from_json(c["checked"]), target=c.get("target")))
        # findings: sorted over the whole report; each configuration says how many are its own
        findings = sorted((f for p in doc["findings"] for f in problem_findings(p)), key=Finding.sort_key)
        # a suppression comment's findings (CL902, CL903) are of no configuration
        suppression_findings = [f for f in findings if not f.runner and not f.mode]
        _give_back(configs, [f for f in findings if f.runner or f.mode], lambda f: f,
                   [c_doc["findings"] for c_doc in doc["configurations"]], lambda c: c.findings, "finding")
        _give_back(configs, [Waived.from_json(w) for w in doc.get("suppressed", ())], lambda w: w.finding,
                   [c_doc.get("suppressed", 0) for c_doc in doc["configurations"]], lambda c: c.waived,
                   "suppressed finding")
        start = 0  # numerical results are listed in configuration order
        for n in (Numerical.from_json(n) for n in doc["numerical"]):
            at = next((i for i in range(start, len(configs)) if (configs[i].runner, configs[i].mode) == (n.runner, n.mode)),
                      None)
            if at is None:
                raise ValueError(f"numerical result of {n.runner}/{n.mode} has no configuration to belong to")
            configs[at].numerical = n
            start = at + 1
        invariants = []
        for inv in doc.get("invariants", ()):
            invariants.append(InvariantRecord(inv["id"], inv["source"], inv["requires"], inv["applies_to"]))
            if inv["selected_ops"] is not None:
                if not configs:
                    raise ValueError(f"invariant {inv['id']} selected ops in a report of no configuration")
                configs[0].invariant_selected[inv["id"]] = inv["selected_ops"]
        shard = ShardInfo.from_json(doc["shard"]) if "shard" in doc else None
        waivers = Waivers.from_json(doc["waivers"]) if "waivers" in doc else None
        return cls(configs, invariants=tuple(invariants), static=static, shard=shard, waivers=waivers,
                   suppression_findings=suppression_findings, subject=doc.get("subject"))

    def summary_json(self) -> dict[str, Any]:
        by_code: dict[str, int] = {}
        for f in self.findings:
            by_code[f.code] = by_code.get(f.code, 0) + 1
        inline, accepted = self.waived_counts()
        return {
            "findings": len(self.findings),
            "problems": len(self.groups),
            "by_code": dict(sorted(by_code.items())),
            "suppressed": inline,
            "accepted": accepted,
            "configurations": len(self.configs),
            "diverged": [c.label for c in self.diverged],
            "not_compared": [c.label for c in self.not_compared],
        }

    @property
    def not_compared(self) -> list[ConfigReport]:
        """Configurations that replayed graphs without comparing them with eager
        execution (``Checked.with_eager``); a static check compares none by design."""
        return [] if self.static else [c for c in self.configs if c.checked.replayed and not c.checked.with_eager]

    def oracle_missing(self, asked_by: str) -> str | None:
        """The one-line error of ``--require-oracle`` (``asked_by`` names the flag or the
        setting): which configurations replayed without comparing with eager execution,
        and how to give them a comparison; ``None`` when every one compared."""
        missing = self.not_compared
        if not missing:
            return None
        where = cut([f"{c.label} ({c.checked.not_compared()})" for c in missing])
        return (f"{asked_by} asks for replay compared with eager execution, and {where} replayed graphs without it, so "
                "the check has no numbers there; give each such Target an eager twin, eager=FUNCTION running the same "
                "workload without CUDA graphs and returning the output to compare (capturelint.target.Target)")

    def assert_clean(self) -> None:
        """Raise ``AssertionError`` when the check ``failed`` (findings, or region growth
        over the baseline's budget), its message the ``failure_text``: a test's one line
        ``capturelint.api.check(...).assert_clean()`` fails with the findings to read."""
        __tracebackhide__ = True  # a failing test shows its findings, not capturelint's frames
        if self.failed:
            raise AssertionError(self.failure_text())

    def failure_text(self) -> str:
        """The findings as the terminal report prints them: one entry per problem
        (``groups``), ``path:line: CODE what [scopes; graphs]`` with its why and fix,
        then what each configuration compared and the summary line."""
        out = []
        for g in self.groups:
            out.append(g.line())
            out.extend(f"  {label}: {text}" for label, text in (("why", g.parts.why), ("fix", g.parts.fix)) if text)
        if self.region_changes is not None and self.region_changes.failed:
            out.append(f"regions: {self.region_changes.summary_line()}")
        out.append("compared:")
        out.extend(f"  {c.label} (eager region {c.region_title}): {c.checked.describe()}" for c in self.configs)
        out.append(self.summary_line())
        return "\n".join(out)

    def verdict_line(self) -> str:
        """Whether replay computes what eager execution computes, per configuration,
        and what was compared, in one line::

            replay DIFFERS from eager execution in v1/PIECEWISE (token agreement 0.05, max step error 4.79);
            matches in v1/FULL (compared: 46 replay steps with their eager shadow; each output with its eager twin)

        "matches" is said of a configuration only when it compared its replays with
        eager execution (``Checked.with_eager``), the numbers agree and it has no finding."""
        if self.static:
            return ("static check: captures only (declared invariants, host syncs at capture); replay was NOT "
                    "compared with eager execution")
        differs, agree_but, matches, uncompared, unreplayed = [], [], [], [], []
        for c in self.configs:
            if c.diverged and c.numerical is not None:
                differs.append(f"{c.label} ({c.numerical.describe()})")
            elif not c.checked.replayed:
                unreplayed.append(c.label)
            elif not c.checked.with_eager:
                uncompared.append(f"{c.label} ({c.checked.not_compared()})")
            elif c.findings or c.waived:  # a suppressed finding is still a finding: no "matches"
                agree_but.append(c.label)
            else:
                matches.append(c.label)
        everywhere = len(self.configs) > 1 and len(matches) == len(self.configs)
        parts = [f"DIFFERS from eager execution in {cut(differs)}"] if differs else []
        if agree_but:
            parts.append(f"agrees numerically{'' if parts else ' with eager execution'} in {cut(agree_but)}, yet has "
                         "findings")
        if matches:
            where = f"all {len(matches)} configurations" if everywhere else cut(matches)
            parts.append(f"{'matches' if parts else 'matches eager execution'} in {where}")
        if uncompared:
            parts.append(f"NOT compared with eager in {cut(uncompared)}")
        if unreplayed:
            parts.append(f"nothing replayed in {cut(unreplayed)}")
        if not parts:
            return "replay: no configuration was checked"
        steps = sum(c.checked.shadowed_steps for c in self.configs)
        twins = sum(c.checked.eager_twin for c in self.configs)
        compared = [f"{_count(steps, 'replay step')} with {'its' if steps == 1 else 'their'} eager shadow"] if steps else []
        if twins:
            compared.append("each output with its eager twin" if twins == len(self.configs)
                            else f"{_count(twins, 'output')} with an eager twin")
        elif steps:
            compared.append("no eager twin")
        return f"replay {'; '.join(parts)}" + (f" (compared: {'; '.join(compared)})" if compared else "")

    def summary_line(self) -> str:
        n = len(self.findings)
        configs = len(self.configs)
        diverged = self.diverged
        uncompared = self.not_compared
        unreplayed = [c for c in self.configs if not c.checked.replayed]
        waived = self.waived_text()
        if n == 0 and diverged:
            where = cut([f"{c.label} ({c.numerical.describe()})" for c in diverged if c.numerical is not None])
            why = ("the findings that explain it are suppressed or accepted" if waived
                   else "the rules that report it are not selected (see --select and --ignore)")
            line = (
                f"no findings in {configs} configuration{'s' * (configs != 1)}, but replay DIFFERS from eager "
                f"execution in {where}: {why}"
            )
        elif n == 0 and waived:  # nothing fails the check, but replay was not shown to match
            line = f"no findings that fail the check in {configs} configuration{'s' * (configs != 1)}"
        elif n == 0 and self.static:
            line = (f"no findings in {configs} configuration{'s' * (configs != 1)} (static: declared invariants and "
                    "host syncs at capture only; replay equivalence was NOT checked)")
        elif n == 0 and not uncompared and not unreplayed:
            line = f"no findings in {configs} configuration{'s' * (configs != 1)}: replay matches eager execution"
        elif n == 0:
            compared = [c.label for c in self.configs if c.checked.replayed and c.checked.with_eager]
            parts = [f"replay matches eager execution in {cut(compared)}"] if compared else []
            if uncompared:
                rules_only = not compared and not any(c.checked.shadowed_steps for c in self.configs)
                parts.append("structural rules only, " * rules_only +
                             not_compared_clause([(c.label, c.checked) for c in uncompared], configs))
            if unreplayed:
                parts.append(f"nothing replayed in {cut([c.label for c in unreplayed])} (see its note)")
            line = f"no findings in {configs} configuration{'s' * (configs != 1)}: " + "; ".join(parts)
            uncompared = []  # said
        else:
            codes = ", ".join(f"{k} x{v}" for k, v in self.summary_json()["by_code"].items())
            line = f"{n} finding{'s' * (n != 1)} ({codes}) in {configs} configuration{'s' * (configs != 1)}"
        if uncompared:
            line += "; " + not_compared_clause([(c.label, c.checked) for c in uncompared], configs)
        if self.static and n:
            line += " (static: replay equivalence was NOT checked)"
        if waived:
            line += f"; {waived}"
        stale = self.stale_accepted()
        if stale:
            line += (f"; {_count(len(stale), 'accepted finding')} no longer occur{'s' * (len(stale) == 1)} "
                     f"(--update-accepted drops {'it' if len(stale) == 1 else 'them'})")
        if self.region_changes is not None:
            line += "; " + self.region_changes.summary_line()
        subject = self.subject_text()
        if subject is not None:
            line += f" [{subject}]"
        if self.shard is not None:
            total = len(self.shard.configurations)
            line += (f" (shard {self.shard.index}/{self.shard.count} of {total} configuration{'s' * (total != 1)}: "
                     "capturelint merge joins the shards' reports)")
        return line


def subject_text(subject: dict[str, Any] | None) -> str | None:
    """A report's subject in words (``Report.subject_text``)."""
    if not subject:
        return None
    if "targets" in subject:
        return "targets " + ", ".join(subject["targets"])
    return ", ".join(f"{key} {value}" for key, value in subject.items())


def not_compared_clause(items: list[tuple[str, Checked]], configs: int) -> str:
    """``replay NOT compared with eager (bare graph, no eager twin given)``, naming the
    configurations (``label, checked``) unless the report has only the one."""
    if configs == 1 and len(items) == 1:
        return f"replay NOT compared with eager ({items[0][1].not_compared()})"
    return f"replay NOT compared with eager in {cut([f'{label} ({c.not_compared()})' for label, c in items])}"


def code_ranges(codes: tuple[str, ...]) -> str:
    """``CL101-CL107, CL201, CL203``: sorted rule codes, runs of three or more
    consecutive codes written as a range."""
    runs: list[list[str]] = []
    for code in sorted(codes):
        prev = runs[-1][-1] if runs else None
        if prev and prev[:2] == code[:2] and prev[2:].isdigit() and code[2:].isdigit() and int(code[2:]) == int(prev[2:]) + 1:
            runs[-1].append(code)
        else:
            runs.append([code])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) >= 3 else ", ".join(r) for r in runs)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def dumps_json(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def render_json(report: Report) -> str:
    return dumps_json(report.to_json())




def finding_entries(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every finding of a JSON report (``Report.to_json``: one entry a problem, its
    members inside it), one entry each, as ``Finding.to_json`` writes a finding, in
    ``Finding.sort_key`` order: for a tool that wants each finding rather than each
    problem."""
    findings = sorted((f for p in doc["findings"] for f in problem_findings(p)), key=Finding.sort_key)
    return [f.to_json() for f in findings]


def graph_order(g: GraphMap) -> tuple:
    kind, _, size = g.graph.partition("/")
    return (g.runtime_mode, kind, int(size) if size.isdigit() else 0, g.graph)


def _give_back(configs: list[ConfigReport], items: list[Any], finding_of: Callable[[Any], Finding],
               counts: list[int], into: Callable[[ConfigReport], list[Any]], what: str) -> None:
    """``Report.from_json``: each of ``items`` (findings, or suppressed findings) to its
    configuration by runner and mode, in order, each configuration taking as many as its
    JSON ``counts`` says."""
    remaining = {id(c): n for c, n in zip(configs, counts)}
    for item in items:
        f = finding_of(item)
        owner = next((c for c in configs if (c.runner, c.mode) == (f.runner, f.mode) and remaining[id(c)] > 0), None)
        if owner is None:
            raise ValueError(f"{what} {f.code} of {f.runner}/{f.mode} has no configuration to belong to")
        into(owner).append(item)
        remaining[id(owner)] -= 1
    if any(remaining.values()):
        raise ValueError(f"the configurations' {what} counts disagree with the {what}s listed")
