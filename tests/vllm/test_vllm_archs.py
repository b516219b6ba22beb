"""``--engine vllm --model``: the architectures it checks, the table of vLLM's list, and
the generic attention family (vLLM's own Qwen3/Llama model classes on vLLM's own
runners): a clean check, and a planted region hazard flagged exactly where an untraced
graph run differs from its eager twin."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from capturelint.report import finding_entries

from vllm_required import require_vllm  # tests/vllm/vllm_required.py

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "capturelint", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("name, says", [
    ("Gpt2ForCausalLM", "unknown architecture 'Gpt2ForCausalLM'"),
    ("KimiK3ForConditionalGeneration", "architecture KimiK3ForConditionalGeneration is not supported yet (Kimi K3"),
])
def test_an_unknown_or_unsupported_model_is_one_line_naming_the_supported(name, says):
    done = _cli("check", "--engine", "vllm", "--model", name)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], lines
    from capturelint.adapters.vllm import archs

    assert f"{', '.join(archs.SUPPORTED)} or all" in lines[0] and archs.SUPPORTED[:3] == (
        "DeepseekV4ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM")


def test_deepseek_v4_options_are_refused_with_another_model():
    done = _cli("check", "--engine", "vllm", "--model", "qwen3forcausallm", "--eager-region", "narrow")
    assert done.returncode == 2 and "--eager-region forces DeepSeek V4's attention regions" in done.stderr


def test_deepseek_v4_settings_are_refused_with_another_model_not_ignored():
    import dataclasses

    from capturelint.adapters import registry
    from capturelint.errors import CapturelintError
    from capturelint.options import EagerRegion
    from capturelint.settings import Settings

    settings = dataclasses.replace(Settings(), eager_region=EagerRegion.WIDE)
    with pytest.raises(CapturelintError, match="--eager-region forces DeepSeek V4's attention regions"):
        registry.make_plan(settings, registry.engine_options(engine="vllm", model="LlamaForCausalLM"))
    # the default architecture takes it
    assert registry.make_plan(settings, registry.engine_options(engine="vllm")).eager_region is EagerRegion.WIDE


def test_suggest_refuses_model_all():
    done = _cli("suggest", "--engine", "vllm", "--model", "all")
    assert done.returncode == 2 and "suggest finds the eager region of one architecture" in done.stderr, done.stderr


def test_model_all_labels_each_architectures_configurations():
    from capturelint.adapters import registry
    from capturelint.adapters.vllm import archs
    from capturelint.settings import Settings

    plan = registry.make_plan(Settings(), registry.engine_options(engine="vllm", model="all", runner="v2",
                                                                   mode="PIECEWISE"))
    assert [f"{r}/{m}" for r, m in plan.all_configurations] == [f"{a}:v2/PIECEWISE" for a in archs.SUPPORTED]
    assert {i.id for i in plan.invariants} == {"dsv4-v1-attention-prep-eager", "dsv4-sparse-attention-eager",
                                               "attention-eager", "mla-attention-eager", "kda-eager",
                                               "kimi-mla-attention-eager", "gdn-core-eager",
                                               "mamba2-mixer-eager", "hybrid-attention-eager",
                                               "sparse-mla-indexer-attention-eager"}
    default = registry.make_plan(Settings(), registry.engine_options(engine="vllm"))
    assert default.knobs.model == "DeepseekV4ForCausalLM" and default.configured is None


def test_the_tables_step_loop_column_is_the_plans():
    from capturelint.adapters import registry
    from capturelint.adapters.vllm import archs, plan as vllm_plan
    from capturelint.settings import Settings

    require_vllm()
    plan = registry.make_plan(Settings(), registry.engine_options(engine="vllm", model="all"))
    for label, mode in plan.all_configurations:
        arch, _ = archs.split_label(label)
        loop = vllm_plan.step_loop(plan, label, vllm_plan.CUDAGraphMode(mode)).__name__
        assert (loop == "ReproducedLoop") == (archs.step_loop(arch, mode) == "reproduction"), (label, mode, loop)


def test_every_name_of_vllms_list_has_a_row():
    require_vllm()
    from vllm.config.vllm import DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES

    from capturelint.adapters.vllm import archs

    assert archs.VLLM_LIST == DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES
    rows = archs.table({"configurations": [], "findings": []})
    named = {row[0] for row in rows} | {a.name for a in archs.CHECKED}
    assert DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES <= named
    assert all(verdict.startswith("not supported yet: ") and len(verdict) > 40 for *_, verdict in rows)


def stored_reports() -> list[dict]:
    """The stored ``--model ARCH`` reports, one per checked architecture, in the order of
    ``archs.SUPPORTED`` (``bench/bench_vllm_archs.py --write`` renews them)."""
    from capturelint.adapters.vllm import archs

    stored = {p.stem: json.loads(p.read_text()) for p in sorted((DATA / "model_all").glob("*.json"))}
    assert sorted(stored) == sorted(archs.SUPPORTED), "one stored report per checked architecture"
    return [stored[a] for a in archs.SUPPORTED]


def test_the_architectures_doc_is_the_table_of_the_stored_reports():
    """``docs/vllm-architectures.md`` is what ``python -m capturelint.adapters.vllm.archs``
    makes of the stored reports; each is its architecture's, both runners and modes."""
    from capturelint.adapters.vllm import archs

    reports = stored_reports()
    for arch, report in zip(archs.SUPPORTED, reports):
        assert report["subject"] == ({"engine": "vllm"} if arch == archs.DEFAULT else {"engine": "vllm", "model": arch})
        labels = {(c["runner"], c["mode"]) for c in archs.labelled(report)["configurations"]}
        assert labels == {(f"{arch}:{r}", m) for r in ("v1", "v2") for m in ("PIECEWISE", "FULL")}, arch
    assert (ROOT / "docs" / "vllm-architectures.md").read_text() == archs.markdown(reports)


