"""The check report: records, and their Rich and JSON renderings.

JSON is byte-deterministic for a given command: sorted keys, no addresses, no
timestamps, floats rounded. The Rich form carries the same content grouped by runner
and mode and ends with a one-line summary.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from capturelint import __version__
from capturelint.runtime.protocol import SegmentKind
from capturelint.findings import Finding, Numerical
from capturelint.regions import GraphMap
from capturelint.tracer import Stream

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

    def to_json(self) -> dict[str, Any]:
        return {
            "runner": self.runner,
            "mode": self.mode,
            "eager_region": self.eager_region,
            "findings": len(self.findings),
            "graphs": [g.to_json() for g in sorted(self.graphs, key=_graph_order)],
            "note": self.note,
        }


@dataclasses.dataclass
class Report:
    configs: list[ConfigReport]
    region_changes: Any = None  # filled by the gate (capturelint.snapshot)

    @property
    def findings(self) -> list[Finding]:
        out: list[Finding] = []
        for c in self.configs:
            out.extend(c.findings)
        return sorted(out, key=Finding.sort_key)

    @property
    def failed(self) -> bool:
        return bool(self.findings) or bool(self.region_changes is not None and self.region_changes.failed)

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
        return doc

    def summary_json(self) -> dict[str, Any]:
        by_code: dict[str, int] = {}
        for f in self.findings:
            by_code[f.code] = by_code.get(f.code, 0) + 1
        return {"findings": len(self.findings), "by_code": dict(sorted(by_code.items())), "configurations": len(self.configs)}

    def summary_line(self) -> str:
        n = len(self.findings)
        configs = len(self.configs)
        if n == 0:
            line = f"no findings in {configs} configuration{'s' * (configs != 1)}: replay matches eager execution"
        else:
            codes = ", ".join(f"{k} x{v}" for k, v in self.summary_json()["by_code"].items())
            line = f"{n} finding{'s' * (n != 1)} ({codes}) in {configs} configuration{'s' * (configs != 1)}"
        if self.region_changes is not None:
            line += "; " + self.region_changes.summary_line()
        return line


def dumps_json(doc: Any) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def render_json(report: Report) -> str:
    return dumps_json(report.to_json())


def _graph_order(g: GraphMap) -> tuple:
    kind, _, size = g.graph.partition("/")
    return (g.runtime_mode, kind, int(size) if size.isdigit() else 0, g.graph)


def _segments_cell(g: GraphMap) -> Text:
    t = Text()
    for i, s in enumerate(g.segments):
        if i:
            t.append(" | ", style="dim")
        if s.kind is SegmentKind.EAGER:
            t.append(f"E {s.name.rsplit('.', 1)[-1] if s.name else ''}:{s.op_count}", style="yellow")
        else:
            t.append(f"C:{s.op_count}", style="cyan")
    return t


def render_rich(report: Report, console: Console, verbose: bool = False) -> None:
    """Findings grouped by runner and mode, graph segments with op counts, a summary."""
    for cfg in report.configs:
        title = f"runner {cfg.runner} · mode {cfg.mode} · eager region {cfg.eager_region}"
        parts: list[Any] = []
        if cfg.numerical is not None:
            n = cfg.numerical
            if n.token_agreement is not None:
                tokens = f"token agreement {n.token_agreement:.2f} with the eager twin"
            elif n.max_logit_error is not None:
                tokens = f"max error {n.max_logit_error:.3g} against the eager twin"
            else:
                tokens = "no eager twin"
            ok = n.token_agreement in (None, 1.0) and n.max_step_error <= 1e-4
            parts.append(
                Text(
                    f"numerical: {tokens}, max replay-vs-eager step error {n.max_step_error:.3g} over "
                    f"{n.replay_steps} replay steps",
                    style="green" if ok else "red",
                )
            )
        if cfg.note:
            parts.append(Text(cfg.note, style="yellow"))
        if cfg.graphs:
            table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
            table.add_column("graphs")
            table.add_column("mode")
            table.add_column("captured ops", justify="right")
            table.add_column("eager ops", justify="right")
            table.add_column("segments (C captured, E eager break: ops)")
            # Graphs of one mode usually share their segment structure (only the padded
            # size differs): one row per structure, listing the graphs.
            groups: dict[tuple, list[GraphMap]] = {}
            for g in sorted(cfg.graphs, key=_graph_order):
                groups.setdefault((g.runtime_mode, g.segments), []).append(g)
            rows = list(groups.values())
            shown = rows if verbose else rows[:5]
            for members in shown:
                g = members[0]
                names = ", ".join(m.graph for m in members)
                table.add_row(names, g.runtime_mode, str(g.captured_ops), str(g.eager_ops), _segments_cell(g))
            if len(rows) > len(shown):
                table.add_row(f"... and {len(rows) - len(shown)} more", "", "", "", "")
            parts.append(table)
        for f in cfg.findings:
            parts.append(render_finding(f))
        if not cfg.findings:
            parts.append(Text("no findings", style="green"))
        console.print(Panel(Group(*parts), title=title, title_align="left", border_style="red" if cfg.findings else "green"))
    if report.region_changes is not None:  # the gate's panel
        from capturelint.render.changes import region_changes_panel

        console.print(region_changes_panel(report.region_changes))
    console.print(Text(report.summary_line(), style="bold red" if report.failed else "bold green"))


def render_finding(f: Finding) -> Text:
    t = Text()
    t.append(f"{f.code} ", style="bold red")
    t.append(f"{f.name} ", style="red")
    t.append(f"[{f.condition}] ", style="dim")
    t.append(f"{f.scope} · {f.op}" + (f" · {f.tensor}" if f.tensor else ""), style="bold")
    t.append(f"\n  segment {f.segment} ({f.runtime_mode})" if f.segment else "")
    if f.capture_frame:
        t.append(f"\n  capture: {f.capture_frame}")
    if f.shadow_frame:
        t.append(f"\n  step:    {f.shadow_frame}")
    if f.allocation_frame:
        t.append(f"\n  re-allocated at: {f.allocation_frame}")
    if f.steps:
        t.append(f"\n  seen at replay steps {', '.join(map(str, f.steps))}" + (f" ({f.occurrences} times)" if f.occurrences > 1 else ""), style="dim")
    t.append(f"\n  {f.message}\n")
    return t
