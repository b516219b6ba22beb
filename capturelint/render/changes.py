"""The Rich form of region changes (``check --baseline``, ``diff``, ``snapshot --update``).

Printed form::

    ╭─ region changes ────────────────────────────────────────────────────────────╮
    │ v1/PIECEWISE (eager region wide -> narrow): eager ops per step 19.5 -> 2 (-89.7%) │
    │   moved to captured: model.layers.*.attn · aten.constant_pad_nd.default ×12 in 6 graphs │
    │   ...                                                                        │
    │   eager breaks added: DeepseekV4Attention._sparse_indexer_and_attn ×12 in 6 graphs │
    │ unchanged: v2/PIECEWISE                                                      │
    │ regions changed in 1 of 2 configurations: ...                                │
    ╰──────────────────────────────────────────────────────────────────────────────╯

Moved ops are grouped by scope with layer numbers replaced by ``*`` so that one line
covers every layer; the JSON form keeps every scope.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.panel import Panel
from rich.text import Text

from capturelint.graph import scope_group

if TYPE_CHECKING:
    from capturelint.snapshot import ConfigChange, RegionChanges, SegmentChange

LIST_CUT = 5


def _lines(items: list[Text], indent: str = "    ") -> list[Text]:
    if len(items) > LIST_CUT:
        return items[:LIST_CUT] + [Text(f"{indent}... and {len(items) - LIST_CUT} more", style="dim")]
    return items


def _moved_lines(change: "ConfigChange") -> list[Text]:
    from capturelint.snapshot import Direction

    out: list[Text] = []
    for direction in (Direction.TO_EAGER, Direction.TO_CAPTURED):
        grouped: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        for m in change.moved:
            if m.direction is direction:
                g = grouped[(scope_group(m.scope) or "<top>", m.op)]
                g[0] += m.count
                g[1] = max(g[1], m.graphs)
        if not grouped:
            continue
        style = "yellow" if direction is Direction.TO_EAGER else "cyan"
        items = [
            Text(f"    {scope} · {op} ×{n} in {g} graph{'s' * (g != 1)}", style=style)
            for (scope, op), (n, g) in sorted(grouped.items(), key=lambda kv: (-kv[1][0], kv[0]))
        ]
        total = sum(n for n, _ in grouped.values())
        out.append(Text(f"  moved {direction}: {total} op{'s' * (total != 1)}", style=f"bold {style}"))
        out.extend(_lines(items))
    return out


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
        out.append(Text(f"  graphs added: {_cut(change.graphs_added)}", style="green"))
    if change.graphs_removed:
        out.append(Text(f"  graphs removed: {_cut(change.graphs_removed)}", style="magenta"))
    return out


def _cut(items: tuple[str, ...] | list[str]) -> str:
    head = ", ".join(items[:LIST_CUT])
    return head + (f" ... and {len(items) - LIST_CUT} more" if len(items) > LIST_CUT else "")


def region_changes_panel(changes: "RegionChanges", title: str = "region changes") -> Panel:
    parts: list[Any] = []
    changed = [c for c in changes.configs if c.changed]
    for c in changed:
        parts.extend(config_change_lines(c))
    unchanged = [c.label for c in changes.configs if not c.changed]
    if unchanged:
        parts.append(Text(f"unchanged: {_cut(unchanged)}", style="green"))
    if changes.new_configs:
        parts.append(Text(f"new, not in the baseline (listed, not checked): {_cut(list(changes.new_configs))}", style="cyan"))
    if changes.missing_configs:
        parts.append(Text(f"in the baseline but not run: {_cut(list(changes.missing_configs))}", style="dim"))
    for note in changes.notes:
        parts.append(Text(f"note: {note}", style="yellow"))
    parts.append(Text(changes.summary_line(), style="bold red" if changes.failed else "bold"))
    return Panel(Group(*parts), title=title, title_align="left", border_style="red" if changes.failed else ("yellow" if changed else "green"))
