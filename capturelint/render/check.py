"""The Rich form of the check report: concise by default, the evidence with ``--verbose``.

The default (``render_concise``) reads at a glance, as ruff and flake8 print: the
verdict and what was compared in one line, a line per configuration saying which steps
it exercised (``Checked.exercised``), then one entry per problem (a
``capturelint.findings.FindingGroup``: the findings of one cause in every layer, graph
and configuration), its why and its fix, then the summary::

    replay DIFFERS from eager execution in v1/PIECEWISE (token agreement 0.05, max step error 4.79); matches in
    v1/FULL (compared: 46 replay steps with their eager shadow; each output with its eager twin)

    capturelint/engine/dsv4/attention.py:305: CL101 replay re-issues the recorded ops, so the step's ops never
    run [4 findings: model.layers.{0..3}.attn; mixed/32 in v1/PIECEWISE]
      why: The forward context differed at capture: attn_metadata was None (...), ...
      fix: Move the branching code into an eager break, or make the capture take the path real steps take.

    4 findings in 1 problem: --verbose shows each with its ops, segments and replay steps; capturelint rules
    CODE shows why a rule matters (CL101)
    4 findings (CL101 x4) in 2 configurations

Each entry is one logical line (``soft_wrap``: the terminal wraps it, a file keeps it
whole, so ``grep path:line`` finds it).

``--verbose`` (``render_rich`` with ``verbose``) adds, never removes (as ``ruff -v`` and
``pytest -v`` do): the default report first, exactly as without it (less its closing
"--verbose shows" line), then the evidence: a panel per runner and mode (what was
compared, every graph's segments), then per problem each finding with its ops, source
lines and replay steps. The why and the fix were said once per problem above; a
finding's own sentences are printed only where they differ from its problem's.
Printed form (abridged)::

    replay DIFFERS from eager execution in v1/PIECEWISE (...)

    capturelint/engine/dsv4/attention.py:305: CL101 ... [4 findings: ...]
      why: ...
      fix: ...

    evidence
    ╭─ runner v1 · mode PIECEWISE · eager region narrow ─────────────────────────╮
    │ numerical: token agreement 0.18 with the eager twin, max replay-vs-eager   │
    │ step error 3.21 over 20 replay steps                                       │
    │ checked: rules CL101, CL102, ...; 20 replay steps shadowed; eager twin     │
    │ compared                                                                   │
    │ graphs decode/1, decode/2 (PIECEWISE): 120 captured ops, 4 eager ops       │
    │   segments: C:28 | E _sparse_indexer_and_attn:1 | C:30 | ...               │
    │ 4 findings (problems 1)                                                    │
    ╰────────────────────────────────────────────────────────────────────────────╯
    problem 1 of 1: capturelint/engine/dsv4/attention.py:305: CL101 (4 findings)
    CL101 baked-control-flow [R1] model.layers.0.attn · dsv4.fused_...
      segment ...
    ...
    4 findings (CL101 x4) in 1 configuration

The segments of a graph get a line of their own and wrap between segments (never cut),
so eager-break names stay whole on an 80-column terminal.

A configuration whose replay was not compared with eager execution (a bare graph
without an eager twin) gets a yellow panel that says so and what that leaves unchecked
(``ConfigReport.unchecked_text``), and never a green "matches".
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.text import Text

from capturelint.findings import Finding, MessageParts
from capturelint.lists import and_more, shown
from capturelint.regions import GraphMap
from capturelint.report import Report, graph_order
from capturelint.runtime.protocol import SegmentKind


def _segments_text(g: GraphMap) -> Text:
    """``  segments: C:28 | E _sparse_indexer_and_attn:1 | C:30``: C captured, E an
    eager break (its method name), with op counts."""
    t = Text("  segments: ", style="dim")
    for i, s in enumerate(g.segments):
        if i:
            t.append(" | ", style="dim")
        if s.kind is SegmentKind.EAGER:
            t.append(f"E {s.name.rsplit('.', 1)[-1] if s.name else ''}:{s.op_count}", style="yellow")
        else:
            t.append(f"C:{s.op_count}", style="cyan")
    return t


Table_ = tuple[tuple[str, ...], list[tuple[str, ...]]]


def render_rich(report: Report, console: Console, verbose: bool = False, table: Table_ | None = None) -> None:
    """The concise report; with ``verbose`` the same report followed by the evidence
    (``render_evidence``): ``--verbose`` adds, never removes. ``table``: an engine's
    table (columns, rows: vLLM's ``--model all``), before the summary line."""
    render_concise(report, console, evidence=verbose, table=table)


def render_concise(report: Report, console: Console, evidence: bool = False, table: Table_ | None = None) -> None:
    """The verdict, one entry per problem with its why and fix, the summary; with
    ``evidence``, the evidence (``render_evidence``) before the summary; ``table`` last
    before the summary."""
    failed = report.failed or report.diverged
    console.print(Text(report.verdict_line(), style="red" if report.diverged else "yellow" if report.not_compared
                       else "green"), soft_wrap=True)
    for cfg in report.configs:  # what a configuration did not compare, and why nothing ran
        for note in (cfg.unchecked_text(), cfg.note):
            if note:
                console.print(Text(f"{cfg.label}: {note}", style="yellow"), soft_wrap=True)
    for cfg in report.configs:  # what the comparison covers: the steps each configuration ran
        if cfg.checked.exercised:
            console.print(Text(f"{cfg.label} exercised: {cfg.checked.exercised_text()}", style="dim"), soft_wrap=True)
    groups = report.groups
    if groups:
        console.print()
    for g in groups:
        t = Text(g.line())  # path:line: CODE ...
        t.stylize("bold", 0, len(g.where) + 1)
        t.stylize("bold red", len(g.where) + 2, len(g.where) + 2 + len(g.code))
        console.print(t, soft_wrap=True)
        for label, text in (("why", g.parts.why), ("fix", g.parts.fix)):
            if text:
                console.print(Text(f"  {label}: {text}", style="dim" if label == "why" else ""), soft_wrap=True)
    if report.region_changes is not None:  # the gate's panel
        from capturelint.render.changes import region_changes_panel

        console.print(region_changes_panel(report.region_changes))
    waived, stale = report.waived_text(), report.stale_accepted()
    if waived or stale:
        console.print()
    if waived:
        more = "listed below with" if evidence else "--verbose lists each with"
        console.print(Text(f"{waived}, not failed on: {more} the comment or file that accepts it", style="dim"),
                      soft_wrap=True)
    listed, left = shown(stale)
    for e in listed:
        console.print(Text(f"accepted, no longer found: {e.describe()}", style="dim"), soft_wrap=True)
    if left:
        console.print(Text(f"{and_more(left)} accepted findings no longer found", style="dim"))
    if evidence:
        console.print()
        render_evidence(report, console, summary=False)
    elif groups:
        n, codes = len(report.findings), sorted({g.code for g in groups})
        console.print()
        console.print(Text(f"{_count(n, 'finding')} in {_count(len(groups), 'problem')}: --verbose shows each with its "
                           f"ops, segments and replay steps; capturelint rules CODE shows why a rule matters "
                           f"({', '.join(codes)})", style="dim"), soft_wrap=True)
    if table is not None:
        from rich.table import Table

        columns, rows = table
        grid = Table(*columns)
        for row in rows:
            grid.add_row(*row)
        console.print(grid)
    style = "bold red" if failed else "bold yellow" if report.not_compared else "bold green"
    console.print(Text(report.summary_line(), style=style), soft_wrap=True)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def render_evidence(report: Report, console: Console, summary: bool = True) -> None:
    """A panel per runner and mode (what was compared, every graph structure with its
    segments' op counts, which problems it has), then per problem every finding with its
    evidence (its why and fix only where they differ from the problem's, which the
    concise report says once), then the summary (``summary``)."""
    groups = report.groups
    number = {id(f): i for i, g in enumerate(groups, 1) for f in g.findings}
    console.print(Text("evidence", style="bold"))
    for cfg in report.configs:
        title = f"runner {cfg.runner} · mode {cfg.mode} · eager region {cfg.region_title}"
        parts: list[Any] = []
        if cfg.numerical is not None:
            n = cfg.numerical
            if n.token_agreement is not None:
                tokens = f"token agreement {n.token_agreement:.2f} with the eager twin"
            elif n.max_logit_error is not None:
                tokens = f"max error {n.max_logit_error:.3g} against the eager twin"
            else:
                tokens = "no eager twin"
            if cfg.checked.shadowed_steps or not cfg.checked.eager_twin:
                steps = f", max replay-vs-eager step error {n.max_step_error:.3g} over {n.replay_steps} replay steps"
            else:  # no step had a shadow: only the twin compared
                steps = f" over {n.replay_steps} replays (not shadowed: no step-by-step comparison)"
            parts.append(Text(f"numerical: {tokens}{steps}", style="red" if n.diverged else "green"))
        parts.append(Text(f"checked: {cfg.checked.describe()}", style="dim"))
        if cfg.checked.exercised:
            parts.append(Text(f"exercised: {cfg.checked.exercised_text()}", style="dim"))
        unchecked = cfg.unchecked_text()
        if unchecked:
            parts.append(Text(unchecked, style="yellow"))
        if cfg.note:
            parts.append(Text(cfg.note, style="yellow"))
        if cfg.graphs:
            # Graphs of one mode usually share their segment structure (only the padded
            # size differs): one entry per structure, listing the graphs.
            structures: dict[tuple, list[GraphMap]] = {}
            for g in sorted(cfg.graphs, key=graph_order):
                structures.setdefault((g.runtime_mode, g.segments), []).append(g)
            for members in structures.values():
                g = members[0]
                head = Text(f"graphs {', '.join(m.graph for m in members)}", style="bold")
                head.append(f" ({g.runtime_mode}): {g.captured_ops} captured ops, {g.eager_ops} eager ops")
                parts.append(head)
                parts.append(_segments_text(g))
        if cfg.findings:
            problems = sorted({number[id(f)] for f in cfg.findings if id(f) in number})
            parts.append(Text(f"{_count(len(cfg.findings), 'finding')}: problem{'s' * (len(problems) != 1)} "
                              f"{', '.join(map(str, problems))} below", style="red"))
        elif cfg.diverged:
            parts.append(Text("no findings, but replay differs from eager execution: the rules that report it are "
                              "not selected", style="red"))
        elif cfg.waived:
            parts.append(Text(f"no findings that fail the check ({len(cfg.waived)} suppressed or accepted, listed "
                              "below)", style="yellow"))
        else:
            parts.append(Text("no findings", style="green" if unchecked is None else "yellow"))
        border = "red" if cfg.findings or cfg.diverged else "green" if unchecked is None else "yellow"
        console.print(Panel(Group(*parts), title=title, title_align="left", border_style=border))
    for i, g in enumerate(groups, 1):
        head = Text(f"problem {i} of {len(groups)}: {g.where}: {g.code} ({_count(len(g.findings), 'finding')})",
                    style="bold")
        console.print(head, soft_wrap=True)
        said = g.parts
        for f in g.findings:
            console.print(render_finding(f, said), soft_wrap=True)
    if report.waived or report.stale_accepted():
        console.print(waived_panel(report))
    if summary:
        style = "bold red" if report.failed or report.diverged else "bold yellow" if report.not_compared else "bold green"
        console.print(Text(report.summary_line(), style=style))


def waived_panel(report: Report) -> Panel:
    """The findings suppressed inline or accepted, each with what accepts it, and the
    accepted findings that no longer occur."""
    parts: list[Any] = []
    for w in report.waived:
        t = render_finding(w.finding)
        t.append(f"  {w.describe()}\n", style="yellow")
        parts.append(t)
    for e in report.stale_accepted():
        parts.append(Text(f"accepted, no longer found: {e.describe()}", style="dim"))
    title = "; ".join(p for p in (report.waived_text(), f"{len(report.stale_accepted())} no longer found"
                                  if report.stale_accepted() else "") if p)
    return Panel(Group(*parts), title=f"not failed on: {title}", title_align="left", border_style="yellow")


def render_finding(f: Finding, said: MessageParts | None = None) -> Text:
    """One finding's evidence: its ops, segment, source lines and replay steps, then its
    message; with ``said`` (its problem's what, why and fix, printed once already) only
    the parts of its message that differ from them."""
    t = Text()
    t.append(f"{f.code} ", style="bold red")
    t.append(f"{f.name} ", style="red")
    t.append(f"[{f.condition}] ", style="dim")
    t.append(f"{f.scope} · {f.op}" + (f" · {f.tensor}" if f.tensor else ""), style="bold")
    t.append(f"\n  segment {f.segment} ({f.runtime_mode})" if f.segment else "")
    t.append(f"\n  runner {f.runner} · mode {f.mode}" if not f.segment and (f.runner or f.mode) else "")
    if f.edit is not None:
        t.append(f"\n  line to change ({f.edit.role}): {f.edit.frame}")
    if f.capture_frame:
        t.append(f"\n  capture: {f.capture_frame}")
    if f.shadow_frame:
        t.append(f"\n  step:    {f.shadow_frame}")
    if f.allocation_frame and (f.edit is None or f.allocation_frame != f.edit.frame):
        t.append(f"\n  re-allocated at: {f.allocation_frame}")
    if f.steps:
        t.append(f"\n  seen at replay steps {', '.join(map(str, f.steps))}" + (f" ({f.occurrences} times)" if f.occurrences > 1 else ""), style="dim")
    if said is None:
        t.append(f"\n  {f.message}\n")
        return t
    own = MessageParts.of(f.message)
    for label, mine, theirs in (("what", own.what, said.what), ("why", own.why, said.why), ("fix", own.fix, said.fix)):
        if mine and mine != theirs:
            t.append(f"\n  {label}: {mine}", style="dim" if label == "why" else "")
    t.append("\n")
    return t


__all__ = ["render_concise", "render_evidence", "render_finding", "render_rich", "waived_panel"]
