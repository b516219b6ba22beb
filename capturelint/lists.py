"""Long lists, cut: every message and rendering shows at most five items of a list, then
says how many more there are (``a, b, c, d, e ... and 3 more``).

``cut`` joins strings on one line; ``cut_list`` keeps items one per line (findings,
table rows, diagram notes) and ends with the line ``more`` makes of the count left out;
``shown`` is the two halves, for a caller that prints each item itself. The JSON reports
cut nothing: they list every item.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

T = TypeVar("T")

LIST_CUT = 5


def shown(items: Sequence[T], limit: int = LIST_CUT) -> tuple[list[T], int]:
    """The first ``limit`` items, and how many more there are."""
    return list(items[:limit]), max(0, len(items) - limit)


def and_more(n: int) -> str:
    """What stands for the ``n`` items left out: ``... and 3 more``."""
    return f"... and {n} more"


def cut(items: Sequence[str], limit: int = LIST_CUT) -> str:
    """``a, b, c, d, e ... and 3 more``: at most ``limit`` items on one line."""
    head, more = shown(items, limit)
    return ", ".join(head) + (f" {and_more(more)}" if more else "")


def cut_list(items: Sequence[T], more: Callable[[int], T], limit: int = LIST_CUT) -> list[T]:
    """At most ``limit`` items, then ``more(n)`` for the ``n`` left out (nothing when none is)."""
    head, left = shown(items, limit)
    return head + [more(left)] if left else head


__all__ = ["LIST_CUT", "and_more", "cut", "cut_list", "shown"]
