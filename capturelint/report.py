"""The check report: the records every output format renders, and their JSON form.

JSON is byte-deterministic for a given command: sorted keys, no addresses, no
timestamps, floats rounded. The other formats are reporters
(``capturelint.reporters``): the Rich form (``capturelint.render.report``) carries the
same content grouped by runner and mode and ends with the one-line summary.

**The summary tells the truth.** "replay matches eager execution" is said only when no
finding was reported and every configuration's numerical oracle agrees; with the rules
that would report a divergence deselected, the summary says that replay differs and
where, even though the exit status (what the user asked for) stays 0.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from typing import TYPE_CHECKING

from capturelint import __version__
from capturelint.findings import Finding, Numerical
from capturelint.regions import GraphMap
from capturelint.shard import ShardInfo

if TYPE_CHECKING:
    from capturelint.records import Stream

JSON_VERSION = 1


@dataclasses.dataclass
class ConfigReport:
    """One runner and mode: its findings, numerical oracle and captured graphs."""

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
            "graphs": [g.to_json() for g in sorted(self.graphs, key=_graph_order)],
            "note": self.note,
        }


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


@dataclasses.dataclass
class Report:
    configs: list[ConfigReport]
    region_changes: Any = None  # filled by the gate (capturelint.snapshot)
    invariants: tuple[Any, ...] = ()  # the declared invariants in force (capturelint.invariants.Invariant)
    static: bool = False  # check --static: captures only, replay equivalence not checked
    shard: ShardInfo | None = None  # check --shard K/N: which shard of which plan (capturelint.shard)

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
        out: list[Finding] = []
        for c in self.configs:
            out.extend(c.findings)
        return sorted(out, key=Finding.sort_key)

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
            "findings": [f.to_json() for f in self.findings],
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
                                        [GraphMap.from_json(g) for g in c["graphs"]], note=c["note"], static=static))
        # findings: sorted over the whole report; each configuration says how many are its own
        remaining = {id(c): c_doc["findings"] for c, c_doc in zip(configs, doc["configurations"])}
        for f in (Finding.from_json(f) for f in doc["findings"]):
            owner = next((c for c in configs if (c.runner, c.mode) == (f.runner, f.mode) and remaining[id(c)] > 0), None)
            if owner is None:
                raise ValueError(f"finding {f.code} of {f.runner}/{f.mode} has no configuration to belong to")
            owner.findings.append(f)
            remaining[id(owner)] -= 1
        if any(remaining.values()):
            raise ValueError("the configurations' finding counts disagree with the findings listed")
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
        return cls(configs, invariants=tuple(invariants), static=static, shard=shard)

    def summary_json(self) -> dict[str, Any]:
        by_code: dict[str, int] = {}
        for f in self.findings:
            by_code[f.code] = by_code.get(f.code, 0) + 1
        return {
            "findings": len(self.findings),
            "by_code": dict(sorted(by_code.items())),
            "configurations": len(self.configs),
            "diverged": [c.label for c in self.diverged],
        }

    def summary_line(self) -> str:
        n = len(self.findings)
        configs = len(self.configs)
        diverged = self.diverged
        if n == 0 and diverged:
            where = _cut([f"{c.label} ({c.numerical.describe()})" for c in diverged if c.numerical is not None])
            line = (
                f"no findings in {configs} configuration{'s' * (configs != 1)}, but replay DIFFERS from eager "
                f"execution in {where}: the rules that report it are not selected (see --select and --ignore)"
            )
        elif n == 0 and self.static:
            line = (f"no findings in {configs} configuration{'s' * (configs != 1)} (static: declared invariants and "
                    "host syncs at capture only; replay equivalence was NOT checked)")
        elif n == 0:
            line = f"no findings in {configs} configuration{'s' * (configs != 1)}: replay matches eager execution"
        else:
            codes = ", ".join(f"{k} x{v}" for k, v in self.summary_json()["by_code"].items())
            line = f"{n} finding{'s' * (n != 1)} ({codes}) in {configs} configuration{'s' * (configs != 1)}"
        if self.static and n:
            line += " (static: replay equivalence was NOT checked)"
        if self.region_changes is not None:
            line += "; " + self.region_changes.summary_line()
        if self.shard is not None:
            total = len(self.shard.configurations)
            line += (f" (shard {self.shard.index}/{self.shard.count} of {total} configuration{'s' * (total != 1)}: "
                     "capturelint merge joins the shards' reports)")
        return line


def dumps_json(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def render_json(report: Report) -> str:
    return dumps_json(report.to_json())


def _cut(items: list[str], limit: int = 5) -> str:
    return ", ".join(items[:limit]) + (f" ... and {len(items) - limit} more" if len(items) > limit else "")


def _graph_order(g: GraphMap) -> tuple:
    kind, _, size = g.graph.partition("/")
    return (g.runtime_mode, kind, int(size) if size.isdigit() else 0, g.graph)