def test_a_model_all_report_and_the_per_architecture_reports_make_the_same_table():
    """A ``--model all`` report (its labels ``ARCH:runner``) and single-architecture
    reports (plain labels, the architecture in the subject) give the same rows."""
    from capturelint.adapters.vllm import archs

    reports = stored_reports()
    joined = {"subject": {"engine": "vllm", "model": "all"},
              "configurations": [c for r in reports for c in archs.labelled(r)["configurations"]],
              "findings": [f for r in reports for f in archs.labelled(r)["findings"]],
              "numerical": [n for r in reports for n in archs.labelled(r)["numerical"]]}
    assert archs.table(joined) == archs.table(reports)
    planted = {**joined, "findings": [{"runner": f"{archs.SUPPORTED[-1]}:v1", "mode": "FULL", "code": "CL104",
                                       "location": {"file": "vllm/x.py", "line": 7}}],
               "numerical": [{"runner": f"{archs.SUPPORTED[-1]}:v1", "mode": "FULL", "token_agreement": 0.5,
                              "max_logit_error": 2.0}]}
    rows = {(r[0], r[2], r[3]): r[4] for r in archs.table(planted)}
    assert rows[(archs.SUPPORTED[-1], "v1", "FULL")] == "corrupting: CL104 at vllm/x.py:7 (1 finding)"
    agreed = {**planted, "numerical": [{"runner": f"{archs.SUPPORTED[-1]}:v1", "mode": "FULL", "token_agreement": 1.0,
                                        "max_logit_error": 0.0}]}
    rows = {(r[0], r[2], r[3]): r[4] for r in archs.table(agreed)}
    assert rows[(archs.SUPPORTED[-1], "v1", "FULL")] == \
        "hazard (outputs agreed with eager in this workload): CL104 at vllm/x.py:7 (1 finding)"
    assert rows[(archs.SUPPORTED[-1], "v2", "FULL")] == "safe"


def test_a_model_all_report_prints_the_table_under_its_rich_report():
    """``check --model all`` (and ``merge`` of its shards) print the table: one row per
    architecture, runner and mode, then the names of vLLM's list not checked; a single
    architecture's report prints none."""
    import io

    from rich.console import Console

    from capturelint.adapters import registry
    from capturelint.adapters.vllm import archs
    from capturelint.report import Report
    from capturelint.reporters import Options, reporter

    reports = stored_reports()
    joined = {**reports[0], "subject": {"engine": "vllm", "model": "all"},
              **{key: [e for r in reports for e in archs.labelled(r)[key]]
                 for key in ("configurations", "findings", "numerical")}}
    report = Report.from_json(joined)
    columns, rows = registry.table(report)
    assert columns == ("architecture", "family", "runner", "mode", "breakable graphs")
    assert len(rows) == 4 * len(archs.SUPPORTED) + len(archs.NOT_YET)
    assert ("Qwen3ForCausalLM", "generic attention", "v2", "FULL", "safe") in rows
    out = io.StringIO()
    reporter("check", "rich").render(report, Console(file=out, width=200), Options(table=(columns, rows)))
    text = out.getvalue()
    assert all(name in text for name in archs.ARCHS)
    assert text.index("breakable graphs") < text.rindex(report.summary_line().split(" [")[0])
    single = Report.from_json(reports[1])
    assert registry.table(single) is None


