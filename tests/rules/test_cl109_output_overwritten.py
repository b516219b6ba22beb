"""CL109: a bare graph's output read through a reference taken before a later replay."""

from __future__ import annotations

from bare_programs import check, codes, line_of, write

RUNNER = """
class Runner:
    def __init__(self):
        torch.manual_seed(0)
        self.model = nn.Linear(4, 4).to(DEV).eval()
        self.static_x = torch.zeros(4, 4, device=DEV)

    @torch.no_grad()
    def capture(self):
        self.model(self.static_x)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.static_y = self.model(self.static_x)

    @torch.no_grad()
    def run(self, step, n=2):
        self.static_x.fill_(float(step))
        self.graph.replay()
        return self.static_y[:n]


def kept_views():
    r = Runner()
    r.capture()
    a = r.run(1)
    b = r.run(2)
    return a + b  # a holds step 2's values


def read_in_time():
    r = Runner()
    r.capture()
    first = r.run(1).sum(0)  # read before the next replay
    return first + r.run(2).sum(0)


def copied():
    r = Runner()
    r.capture()
    a = r.run(1).clone()
    return a + r.run(2)


def view_made_before_the_first_replay():
    r = Runner()
    r.capture()
    rows = r.static_y[:2]  # a view of the output buffer, set up once
    outs = []
    for step in range(3):
        r.run(step)
        outs.append(rows.clone())
    return outs


def view_made_after_the_first_replay_and_read_every_step():
    r = Runner()
    r.capture()
    rows, outs = None, []
    for step in range(3):
        r.run(step)
        if rows is None:
            rows = r.static_y[:2]  # set up lazily, then read after every replay
        outs.append(rows.clone())
    return outs


def handles_collected():
    r = Runner()
    r.capture()
    outs = []
    for step in range(3):
        r.run(step)
        outs.append(r.static_y)
    return torch.cat(outs)


def targets():
    return Target(run=kept_views, runner="plain", mode="graph")


def fixed():
    return [Target(run=fn, runner="plain", mode=fn.__name__)
            for fn in (read_in_time, copied, view_made_before_the_first_replay,
                       view_made_after_the_first_replay_and_read_every_step)]


def repeated():
    return Target(run=handles_collected, runner="plain", mode="graph")


@torch.no_grad()
def kept_views_eager():
    r = Runner()
    rows = [r.model(torch.full((4, 4), float(step), device=DEV))[:2] for step in (1, 2)]
    return rows[0] + rows[1]


def with_twin():
    return Target(run=kept_views, eager=kept_views_eager, runner="plain", mode="graph")
"""


def test_a_view_returned_by_run_and_read_after_the_next_replay(tmp_path, capsys):
    path = write(tmp_path, RUNNER)
    code, doc = check(capsys, path)
    assert code == 1 and codes(doc) == ["CL109"]
    (f,) = doc["findings"]
    assert (f["tensor"], f["op"], f["condition"]) == ("r.static_y", "aten.add.Tensor", "R7")
    assert f["shadow_frame"]["line"] == line_of(path, "return a + b")  # the line that read it
    assert f["capture_frame"]["line"] == line_of(path, "self.static_y = self.model(self.static_x)")
    file = f["shadow_frame"]["file"]
    assert f"view taken at {file}:{line_of(path, 'return self.static_y[:n]')} after replay 1" in f["message"]
    assert f"replay 2 (at {file}:{line_of(path, 'self.graph.replay()')})" in f["message"]
    assert f["steps"] == [2] and doc["numerical"] == []  # rules only


def test_reading_in_time_copying_or_a_view_set_up_before_the_replays_is_clean(tmp_path, capsys):
    code, doc = check(capsys, write(tmp_path, RUNNER), "fixed")
    assert code == 0 and doc["findings"] == []
    assert len(doc["configurations"]) == 4 and all(c["checked"]["bare_replays"] for c in doc["configurations"])


def test_a_list_that_collected_the_output_tensor_itself(tmp_path, capsys):
    path = write(tmp_path, RUNNER)
    code, doc = check(capsys, path, "repeated")
    assert code == 1 and codes(doc) == ["CL109"]
    (f,) = doc["findings"]
    assert (f["tensor"], f["op"]) == ("r.static_y", "aten.cat.default")
    assert f["shadow_frame"]["line"] == line_of(path, "return torch.cat(outs)")
    assert "3 times through one list argument" in f["message"] and "replay 3" in f["message"]


def test_with_an_eager_twin_the_divergence_is_cl109_not_cl901(tmp_path, capsys):
    code, doc = check(capsys, write(tmp_path, RUNNER), "with_twin")
    assert code == 1 and codes(doc) == ["CL109"]
    assert doc["numerical"][0]["max_logit_error"] > 0.01  # step 1's rows were overwritten by step 2's
