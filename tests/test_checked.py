"""Every report says what each configuration checked, and says "replay matches eager
execution" only where replay was compared with eager (issue 18, "Say what was
compared"); ``check --require-oracle`` and the ``require-oracle`` setting make a
configuration without a comparison an error.

A bare ``torch.cuda.CUDAGraph`` has no Python that re-runs on replay, so no replay step
gets a shadow; without an eager twin nothing numerical is compared. The programs below
are plain PyTorch, written to a temporary folder and checked with ``check --target``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import referencing
import referencing.jsonschema

from capturelint.cli import main
from capturelint.report import Checked, ConfigReport, Report, code_ranges

SCHEMA_PATH = Path(__file__).parent / "data" / "sarif-schema-2.1.0.json"

PROGRAM = '''
import torch
from capturelint.target import Target

DEV = "cuda" if torch.cuda.is_available() else "cpu"
STEPS = 3


class Server:
    """One linear layer captured into a bare CUDA graph, replayed once per batch."""

    def __init__(self, rebind: bool = False):
        torch.manual_seed(0)
        self.rebind = rebind
        self.lin = torch.nn.Linear(8, 8).to(DEV)
        self.x = torch.zeros(4, 8, device=DEV)
        self.graph = None

    def batch(self, i):
        return torch.full((4, 8), float(i), device=DEV)

    def run(self):
        with torch.no_grad():
            if self.graph is None:
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph):
                    self.y = self.lin(self.x)
            out = []
            for i in range(STEPS):
                if self.rebind:
                    self.x = self.batch(i)  # the graph keeps reading the tensor it captured
                else:
                    self.x.copy_(self.batch(i))
                self.graph.replay()
                out.append(self.y.clone())
            return out

    def eager(self):
        with torch.no_grad():
            return [self.lin(self.batch(i)) for i in range(STEPS)]


def bare():
    s = Server()
    return Target(run=s.run, roots={"server": s}, runner="torch", mode="bare")


def twin():
    s = Server()
    return Target(run=s.run, roots={"server": s}, eager=s.eager, runner="torch", mode="twin")


def both():
    return [twin(), bare()]


def stale():
    s = Server(rebind=True)
    return Target(run=s.run, roots={"server": s}, runner="torch", mode="bare")
'''

BARE_STATEMENT = "no findings in 1 configuration: structural rules only, replay NOT compared with eager (bare graph, no eager twin given)"
BARE_CHECKED = {"rules": ["CL104", "CL106", "CL108", "CL109", "CL110", "CL111", "CL112", "CL113", "CL114", "CL115", "CL116"],
                "unchecked_rules": ["CL101", "CL102", "CL103", "CL105", "CL107", "CL201", "CL202", "CL203"],
                "shadowed_steps": 0, "bare_replays": 3, "eager_twin": False, "exercised": []}


@pytest.fixture
def program(tmp_path, monkeypatch) -> str:
    path = tmp_path / "server.py"
    path.write_text(PROGRAM)
    monkeypatch.chdir(tmp_path)
    return "server.py"


def check(capsys, *args) -> tuple[int, str, str]:
    code = main(["check", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    resource = referencing.Resource.from_contents(schema, default_specification=referencing.jsonschema.DRAFT4)
    registry = referencing.Registry().with_resource(schema["id"], resource)
    return jsonschema.Draft4Validator(schema, registry=registry)


# ------------------------------------------------------- a bare graph, no eager twin


def test_a_bare_graph_without_a_twin_never_says_matches_in_any_format(capsys, program, validator):
    code, out, err = check(capsys, "--target", f"{program}:bare")
    assert code == 0
    assert out.splitlines()[0] == "replay NOT compared with eager in torch/bare (bare graph, no eager twin given)"
    assert out.rstrip().splitlines()[-1] == f"{BARE_STATEMENT} [targets server.py:bare]"  # the subject said
    texts = [out, err]
    code, out, err = check(capsys, "--target", f"{program}:bare", "--verbose")  # the evidence
    assert code == 0 and " ".join(out.split()).endswith(f"{BARE_STATEMENT} [targets server.py:bare]")  # wrapped
    assert "checked: rules CL104, CL106, CL108-CL116; 3 bare-graph replays, not shadowed; no eager twin" in out
    assert "numerical:" not in out  # no step error "0 over 3 replay steps" for steps never compared
    texts += [out, err]
    for out in texts[::2]:
        assert "replay NOT compared with eager (bare graph, no eager twin given)" in out
        assert "rules with nothing to check: CL101-CL103, CL105, CL107, CL201-CL203" in " ".join(out.replace("│", " ").split())
    for fmt in ("json", "sarif", "github"):
        code, out, err = check(capsys, "--target", f"{program}:bare", "--format", fmt)
        assert code == 0 and err.splitlines() == [f"{BARE_STATEMENT} [targets server.py:bare]"]
        texts += [out, err]
        if fmt == "json":
            doc = json.loads(out)
            assert doc["configurations"][0]["checked"] == BARE_CHECKED
            assert doc["numerical"] == [] and doc["summary"]["not_compared"] == ["torch/bare"]
        elif fmt == "sarif":
            log = json.loads(out)
            assert list(validator.iter_errors(log)) == []
            properties = log["runs"][0]["properties"]
            assert properties["checked"] == [{"runner": "torch", "mode": "bare", **BARE_CHECKED}]
            assert set(properties) == {"checked", "subject"} and properties["subject"]["targets"][0].endswith(":bare")
        else:
            (line,) = out.splitlines()
            assert line.startswith("::warning title=replay not compared with eager (torch/bare)::replay NOT compared "
                                   "with eager (bare graph, no eager twin given)")
    assert not any("replay matches" in text or "matches eager" in text for text in texts)


def test_a_finding_in_a_bare_graph_without_a_twin_still_says_what_was_not_compared(capsys, program):
    code, out, err = check(capsys, "--target", f"{program}:stale", "--format", "json")
    assert code == 1 and [f["code"] for f in json.loads(out)["findings"]] == ["CL104"]
    assert err.splitlines() == ["1 finding (CL104 x1) in 1 configuration; replay NOT compared with eager (bare graph, "
                                "no eager twin given) [targets server.py:stale]"]


# ------------------------------------------------------------ with an eager twin


def test_a_bare_graph_with_a_twin_says_it_compared(capsys, program):
    code, out, err = check(capsys, "--target", f"{program}:twin")
    assert code == 0 and "NOT compared" not in out
    assert out.splitlines() == ["replay matches eager execution in torch/twin (compared: each output with its eager twin)",
                                f"no findings in 1 configuration: replay matches eager execution [targets {program}:twin]"]
    code, out, err = check(capsys, "--target", f"{program}:twin", "--verbose")  # the evidence
    assert code == 0 and "NOT compared" not in out
    assert out.rstrip().splitlines()[-1] == ("no findings in 1 configuration: replay matches eager execution "
                                             f"[targets {program}:twin]")
    assert "checked: rules CL104, CL106, CL108-CL116; 3 bare-graph replays, not shadowed; eager twin compared" in out
    # the twin compared the outputs; no replay step was compared with a shadow
    assert "numerical: max error 0 against the eager twin over 3 replays (not shadowed: no step-by-step comparison)" in out
    code, out, err = check(capsys, "--target", f"{program}:twin", "--format", "json")
    doc = json.loads(out)
    assert doc["configurations"][0]["checked"] == dict(BARE_CHECKED, eager_twin=True)
    assert doc["numerical"][0]["max_logit_error"] == 0.0 and doc["summary"]["not_compared"] == []
    code, out, err = check(capsys, "--target", f"{program}:twin", "--format", "github")
    assert code == 0 and out == ""


def test_configurations_that_compared_and_one_that_did_not_are_told_apart(capsys, program):
    code, out, err = check(capsys, "--target", f"{program}:both", "--format", "json")
    assert code == 0
    assert err.splitlines() == ["no findings in 2 configurations: replay matches eager execution in torch/twin; replay "
                                "NOT compared with eager in torch/bare (bare graph, no eager twin given) "
                                "[targets server.py:both]"]
    assert [n["mode"] for n in json.loads(out)["numerical"]] == ["twin"]


def test_the_bundled_engine_shadows_every_step_and_compares_its_twin(capsys):
    code, out, err = check(capsys, "--runner", "v1", "--mode", "PIECEWISE", "--layers", "1", "--steps", "4",
                           "--format", "json")
    assert code == 0 and err.splitlines() == ["no findings in 1 configuration: replay matches eager execution "
                                              "[engine bundled]"]
    checked = json.loads(out)["configurations"][0]["checked"]
    assert checked["shadowed_steps"] == json.loads(out)["numerical"][0]["replay_steps"] > 0
    assert checked["bare_replays"] == 0 and checked["eager_twin"] is True
    # what the comparison covers: every step the engine ran, by kind, size and how it ran
    entry = re.compile(r"^(prefill|decode|mixed): (.+) tokens \((eager|replayed PIECEWISE)\)$")
    replayed = 0
    for text in checked["exercised"]:
        m = entry.match(text)
        assert m, text
        for size in m[2].split(", "):
            sm = re.fullmatch(r"(\d+)(?:->(\d+))?(?: x(\d+))?", size)
            assert sm, size
            assert sm[2] is None or (int(sm[2]) > int(sm[1]) and m[3] != "eager")  # padded: replays only, upwards
            replayed += int(sm[3] or 1) if m[3] != "eager" else 0
    assert replayed == checked["shadowed_steps"]
    assert any(t.startswith("prefill: ") for t in checked["exercised"])
    assert checked["rules"] == ["CL101", "CL102", "CL103", "CL104", "CL105", "CL106", "CL107", "CL201", "CL202",
                                "CL203"]
    # the bare-graph and training-graph rules: no bare graph here
    assert checked["unchecked_rules"] == ["CL108", "CL109", "CL110", "CL111", "CL112", "CL113", "CL114", "CL115", "CL116"]


def test_shadowed_steps_without_a_twin_are_a_comparison(capsys):
    code, out, err = check(capsys, "--target", "tests/toy_engine.py:fixed_targets", "--require-oracle")
    assert code == 0 and out.rstrip().splitlines()[-1] == ("no findings in 2 configurations: replay matches eager "
                                                            "execution [targets tests/toy_engine.py:fixed_targets]")
    assert out.splitlines()[0] == ("replay matches eager execution in all 2 configurations (compared: 6 replay steps with "
                                   "their eager shadow; no eager twin)")
    code, out, err = check(capsys, "--target", "tests/toy_engine.py:fixed_targets", "--require-oracle", "--verbose")
    assert code == 0 and out.rstrip().splitlines()[-1] == ("no findings in 2 configurations: replay matches eager "
                                                            "execution [targets tests/toy_engine.py:fixed_targets]")
    assert "checked: rules CL101-CL107; 3 replay steps shadowed; no eager twin" in out


# --------------------------------------------------------------- --require-oracle


def one_error_line(code: int, out: str, err: str) -> str:
    assert code == 2 and out == "", (code, out, err)
    (line,) = err.splitlines()
    assert line.startswith("capturelint: error: ")
    return line


def test_require_oracle_refuses_a_configuration_without_a_comparison(capsys, program, tmp_path):
    line = one_error_line(*check(capsys, "--target", f"{program}:both", "--require-oracle", "-o", tmp_path / "r.json",
                                 "--format", "json"))
    assert "--require-oracle asks for replay compared with eager execution, and torch/bare (bare graph, no eager twin " \
           "given) replayed graphs without it" in line
    assert "torch/twin" not in line and "eager=FUNCTION" in line
    assert not (tmp_path / "r.json").exists()  # no report that reads as a pass


def test_require_oracle_passes_with_an_eager_twin(capsys, program):
    code, out, err = check(capsys, "--target", f"{program}:twin", "--require-oracle")
    assert code == 0 and "replay matches eager execution" in out


def test_require_oracle_is_an_error_with_findings_too(capsys, program):
    line = one_error_line(*check(capsys, "--target", f"{program}:stale", "--require-oracle"))
    assert "torch/bare (bare graph, no eager twin given)" in line


def test_require_oracle_contradicts_static(capsys, program):
    line = one_error_line(*check(capsys, "--target", f"{program}:twin", "--static", "--require-oracle"))
    assert "which --static skips; drop one of them" in line


def test_the_require_oracle_setting(capsys, program, tmp_path):
    config = tmp_path / "ci.toml"
    config.write_text("[tool.capturelint]\nrequire-oracle = true\n")
    line = one_error_line(*check(capsys, "--target", f"{program}:bare", "--config", config))
    assert "[tool.capturelint] require-oracle asks for replay compared with eager execution, and torch/bare" in line
    assert check(capsys, "--target", f"{program}:twin", "--config", config)[0] == 0
    # --static says itself that replay equivalence was not checked: the setting does not apply
    code, out, err = check(capsys, "--target", f"{program}:bare", "--config", config, "--static")
    assert code == 0 and "replay equivalence was NOT checked" in out
    config.write_text("[tool.capturelint]\nrequire-oracle = false\n")
    assert check(capsys, "--target", f"{program}:bare", "--config", config)[0] == 0
    config.write_text('[tool.capturelint]\nrequire-oracle = "yes"\n')
    line = one_error_line(*check(capsys, "--target", f"{program}:bare", "--config", config))
    assert "[tool.capturelint] require-oracle must be true or false, got a string ('yes')" in line


# ------------------------------------------------------------------ merge, records


def test_merged_shards_keep_what_each_configuration_checked(capsys, program, tmp_path):
    for fmt in ("json", "sarif"):
        whole, s1, s2, merged = (tmp_path / f"{n}.{fmt}" for n in ("whole", "1", "2", "merged"))
        assert check(capsys, "--target", f"{program}:both", "--format", fmt, "-o", whole)[0] == 0
        assert check(capsys, "--target", f"{program}:both", "--format", fmt, "--shard", "1/2", "-o", s1)[0] == 0
        assert check(capsys, "--target", f"{program}:both", "--format", fmt, "--shard", "2/2", "-o", s2)[0] == 0
        assert main(["merge", str(s2), str(s1), "-o", str(merged)]) == 0
        assert merged.read_bytes() == whole.read_bytes()
        head = {"json": "no findings in 2 configurations: replay matches eager execution in torch/twin",
                "sarif": "no findings in 2 merged SARIF logs"}[fmt]
        assert capsys.readouterr().err.splitlines() == [
            f"{head}; replay NOT compared with eager in torch/bare (bare graph, no eager twin given)"
            + " [targets server.py:both]" * (fmt == "json")]


def test_records_read_back_and_say_what_they_compared():
    c = Checked(("CL104", "CL106"), ("CL101",), 0, 3, False)
    assert Checked.from_json(c.to_json()) == c
    assert not c.with_eager and c.not_compared() == "bare graph, no eager twin given"
    mixed = Checked(("CL101",), (), 2, 3, False)
    assert not mixed.with_eager and mixed.not_compared() == "3 bare-graph replays not shadowed, no eager twin given"
    assert Checked((), (), 2, 0, False).with_eager and Checked((), (), 0, 3, True).with_eager
    assert code_ranges(("CL203", "CL101", "CL102", "CL103", "CL105", "CL201", "CL202", "CL901")) == \
        "CL101-CL103, CL105, CL201-CL203, CL901"
    assert code_ranges(("CL104", "CL106")) == "CL104, CL106"


def test_a_configuration_that_replayed_nothing_does_not_read_as_a_match():
    failed = ConfigReport("v1", "FULL", "narrow", [], None, [], note="the capture failed on a host synchronisation",
                          checked=Checked(("CL106",), (), 0, 0, False))
    compared = ConfigReport("v1", "PIECEWISE", "narrow", [], None, [], checked=Checked(("CL101",), (), 4, 0, True))
    assert Report([failed, compared]).summary_line() == (
        "no findings in 2 configurations: replay matches eager execution in v1/PIECEWISE; nothing replayed in v1/FULL "
        "(see its note)")
    assert Report([failed, compared]).oracle_missing("--require-oracle") is None  # its finding or note says why


def test_exercised_names_each_kind_of_step_its_sizes_and_how_it_ran():
    from types import SimpleNamespace as Step

    from capturelint.adapters.bundled.plan import exercised

    def step(tokens, padded, prefills, reqs, decode, mode):
        return Step(num_tokens=tokens, num_padded=padded, num_prefills=prefills, req_ids=tuple(range(reqs)),
                    uniform_decode=decode, runtime_mode=Step(name=mode) if mode else None,
                    descriptor=object() if mode else None)

    steps = [step(5, 5, 2, 2, False, None), step(2, 2, 0, 2, True, "FULL"), step(3, 4, 0, 3, True, "FULL"),
             step(3, 4, 0, 3, True, "FULL"), step(6, 8, 1, 3, False, "PIECEWISE"), step(7, 8, 1, 3, False, None)]
    assert exercised(Step(steps=steps)) == ("prefill: 5 tokens (eager)", "decode: 2, 3->4 x2 tokens (replayed FULL)",
                                            "mixed: 6->8 tokens (replayed PIECEWISE)", "mixed: 7 tokens (eager)")
    assert exercised(Step(steps=[])) == ()  # nothing ran: nothing said
