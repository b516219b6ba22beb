"""``check --shard K/N`` and ``capturelint merge``: the shards of a check partition it,
and merging their reports gives the unsharded check's report, byte for byte, with its
exit status (issue 11, "Beyond one machine").

The JSON reports compared are real, independent runs: the unsharded check and each
shard run their configurations themselves. The SARIF, GitHub and Rich runs reuse the
configurations' results (the checker is deterministic; ``_memo_configurations``):
they test how shards are written and joined, not the engine again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

import pytest

from capturelint.cli import main
from capturelint.shard import ShardInfo, parse_shard, positions, select

FAILING = ["--runner", "all", "--mode", "PIECEWISE,FULL", "--layers", "2", "--steps", "6", "--eager-region", "narrow"]
# findings in v1/PIECEWISE only: shard 1 of 2 fails, shard 2 passes
FRESH = [*FAILING, "--fresh-metadata", "--jobs", "1"]  # findings in v1/PIECEWISE (shard 1 of 2) and v1/FULL (2 of 2)
CLEAN = ["--runner", "v2", "--mode", "PIECEWISE,FULL", "--layers", "2", "--steps", "6"]
LABELS = ["v1/PIECEWISE", "v1/FULL", "v2/PIECEWISE", "v2/FULL"]
TOY = "tests/toy_engine.py:stale_targets"


def cli(*args: str) -> int:
    return main([str(a) for a in args])


def one_line_error(capsys, code: int) -> str:
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("capturelint: error: "), err
    return lines[0]


_MEMO: dict = {}


@contextlib.contextmanager
def memo_configurations():
    """Run each configuration of the bundled engine once for the module, whatever shard
    asks for it (see the module docstring), within this block only: for checks run with
    ``--jobs 1``, whose configurations run in this process."""
    import capturelint.adapters.bundled.plan as bundled

    real = bundled.run_configuration

    def run_configuration(plan, runner, mode, shadow=True, static=False):
        neutral = {f.name: None for f in dataclasses.fields(plan) if f.name in ("shard", "jobs")}
        key = (dataclasses.replace(plan, runners=(), modes=(), **neutral), runner, mode, shadow, static)
        if key not in _MEMO:
            _MEMO[key] = real(plan, runner, mode, shadow=shadow, static=static)
        return _MEMO[key]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bundled, "run_configuration", run_configuration)
        yield


def _run_all(folder: Path, options: list[str], formats: tuple[str, ...], shards: int = 2) -> dict:
    """The unsharded check and its shards, each format: ``{(fmt, None|k): (status, path)}``."""
    out = {}
    for fmt in formats:
        for k in (None, *range(1, shards + 1)):
            path = folder / f"{fmt}-{'all' if k is None else k}.out"
            shard = [] if k is None else ["--shard", f"{k}/{shards}"]
            out[(fmt, k)] = (cli("check", *options, *shard, "--format", fmt, "-o", path), path)
    return out


@pytest.fixture(scope="module")
def failing(tmp_path_factory):
    """v1 with the narrow region: real runs, JSON (exit 1)."""
    return _run_all(tmp_path_factory.mktemp("failing"), FAILING, ("json",))


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """v1 with the narrow region and fresh metadata, findings in both shards: every
    format, each configuration run once (``memo_configurations``)."""
    with memo_configurations():
        return _run_all(tmp_path_factory.mktemp("fresh"), FRESH, ("json", "sarif", "github", "rich"))


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """v2 with its own region: real runs, JSON (exit 0)."""
    return _run_all(tmp_path_factory.mktemp("clean"), CLEAN, ("json",))


# --------------------------------------------------------------- the shards


def test_shards_partition_every_plan_deterministically():
    for total in range(1, 10):
        items = list(range(total))
        for n in range(1, total + 1):
            shards = [select(items, (k, n)) for k in range(1, n + 1)]
            assert sorted(x for s in shards for x in s) == items, (total, n)  # every item once
            assert all(s for s in shards) and max(map(len, shards)) - min(map(len, shards)) <= 1
            assert all(s == sorted(s) for s in shards)  # report order kept within a shard
        assert not positions(total, (total + 1, total + 1))  # more shards than items: one selects nothing
    assert select(LABELS, (1, 2)) == ["v1/PIECEWISE", "v2/PIECEWISE"]  # round-robin, not blocks
    assert select(LABELS, (2, 3)) == ["v1/FULL"] and select(LABELS, None) == LABELS


def test_parse_shard_accepts_k_of_n():
    assert parse_shard("1/1") == (1, 1) and parse_shard(" 3/4 ") == (3, 4)


def test_each_shard_report_names_its_shard_and_the_whole_plan(failing):
    checks = set()
    for k in (1, 2):
        status, path = failing[("json", k)]
        doc = json.loads(path.read_text())
        checks.add(doc["shard"].pop("check"))  # the check's fingerprint (tests/test_io_faults.py, N8)
        assert doc["shard"] == {"index": k, "count": 2, "configurations": LABELS}
        assert [f"{c['runner']}/{c['mode']}" for c in doc["configurations"]] == select(LABELS, (k, 2))
        assert status == (1 if k == 1 else 0)  # v1/PIECEWISE is in shard 1
        assert bool(doc["summary"]["findings"]) == (k == 1)
    assert len(checks) == 1  # both are shards of one check
    whole = json.loads(failing[("json", None)][1].read_text())
    assert "shard" not in whole and [f"{c['runner']}/{c['mode']}" for c in whole["configurations"]] == LABELS


# ------------------------------------------------------------------ merging


def test_merged_shards_are_the_unsharded_json_byte_for_byte_and_exit_1(failing, tmp_path, capsys):
    status, whole = failing[("json", None)]
    assert status == 1
    for order in ((1, 2), (2, 1)):
        merged = tmp_path / f"merged-{order}.json"
        code = cli("merge", *(failing[("json", k)][1] for k in order), "-o", merged)
        assert code == status
        assert merged.read_bytes() == whole.read_bytes()
    assert capsys.readouterr().err.splitlines()[-1] == "4 findings (CL101 x2, CL201 x2) in 4 configurations [engine bundled]"


def test_merged_clean_shards_are_the_unsharded_json_and_exit_0(clean, tmp_path):
    status, whole = clean[("json", None)]
    assert status == 0 and [clean[("json", k)][0] for k in (1, 2)] == [0, 0]
    merged = tmp_path / "merged.json"
    assert cli("merge", clean[("json", 1)][1], clean[("json", 2)][1], "-o", merged) == 0
    assert merged.read_bytes() == whole.read_bytes()
    assert json.loads(whole.read_text())["invariants"]  # the invariants' totals were summed over the shards


def test_merge_exit_zero(failing, tmp_path):
    assert cli("merge", failing[("json", 1)][1], failing[("json", 2)][1], "--exit-zero", "-o", tmp_path / "m") == 0


def test_merged_sarif_shards_are_the_unsharded_sarif(fresh, tmp_path):
    status, whole = fresh[("sarif", None)]
    assert status == 1
    shards = [fresh[("sarif", k)][1] for k in (1, 2)]
    for k, path in enumerate(shards, 1):
        run = json.loads(path.read_text())["runs"][0]
        assert run["properties"]["shard"].pop("check")
        assert run["properties"]["shard"] == {"index": k, "count": 2, "configurations": LABELS}
        # what each configuration of the shard checked: shard k runs every 2nd from the k-th
        assert [f"{c['runner']}/{c['mode']}" for c in run["properties"]["checked"]] == LABELS[k - 1::2]
        assert run["results"]  # both shards have results: their order is restored by the merge
    properties = json.loads(whole.read_text())["runs"][0]["properties"]
    assert list(properties) == ["checked", "subject"] and properties["subject"] == {"engine": "bundled"}
    assert [f"{c['runner']}/{c['mode']}" for c in properties["checked"]] == LABELS
    merged = tmp_path / "merged.sarif"
    assert cli("merge", shards[1], shards[0], "-o", merged) == 1
    assert merged.read_bytes() == whole.read_bytes()
    # the shards' JSON reports give the same SARIF log (the CI example's path)
    from_json = tmp_path / "from-json.sarif"
    assert cli("merge", fresh[("json", 2)][1], fresh[("json", 1)][1], "--format", "sarif", "-o", from_json) == 1
    assert from_json.read_bytes() == whole.read_bytes()


def test_merged_json_github_and_rich_are_the_unsharded_ones(fresh, tmp_path):
    shards = [fresh[("json", k)][1] for k in (1, 2)]
    for fmt in ("json", "github"):
        merged = tmp_path / f"merged.{fmt}"
        assert cli("merge", *shards, "--format", fmt, "-o", merged) == 1
        assert merged.read_text() == fresh[(fmt, None)][1].read_text() != ""
    rich = tmp_path / "merged.rich"
    assert cli("merge", *shards, "--format", "rich", "-o", rich) == 1
    expected = fresh[("rich", None)][1].read_text()
    hint = expected.rstrip("\n").rsplit("\n", 1)[1]
    assert hint.startswith("hint: run `capturelint suggest")  # merge does not know the check's options
    assert rich.read_text() == expected[: -len(hint) - 1]


def test_unsharded_reports_of_different_configurations_merge_in_the_order_given(tmp_path):
    base = ["--runner", "v2", "--layers", "2", "--steps", "6", "--format", "json", "--jobs", "1"]
    paths = {}
    with memo_configurations():
        for modes in ("PIECEWISE", "FULL", "PIECEWISE,FULL"):
            paths[modes] = tmp_path / f"{modes}.json"
            assert cli("check", *base, "--mode", modes, "-o", paths[modes]) == 0
    merged = tmp_path / "merged.json"
    assert cli("merge", paths["PIECEWISE"], paths["FULL"], "-o", merged) == 0
    assert merged.read_bytes() == paths["PIECEWISE,FULL"].read_bytes()


def test_target_shards_merge_into_the_unsharded_target_report(tmp_path):
    whole, s1, s2, merged = (tmp_path / n for n in ("whole.json", "1.json", "2.json", "merged.json"))
    assert cli("check", "--target", TOY, "--format", "json", "-o", whole) == 1
    assert cli("check", "--target", TOY, "--shard", "1/2", "--format", "json", "-o", s1) == 1
    assert cli("check", "--target", TOY, "--shard", "2/2", "--format", "json", "-o", s2) == 1
    assert json.loads(s2.read_text())["shard"]["configurations"] == ["toy/PIECEWISE", "toy/FULL"]
    assert [c["mode"] for c in json.loads(s2.read_text())["configurations"]] == ["FULL"]
    assert cli("merge", s2, s1, "-o", merged) == 1
    assert merged.read_bytes() == whole.read_bytes()


def test_a_report_reads_back_to_itself(failing, clean):
    from capturelint.report import Report

    for runs in (failing, clean):
        for k in (None, 1, 2):
            doc = json.loads(runs[("json", k)][1].read_text())
            assert Report.from_json(doc).to_json() == doc


def test_records_read_back_to_themselves():
    from capturelint.findings import Condition, Finding, Frame, Numerical
    from capturelint.regions import GraphMap, SegmentMap
    from capturelint.runtime.protocol import SegmentKind

    for n in (Numerical("v1", "FULL", None, float("nan"), float("inf"), 3), Numerical("v1", "FULL", 0.25, 1e-9, None, 0)):
        doc = n.to_json()
        assert Numerical.from_json(doc).to_json() == doc and isinstance(doc["max_step_error"], (str, float))
    f = Finding("CL104", "stale-input", Condition.R4, "v1", "FULL", "decode/4", "FULL", "decode/4 #0 captured", 0,
                "aten.add.Tensor", "layers.0", "runner.positions", Frame("a.py", 3, "f"), None, "msg", (1, 2), 5,
                allocation_frame=Frame("b.py", 9, "g"), invariant="inv")
    assert Finding.from_json(f.to_json()) == f and Finding.from_json(f.to_json()).to_json() == f.to_json()
    g = GraphMap("decode/4", "PIECEWISE", (SegmentMap(SegmentKind.CAPTURED, None, (("a", (("x", 2), ("y", 1))),)),
                                           SegmentMap(SegmentKind.EAGER, "brk", (("b", (("z", 4),)),))))
    assert GraphMap.from_json(g.to_json()) == g
    bad = dict(g.to_json(), eager_ops=5)
    with pytest.raises(ValueError):
        GraphMap.from_json(bad)


# ------------------------------------------------------------------- errors


@pytest.mark.parametrize("text, says", [
    ("0/2", "the shard K must be from 1 to 2"), ("3/2", "the shard K must be from 1 to 2"),
    ("1/0", "N must be at least 1"), ("2", "--shard takes K/N"), ("1/2/3", "--shard takes K/N"),
    ("a/b", "--shard takes K/N"), ("\u0661/\u0662", "--shard takes K/N"), ("1/99999999999", "--shard takes K/N"),
])
def test_a_bad_shard_is_one_line(capsys, text, says):
    line = one_line_error(capsys, cli("check", "--runner", "v1", "--mode", "PIECEWISE", "--shard", text))
    assert says in line


def test_a_shard_that_selects_nothing_says_how_many_configurations_there_are(capsys):
    line = one_line_error(capsys, cli("check", "--runner", "v1", "--mode", "PIECEWISE,FULL", "--shard", "3/3"))
    assert "--shard 3/3 selects no configuration: there are 2 configurations (v1/PIECEWISE, v1/FULL)" in line
    line = one_line_error(capsys, cli("check", "--target", TOY, "--shard", "3/4"))
    assert "selects no target: there are 2 targets" in line


def test_shard_refuses_the_baseline_gate(capsys, tmp_path):
    for extra in (["--baseline", tmp_path / "base.json"], ["--max-eager-growth", "5"]):
        line = one_line_error(capsys, cli("check", "--runner", "v1", "--shard", "1/2", *extra))
        assert "run check --baseline without --shard" in line


def _sharded(failing):
    return [failing[("json", k)][1] for k in (1, 2)]


def test_incomplete_or_duplicated_shards_are_refused(failing, capsys, tmp_path):
    s1, s2 = _sharded(failing)
    line = one_line_error(capsys, cli("merge", s1))
    assert "shard 2/2 missing: the check has 2 shards and 1 is given" in line
    line = one_line_error(capsys, cli("merge", s1, s2, s1))
    assert f"shard 1/2 is given twice ({s1}, {s1})" in line
    doc = json.loads(s2.read_text())
    doc["shard"]["count"] = 3  # a shard of another split of the same plan
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc))
    line = one_line_error(capsys, cli("merge", s1, other))
    assert f"{other} is shard 2/3" in line and "merge the shards of one check" in line
    doc["shard"]["count"], doc["shard"]["configurations"] = 2, LABELS[:3] + ["v2/FULL_DECODE_ONLY"]
    other.write_text(json.dumps(doc))
    assert "a shard of a check of other configurations" in one_line_error(capsys, cli("merge", s1, other))
    doc["shard"]["configurations"] = LABELS
    doc["configurations"] = doc["configurations"][:1]  # not what shard 2/2 runs
    other.write_text(json.dumps(doc))
    line = one_line_error(capsys, cli("merge", s1, other))
    assert "holds configurations v1/FULL, but shard 2/2 runs v1/FULL, v2/FULL" in line
    assert "merge needs the reports to join" in one_line_error(capsys, cli("merge"))


def test_mixed_inputs_are_refused(failing, fresh, capsys):
    s1, s2 = _sharded(failing)
    whole = failing[("json", None)][1]
    sarif = fresh[("sarif", 2)][1]
    assert f"{s1} is a JSON report and {sarif} a SARIF log" in one_line_error(capsys, cli("merge", s1, sarif))
    assert f"{s1} is a shard (check --shard) and {whole} is not" in one_line_error(capsys, cli("merge", s1, s2, whole))
    assert "configuration v1/PIECEWISE is in both" in one_line_error(capsys, cli("merge", whole, whole))
    line = one_line_error(capsys, cli("merge", sarif, fresh[("sarif", 1)][1], "--format", "rich"))
    assert "SARIF inputs give a SARIF log only" in line


def test_files_that_are_not_reports_are_refused_naming_the_file(failing, capsys, tmp_path):
    s1 = _sharded(failing)[0]
    cases = {
        "missing.json": (None, "does not exist"),
        "text.json": ("not json at all", "is not JSON"),
        "list.json": ("[1, 2]", "is not a capturelint check report"),
        "snapshot.json": ('{"format": "capturelint-snapshot"}', "is a capturelint snapshot, not a capturelint check"),
        "sarif.json": ('{"version": "2.1.0", "runs": [{"tool": {"driver": {"name": "ruff"}}}]}', "SARIF log of 'ruff'"),
        "binary.json": (b"\xff\xfe\x00", "is not JSON"),
    }
    for name, (content, says) in cases.items():
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif content is not None:
            path.write_text(content)
        line = one_line_error(capsys, cli("merge", s1, path))
        assert str(path) in line and says in line, line
    assert "is a directory" in one_line_error(capsys, cli("merge", tmp_path))
    doc = json.loads(s1.read_text())
    for field, value, says in (("capturelint_version", "0.0.1", "by capturelint '0.0.1'"), ("version", 1, "format version 1")):
        path = tmp_path / f"{field}.json"
        path.write_text(json.dumps(dict(doc, **{field: value})))
        line = one_line_error(capsys, cli("merge", path))
        assert str(path) in line and says in line
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(dict(doc, findings=[{"code": "CL101"}])))
    line = one_line_error(capsys, cli("merge", broken, _sharded(failing)[1]))
    assert str(broken) in line and "is not a well-formed capturelint report" in line


def test_shard_info_is_validated():
    check = "0123456789abcdef"
    assert ShardInfo.from_json({"index": 2, "count": 2, "configurations": LABELS, "check": check}).expected == [
        "v1/FULL", "v2/FULL"]
    for bad in ({"index": 3, "count": 2, "configurations": LABELS, "check": check}, {"index": 1, "count": 2},
                {"index": 1, "count": 3, "configurations": ["a", "b"], "check": check},
                {"index": True, "count": 1, "configurations": ["a"], "check": check},
                {"index": 1, "count": 1, "configurations": ["a"]}, {"index": 1, "count": 1, "configurations": ["a"], "check": 7}):
        with pytest.raises(ValueError):
            ShardInfo.from_json(bad)