def test_a_generic_attention_model_checks_clean_in_process():
    """The family's small configuration in the default suite: one layer of vLLM's own
    Qwen3 on vLLM's own V2 runner, PIECEWISE, three steps (prefill, mixed, padded decode)."""
    require_vllm()
    from capturelint import api

    report = api.check(engine="vllm", model="Qwen3ForCausalLM", runner="v2", mode="PIECEWISE", layers=1, steps=3,
                       jobs=1)
    assert report.findings == []
    (cfg,) = report.configs
    assert (cfg.runner, cfg.mode) == ("v2", "PIECEWISE")
    assert cfg.numerical.token_agreement == 1.0 and cfg.numerical.max_logit_error == 0.0
    assert cfg.checked.shadowed_steps == 3 and cfg.checked.eager_twin
    assert report.invariant_selection() == {"attention-eager": report.invariant_selection()["attention-eager"]}
    assert report.invariant_selection()["attention-eager"] > 0  # the attention, in its break


@pytest.mark.slow
def test_a_generic_attention_model_checks_clean_on_vllms_own_runners(tmp_path):
    require_vllm()
    out = tmp_path / "report.json"
    done = _cli("check", "--engine", "vllm", "--model", "Qwen3ForCausalLM", "--runner", "v2", "--layers", "1",
                "--steps", "4", "--jobs", "1", "--format", "json", "-o", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert finding_entries(report) == []
    by_mode = {n["mode"]: n for n in report["numerical"]}
    assert set(by_mode) == {"PIECEWISE", "FULL"}
    for n in by_mode.values():  # compared, and equal
        assert n["token_agreement"] == 1.0 and n["max_logit_error"] == 0.0 and n["replay_steps"] == 4
    checked = {c["mode"]: c["checked"] for c in report["configurations"]}
    assert checked["PIECEWISE"]["shadowed_steps"] == 4 and checked["FULL"]["bare_replays"] == 4
    # the family's default invariant selected the attention in its break (and only it applied)
    assert [(i["id"], i["selected_ops"] > 0) for i in report["invariants"]] == [("attention-eager", True)]




@pytest.mark.slow
def test_a_kv_write_skipped_in_dummy_runs_is_flagged_where_the_untraced_run_differs(tmp_path):
    """The planted hazard (``data/dummy_run_skips_kv_write.patch``, in a scratch copy of
    vLLM): V1 captures PIECEWISE graphs in a dummy run without metadata, so the early
    return is baked; V2 builds metadata for its captures."""
    require_vllm()
    from scratch_vllm import check_and_untraced, planted, run_driver  # tests/vllm/scratch_vllm.py

    target = "model_executor/layers/attention/attention.py"
    copy, lines = planted(tmp_path, target, (DATA / "dummy_run_skips_kv_write.patch").read_text())
    branch = lines.index("    if get_forward_context().attn_metadata is None:") + 1

    report_path = tmp_path / "report.json"
    done = run_driver(copy, tmp_path, check_and_untraced("LlamaForCausalLM", ("PIECEWISE",), layers=1, steps=4), str(report_path), timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["status"] == 1, done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    flagged = {f"{f['runner']}/{f['mode']}" for f in finding_entries(report)}
    diverged = {config for config, (agreement, error) in result["untraced"].items() if error > 1e-3}
    assert flagged == diverged == {"v1/PIECEWISE"}, (finding_entries(report), result["untraced"])
    cl101 = [f for f in finding_entries(report) if f["code"] == "CL101"]
    assert cl101, finding_entries(report)
    frame = cl101[0]["capture_frame"]
    assert frame["file"].endswith("vllm/" + target) and frame["function"] == "unified_kv_cache_update", frame
    assert frame["line"] >= branch, (frame, branch)
