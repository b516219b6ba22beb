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



def test_messages_cut_their_lists_the_same_way():
    import pytest

    from capturelint.errors import CapturelintError
    from capturelint.shard import parse_shard, require_selection

    with pytest.raises(CapturelintError) as raised:
        require_selection(parse_shard("8/8"), [f"v1/M{i}" for i in range(7)])
    assert "(v1/M0, v1/M1, v1/M2, v1/M3, v1/M4 ... and 2 more), so use at most 7 shards" in str(raised.value)
