"""CL112 event-across-capture: plain programs and breakable graphs, rules only (no eager twin)."""

import json
import textwrap

from capturelint.cli import main

HEADER = '''
import torch
from torch import nn
from capturelint.target import Target

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def target(run):
    return [Target(run=run, runner="torch", mode="cudagraph")]
'''


def check(tmp_path, capsys, body: str, func: str = "targets"):
    path = tmp_path / "prog.py"
    path.write_text(HEADER + textwrap.dedent(body))
    code = main(["check", "--target", f"{path}:{func}", "--format", "json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out else None), err, path.read_text().splitlines()


def line_of(lines, needle):
    return next(i for i, text in enumerate(lines, 1) if needle in text)


def only(doc):
    assert [f["code"] for f in doc["findings"]] == ["CL112"], doc["findings"]
    return doc["findings"][0]


EVENT_AFTER_GRAPH = '''
def targets():
    x = torch.randn(4, device=DEVICE)
    side = torch.cuda.Stream()
    ready = torch.cuda.Event()

    def run():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x * 2
            ready.record()                         # RECORD
        {wait}
        outs = []
        for _ in range(2):
            g.replay()
            outs.append(y.clone())
        return outs

    return target(run)
'''


def test_event_recorded_in_the_capture_and_waited_on_after_it(tmp_path, capsys):
    code, doc, err, lines = check(tmp_path, capsys, EVENT_AFTER_GRAPH.format(wait="side.wait_event(ready)  # WAIT"))
    assert code == 1, err
    f = only(doc)
    assert f["capture_frame"]["line"] == line_of(lines, "# RECORD")
    assert f["shadow_frame"]["line"] == line_of(lines, "# WAIT")
    assert f["op"] == "Stream.wait_event" and f["segment"].endswith("#0 captured")
    assert "outside any capture" in f["message"] and "vLLM #56785" in f["message"]
    # the capture failed, as on a GPU: the report says so instead of "matches"
    assert doc["numerical"] == []


def test_a_replay_does_not_record_an_event_recorded_in_the_capture(tmp_path, capsys):
    """A record in a capture is a node internal to the graph: replaying the graph does
    not record the event, so a wait on it after a replay is refused as well."""
    body = EVENT_AFTER_GRAPH.format(wait="g.replay(); side.wait_event(ready)  # WAIT after a replay")
    code, doc, err, lines = check(tmp_path, capsys, body)
    assert code == 1, err
    f = only(doc)
    assert f["capture_frame"]["line"] == line_of(lines, "# RECORD")
    assert f["shadow_frame"]["line"] == line_of(lines, "# WAIT")
    assert "outside any capture" in f["message"]
    assert doc["numerical"] == [] and "matches" not in json.dumps(doc["summary"])


def test_an_external_event_is_recorded_by_every_replay_and_waiting_on_it_is_clean(tmp_path, capsys):
    body = EVENT_AFTER_GRAPH.replace("torch.cuda.Event()", "torch.cuda.Event(external=True)").format(
        wait="g.replay(); side.wait_event(ready)")
    code, doc, err, _ = check(tmp_path, capsys, body)
    assert code == 0, doc["findings"] if doc else err
    assert doc["findings"] == []


def test_an_event_recorded_again_outside_the_capture_is_clean(tmp_path, capsys):
    body = EVENT_AFTER_GRAPH.format(wait="g.replay(); ready.record(); side.wait_event(ready)")
    code, doc, err, _ = check(tmp_path, capsys, body)
    assert code == 0, doc["findings"] if doc else err


def test_host_synchronizing_with_a_captured_event(tmp_path, capsys):
    code, doc, err, lines = check(tmp_path, capsys, EVENT_AFTER_GRAPH.format(wait="ready.synchronize()  # WAIT"))
    assert code == 1, err
    f = only(doc)
    assert (f["op"], f["capture_frame"]["line"], f["shadow_frame"]["line"]) == (
        "Event.synchronize", line_of(lines, "# RECORD"), line_of(lines, "# WAIT"))
    assert "makes the host wait" in f["message"]


SIDE_STREAM = '''
def targets():
    x = torch.randn(8, device=DEVICE)
    side = torch.cuda.Stream()

    def run():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):                          # CAPTURE
            a = x * 2
            side.wait_stream(torch.cuda.current_stream())  # FORK
            with torch.cuda.stream(side):
                b = x + 1
            {join}
            y = a + b
        outs = []
        for _ in range(2):
            x.copy_(torch.randn(8))
            g.replay()
            outs.append(y.clone())
        return outs

    return target(run)
'''


def test_a_side_stream_forked_and_not_joined(tmp_path, capsys):
    code, doc, err, lines = check(tmp_path, capsys, SIDE_STREAM.format(join="pass"))
    assert code == 1, err
    f = only(doc)
    assert f["op"] == "capture_end"
    assert f["capture_frame"]["line"] == line_of(lines, "# FORK")
    assert f["shadow_frame"]["line"] == line_of(lines, "# CAPTURE")
    assert "not joined back" in f["message"] and "stream made at" in f["message"]


def test_a_side_stream_joined_back_is_clean(tmp_path, capsys):
    code, doc, err, _ = check(tmp_path, capsys, SIDE_STREAM.format(join="torch.cuda.current_stream().wait_stream(side)"))
    assert code == 0, doc["findings"] if doc else err


def test_a_join_before_the_side_streams_last_work_does_not_count(tmp_path, capsys):
    # edge: the join waits on the side stream, which then does more work in the capture
    join = "torch.cuda.current_stream().wait_stream(side)\n            with torch.cuda.stream(side):\n                b = b * 3"
    code, doc, err, lines = check(tmp_path, capsys, SIDE_STREAM.format(join=join))
    assert code == 1, err
    assert only(doc)["capture_frame"]["line"] == line_of(lines, "# FORK")


def test_a_capturing_stream_waiting_on_an_event_recorded_before_the_capture(tmp_path, capsys):
    body = '''
    def targets():
        x = torch.randn(4, device=DEVICE)
        before = torch.cuda.Event()

        def run():
            before.record()                              # RECORD
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                torch.cuda.current_stream().wait_event(before)  # WAIT
                y = x * 2
            g.replay()
            return y.clone()

        return target(run)
    '''
    code, doc, err, lines = check(tmp_path, capsys, body)
    assert code == 1, err
    f = only(doc)
    assert (f["capture_frame"]["line"], f["shadow_frame"]["line"]) == (line_of(lines, "# RECORD"), line_of(lines, "# WAIT"))
    assert "recorded outside the capture" in f["message"]


BREAKABLE = '''
from capturelint.runtime.breakable import CUDAGraphWrapper, eager_break_during_capture
from capturelint.runtime.forward_context import BatchDescriptor, CUDAGraphMode, set_forward_context


class Indexer:
    """vLLM #56785 in small: an event recorded in a captured segment, waited on in the eager break."""

    def __init__(self):
        self.x = torch.randn(8, device=DEVICE)
        self.topk = torch.zeros(8, device=DEVICE)
        self.out = torch.zeros(8, device=DEVICE)
        self.side = torch.cuda.Stream()
        self.ready = torch.cuda.Event()

    @eager_break_during_capture
    def convert(self):
        {break_body}
        self.out.copy_(self.topk + 1)

    def forward(self):
        self.topk.copy_(self.x * 2)
        {segment_body}
        self.convert()
        return self.out * 3


def targets():
    idx = Indexer()
    wrapper = CUDAGraphWrapper(idx.forward)

    def run():
        outs = []
        for _ in range(3):  # the first step captures
            idx.x.copy_(torch.randn(8))
            with set_forward_context({{}}, CUDAGraphMode.PIECEWISE, BatchDescriptor(8, True)):
                outs.append(wrapper().clone())
        return outs

    return [Target(run=run, roots={{"indexer": idx}}, runner="breakable", mode="PIECEWISE")]
'''


def test_breakable_event_recorded_in_a_segment_and_waited_on_in_the_eager_break(tmp_path, capsys):
    body = BREAKABLE.format(segment_body="self.ready.record()  # RECORD",
                            break_body="self.side.wait_event(self.ready)  # WAIT")
    code, doc, err, lines = check(tmp_path, capsys, body)
    assert code == 1, err
    f = only(doc)
    assert (f["capture_frame"]["line"], f["shadow_frame"]["line"]) == (line_of(lines, "# RECORD"), line_of(lines, "# WAIT"))
    assert f["graph"] == "decode/8" and f["runtime_mode"] == "PIECEWISE" and f["segment"].endswith("#0 captured")


def test_breakable_event_recorded_and_waited_on_inside_the_eager_break_is_clean(tmp_path, capsys):
    body = BREAKABLE.format(segment_body="pass",
                            break_body="self.ready.record()\n        self.side.wait_event(self.ready)")
    code, doc, err, _ = check(tmp_path, capsys, body)
    assert code == 0, doc["findings"] if doc else err


def test_breakable_event_waited_on_in_a_later_captured_segment(tmp_path, capsys):
    # edge: each captured segment is its own capture; a wait from the next one merges two captures
    body = BREAKABLE.format(segment_body="self.ready.record()  # RECORD", break_body="pass").replace(
        "return self.out * 3",
        "torch.cuda.current_stream().wait_event(self.ready)  # WAIT\n        return self.out * 3")
    code, doc, err, lines = check(tmp_path, capsys, body)
    assert code == 1, err
    f = only(doc)
    assert (f["capture_frame"]["line"], f["shadow_frame"]["line"]) == (line_of(lines, "# RECORD"), line_of(lines, "# WAIT"))
    assert "#2 captured (another capture)" in f["message"]


RECORD_STREAM = '''
def targets():
    x = torch.randn(256, device=DEVICE)
    side = torch.cuda.Stream()

    def forward():
        t = x * 2                                          # ALLOC
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            s = t.sum()                                    # SIDE READ
        {record}
        del t
        u = x + 1                                          # REUSE
        torch.cuda.current_stream().wait_stream(side)
        return u * s

    def run():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = forward()
        outs = []
        for _ in range(2):
            g.replay()
            outs.append(y.clone())
        return outs

    return target(run)
'''


def test_a_tensor_a_side_stream_reads_freed_without_record_stream(tmp_path, capsys):
    code, doc, err, lines = check(tmp_path, capsys, RECORD_STREAM.format(record="pass"))
    assert code == 1, err
    f = only(doc)
    assert (f["op"], f["capture_frame"]["line"], f["shadow_frame"]["line"]) == (
        "aten.sum.default", line_of(lines, "# SIDE READ"), line_of(lines, "# REUSE"))
    assert f"prog.py:{line_of(lines, '# ALLOC')}" in f["message"] and "record_stream" in f["message"]
    assert doc["configurations"][0]["checked"]["bare_replays"] == 2  # a race CUDA does not refuse: the run went on


def test_record_stream_keeps_the_block_until_the_capture_ends(tmp_path, capsys):
    code, doc, err, _ = check(tmp_path, capsys, RECORD_STREAM.format(record="t.record_stream(side)"))
    assert code == 0, doc["findings"] if doc else err


def test_joining_the_side_stream_before_the_memory_is_reused_is_clean(tmp_path, capsys):
    # edge: no record_stream, but the capture stream waits on the side stream before the
    # allocation that reuses the block, so the replayed kernels are ordered
    body = RECORD_STREAM.format(record="torch.cuda.current_stream().wait_stream(side)")
    code, doc, err, _ = check(tmp_path, capsys, body)
    assert code == 0, doc["findings"] if doc else err


# PyTorch's "Usage with multiple streams": the INCORRECT and the CORRECT side stream.
MULTIPLE_STREAMS = '''
def targets():
    x = torch.randn(8, device=DEVICE)
    s = torch.cuda.Stream()

    def run():
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):                          # CAPTURE
            {fork}
            with torch.cuda.stream(s):
                y = x * 2                                  # SIDE WORK
            {join}
        outs = []
        for _ in range(2):
            x.copy_(torch.randn(8))
            g.replay()
            outs.append(y.clone())
        return outs

    return target(run)
'''


def test_work_on_a_stream_that_never_branched_out_of_the_capture(tmp_path, capsys):
    code, doc, err, lines = check(tmp_path, capsys, MULTIPLE_STREAMS.format(fork="pass", join="pass"))
    assert code == 1, err
    f = only(doc)
    assert (f["op"], f["capture_frame"]["line"], f["shadow_frame"]["line"]) == (
        "aten.mul.Tensor", line_of(lines, "# SIDE WORK"), line_of(lines, "# CAPTURE"))
    assert "takes no part in captured segment" in f["message"]
    assert doc["configurations"][0]["checked"]["bare_replays"] == 2  # not refused: the run went on


def test_work_on_a_stream_forked_and_joined_as_pytorch_shows_is_clean(tmp_path, capsys):
    body = MULTIPLE_STREAMS.format(fork="s.wait_stream(torch.cuda.current_stream())",
                                   join="torch.cuda.current_stream().wait_stream(s)")
    code, doc, err, _ = check(tmp_path, capsys, body)
    assert code == 0, doc["findings"] if doc else err
