"""The Rich form of region changes (``check --baseline``, ``diff``, ``snapshot --update``).

Printed form::

    ╭─ region changes ─────────────────────────────────────────────────────────────────╮
    │ v1/PIECEWISE (eager region wide -> narrow): eager ops per step 39 -> 4 (-89.7%)  │
    │   moved to captured: 210 ops                                                     │
    │     model.layers.*.attn: 162 ops in 6 graphs (aten.mul.Tensor ×42, ... and 8 more) │
    │     model.layers.*.attn.wq_b: 24 ops in 6 graphs (aten.mm.default ×12, aten.t.default ×12) │
    │   segments added:                                                                │
    │     eager break DeepseekV4Attention._sparse_indexer_and_attn ×12 in 6 graphs     │
    │   segments removed:                                                              │
    │     eager break DeepseekV4Attention._prepare_and_attn_eager ×12 in 6 graphs      │
    │ in the baseline but not run: v2/PIECEWISE                                        │
    │ regions changed in 1 of 1 configuration: 0 ops moved to eager, 210 to captured; ... │
    ╰──────────────────────────────────────────────────────────────────────────────────╯

Moved ops are grouped by scope with layer numbers replaced by ``*`` so that one line
covers every layer (scopes and ops cut at five); the JSON form keeps every scope.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.text import Text

from capturelint.graph import scope_group
from capturelint.lists import and_more, cut, cut_list
from capturelint.region_changes import ConfigChange, Direction, RegionChanges, SegmentChange


def _lines(items: list[Text], indent: str = "    ") -> list[Text]:
    return cut_list(items, lambda n: Text(f"{indent}{and_more(n)}", style="dim"))


def _moved_lines(change: "ConfigChange") -> list[Text]:
    """Per direction, one line per scope (layers folded to ``*``) with its ops."""
    out: list[Text] = []
    for direction in (Direction.TO_EAGER, Direction.TO_CAPTURED):
        by_scope: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        graphs: dict[str, int] = defaultdict(int)
        for m in change.moved:
            if m.direction is direction:
                scope = scope_group(m.scope) or "<top>"
                by_scope[scope][m.op] += m.count
                graphs[scope] = max(graphs[scope], m.graphs)
        if not by_scope:
            continue
        style = "yellow" if direction is Direction.TO_EAGER else "cyan"
        items = []
        for scope in sorted(by_scope, key=_natural):
            ops = sorted(by_scope[scope].items(), key=lambda kv: (-kv[1], kv[0]))
            total = sum(n for _, n in ops)
            listed = cut([f"{op} ×{n}" for op, n in ops])
            g = graphs[scope]
            items.append(Text(f"    {scope}: {total} op{'s' * (total != 1)} in {g} graph{'s' * (g != 1)} ({listed})", style=style))
        total = sum(sum(v.values()) for v in by_scope.values())
        out.append(Text(f"  moved {direction}: {total} op{'s' * (total != 1)}", style=f"bold {style}"))
        out.extend(_lines(items))
    return out


def _natural(text: str) -> tuple:
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", text))


def _segment_lines(title: str, segs: tuple["SegmentChange", ...], style: str) -> list[Text]:
    if not segs:
        return []
    items = [Text(f"    {s.label} ×{s.count} in {s.graphs} graph{'s' * (s.graphs != 1)}", style=style) for s in segs]
    return [Text(f"  {title}:", style=f"bold {style}")] + _lines(items)


def config_change_lines(change: "ConfigChange") -> list[Text]:
    region = (
        f"eager region {change.region_after}" if change.region_before == change.region_after
        else f"eager region {change.region_before} -> {change.region_after}"
    )
    head = Text(f"{change.label} ({region}): ", style="bold")
    head.append(f"eager ops per step {change.describe_growth()}", style="bold red" if change.over_budget else "bold")
    if change.over_budget:
        head.append(f", over the {change.max_growth_pct:g}% budget", style="bold red")
    out = [head]
    out.extend(_moved_lines(change))
    out.extend(_segment_lines("segments added", change.segments_added, "green"))
    out.extend(_segment_lines("segments removed", change.segments_removed, "magenta"))
    if change.graphs_added:
        out.append(Text(f"  graphs added: {cut(change.graphs_added)}", style="green"))
    if change.graphs_removed:
        out.append(Text(f"  graphs removed: {cut(change.graphs_removed)}", style="magenta"))
    return out


def region_changes_panel(changes: "RegionChanges", title: str = "region changes") -> Panel:
    parts: list[Any] = []
    changed = [c for c in changes.configs if c.changed]
    for c in changed:
        parts.extend(config_change_lines(c))
    unchanged = [c.label for c in changes.configs if not c.changed]
    if unchanged:
        parts.append(Text(f"unchanged: {cut(unchanged)}", style="green"))
    if changes.new_configs:
        parts.append(Text(f"new, not in the baseline (listed, not checked): {cut(list(changes.new_configs))}", style="cyan"))
    if changes.missing_configs:
        parts.append(Text(f"in the baseline but not run: {cut(list(changes.missing_configs))}", style="dim"))
    for note in changes.notes:
        parts.append(Text(f"note: {note}", style="yellow"))
    parts.append(Text(changes.summary_line(), style="bold red" if changes.failed else "bold"))
    return Panel(Group(*parts), title=title, title_align="left", border_style="red" if changes.failed else ("yellow" if changed else "green"))
