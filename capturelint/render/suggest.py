"""The Rich form of a ``capturelint suggest`` report.

Printed form (abridged)::

    current region: v1/PIECEWISE FAILS (4 findings, 4 eager ops per step) · v2/PIECEWISE clean
    ╭─ 1. DeepseekV4Attention._prepare_and_attn ─────────────────────────────────╮
    │ capturelint/engine/dsv4/attention.py:276  DeepseekV4Attention._prepare_... │
    │ eager ops per step: v1/PIECEWISE 4 -> 38 (+850%) · 1 break added · fixes 4 │
    │ verified: v1/PIECEWISE clean, 23 replay steps, max step error 0            │
    │ runners: v1 safe, needs it · v2 safe                                       │
    │ per-runner region: not needed for correctness ...                          │
    ╰────────────────────────────────────────────────────────────────────────────╯
    tried without success: ...
    1 verified region (4 regions tried); best: ...
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.text import Text

from capturelint.lists import and_more, cut_list, shown

# The report it draws is ``capturelint.suggest.SuggestReport`` (its ``suggestions``,
# ``configurations`` of ``Outcome``, ``trials``...), read by attribute: a reporter
# imports nothing above the report model, not even for annotations.


def _verdict(o: Any) -> str:
    if o.error:
        return f"{o.label} error: {o.error}"
    if o.clean:
        err = "" if o.max_step_error is None else f", max step error {o.max_step_error:.3g}"
        return f"{o.label} clean, {o.replay_steps} replay steps checked{err}"
    what = f"{len(o.findings)} finding{'s' * (len(o.findings) != 1)}" if o.findings else "replay differs from eager"
    return f"{o.label} FAILS ({what})"


def _suggestion_panel(s: Any) -> Panel:
    parts: list[Any] = []
    for ref in s.region:
        parts.append(Text(f"{ref.file}:{ref.def_line}  {ref.qualname}", style="bold"))
    growth = []
    for label, g in s.growth().items():
        pct = "" if g["growth_percent"] is None else f" ({g['growth_percent']:+g}%)"
        growth.append(f"{label} {g['current']:g} -> {g['suggested']:g}{pct}")
    parts.append(Text(f"eager ops per step: {'; '.join(growth)} · {s.breaks_added} break{'s' * (s.breaks_added != 1)} "
                      f"added · fixes {s.fixed} finding{'s' * (s.fixed != 1)}"
                      + (f" and {s.uncovered} it uncovered" if s.uncovered else "")))
    for o in s.verification:
        parts.append(Text(f"verified: {_verdict(o)}", style="green"))
    for o in s.cross:
        parts.append(Text(f"cross-check: {_verdict(o)}", style="green" if o.clean else "red"))
    runners = s.runners()
    parts.append(Text("runners: " + " · ".join(
        f"{r} {'safe' if v['safe'] else 'UNSAFE'}{', needs it' if v['needs_fix'] else ''}" for r, v in runners.items())))
    per = s.per_runner()
    parts.append(Text(f"per-runner region: {per['note']}", style="red" if per["needed"] else "dim"))
    title = f"{s.rank}. " + " + ".join(r.qualname for r in s.region)
    return Panel(Group(*parts), title=title, title_align="left", border_style="green")


def render_suggest(report: Any, console: Console) -> None:
    line = Text("current region: ")
    for i, o in enumerate(report.configurations):
        if i:
            line.append(" · ", style="dim")
        line.append(_verdict(o) if not o.clean else f"{o.label} clean", style="red" if not o.clean else "green")
    console.print(line)
    suggestions, more = shown(report.suggestions)
    for s in suggestions:
        console.print(_suggestion_panel(s))
    if more:
        console.print(Text(f"{and_more(more)} verified regions (--format json lists them)", style="dim"))
    failed = report.unsuccessful()
    if report.failing and failed:
        parts: list[Any] = []
        for t in failed:
            o = t.outcomes[-1]
            parts.append(Text(" + ".join(r.qualname for r in t.region) + f": {_verdict(o)}", style="bold"))
            parts.extend(cut_list([Text(f"  remains: {what}") for what in o.findings],
                                  lambda n: Text(f"  {and_more(n)}", style="dim")))
        console.print(Panel(Group(*parts), title="tried without success", title_align="left", border_style="red"))
    if report.failing and not report.candidates:
        console.print(Text("no candidate: no finding has an engine function on its capture-time stack that can be made "
                           "an eager break" + (f" (skipped: {_skipped(report.skipped)})"
                                               if report.skipped else ""), style="red"))
    console.print(Text(report.summary_line(), style="bold green" if report.found or not report.failing else "bold red"))


def _skipped(skipped: tuple[tuple[str, str], ...]) -> str:
    """``function: reason; ...``: at most five, then how many more."""
    listed, more = shown(skipped)
    return "; ".join(f"{f}: {r}" for f, r in listed) + (f" {and_more(more)}" if more else "")


__all__ = ["render_suggest"]
