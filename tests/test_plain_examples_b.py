"""The worked examples of examples/plain/ for CL111 and CL112, both ways: the hazard
exits 1 with its code and both source lines, the fix exits 0 (no eager twin given)."""

import json
from pathlib import Path

import pytest

from capturelint.cli import main

PLAIN = Path(__file__).resolve().parent.parent / "examples" / "plain"


def check(capsys, spec):
    code = main(["check", "--target", spec, "--format", "json"])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def line_of(name, needle):
    return next(i for i, text in enumerate((PLAIN / name).read_text().splitlines(), 1) if needle in text)


def test_shared_pool_replayed_out_of_capture_order(capsys):
    code, doc, err = check(capsys, "examples/plain/shared_pool.py:targets_bug")
    assert code == 1, err
    [f] = doc["findings"]
    assert (f["code"], f["tensor"], f["op"]) == ("CL111", "server.y_small", "aten.addmm.default")
    assert f["capture_frame"] == {"file": "examples/plain/shared_pool.py", "function": "capture",
                                  "line": line_of("shared_pool.py", "self.y_small = self.model(")}
    assert f["shadow_frame"]["line"] == line_of("shared_pool.py", "self.g_large.replay()  # rewrites")
    assert f"aten.cat.default at examples/plain/shared_pool.py:{line_of('shared_pool.py', 'torch.cat(')}" in f["message"]


def test_event_across_capture_side_stream_joined_after_the_capture(capsys):
    code, doc, err = check(capsys, "examples/plain/event_across_capture.py:targets_bug")
    assert code == 1, err
    [f] = doc["findings"]
    assert (f["code"], f["op"]) == ("CL112", "capture_end")
    assert f["capture_frame"]["line"] == line_of("event_across_capture.py", "# fork: the side stream sees x")
    assert f["shadow_frame"]["line"] == line_of("event_across_capture.py", "with torch.cuda.graph(self.graph):")
    assert doc["numerical"] == []  # the capture failed, as it does on a GPU: nothing was compared


@pytest.mark.parametrize("example", ["shared_pool.py", "event_across_capture.py"])
def test_the_fixed_twin_is_clean(capsys, example):
    code, doc, _ = check(capsys, f"examples/plain/{example}:targets_fixed")
    assert code == 0, doc["findings"]
    assert doc["findings"] == [] and doc["configurations"][0]["checked"]["bare_replays"] > 0
