"""Long lists are cut at five, one way everywhere (``capturelint.lists``)."""

from __future__ import annotations

from capturelint.lists import LIST_CUT, and_more, cut, cut_list, shown


def test_a_long_list_shows_five_and_counts_the_rest():
    items = [f"v1/{m}" for m in "ABCDEFGH"]
    assert cut(items) == "v1/A, v1/B, v1/C, v1/D, v1/E ... and 3 more"
    assert cut_list(items, lambda n: f"+{n}") == items[:5] + ["+3"]
    assert shown(items) == (items[:5], 3)


def test_a_list_of_five_or_fewer_is_whole():
    five = ["a", "b", "c", "d", "e"]
    assert LIST_CUT == 5
    assert cut(five) == "a, b, c, d, e"
    assert cut_list(five, and_more) == five
    assert shown(five) == (five, 0)


def test_edges_empty_and_one_over():
    assert cut([]) == ""
    assert cut_list([], and_more) == []
    assert cut(list("abcdef")) == "a, b, c, d, e ... and 1 more"
    assert cut(list("abc"), limit=2) == "a, b ... and 1 more"

