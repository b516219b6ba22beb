"""``capturelint check --engine vllm --spec mtp``: the MTP draft's graphs and the verify
step, captured as each model runner captures them, checked against their eager twin;
``--spec dspark``'s draft step under V2, and its refusal under V1 (vLLM's own, in one line).

One clean check of every configuration runs once (a module fixture, one layer, three
steps); the planted region change checks one configuration in this process.
"""

from __future__ import annotations

import json

import pytest

from capturelint.cli import main
from vllm_required import require_vllm
from capturelint.report import finding_entries

STEPS = 3
K = 2  # vllm_spec.SPEC_TOKENS
BATCH = 2
DRAFT_SCOPE = "model.layers.1.mtp_block.attn"  # the MTP layer is layer num_hidden_layers (mtp.py:217)


def check(tmp_path, *args: str, spec: str = "mtp") -> tuple[int, dict]:
    require_vllm()
    out = tmp_path / "report.json"
    code = main(["check", "--engine", "vllm", "--spec", spec, "--layers", "1", "--steps", str(STEPS), *args,
                 "--format", "json", "-o", str(out)])
    return code, json.loads(out.read_text())


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return check(tmp_path_factory.mktemp("spec"))


def _graphs(report: dict, runner: str, mode: str) -> dict[str, list[str]]:
    config = next(c for c in report["configurations"] if (c["runner"], c["mode"]) == (runner, mode))
    return {g["graph"]: [s["kind"] for s in g["segments"]] for g in config["graphs"]}


def test_mtp_checks_the_draft_graphs_and_the_verify_step(clean):
    code, report = clean
    assert code == 0, finding_entries(report)
    assert finding_entries(report) == []
    verify = f"{BATCH * (K + 1)} tokens"  # k + 1 tokens per request
    draft = f"{BATCH} tokens"  # draft passes 2..k, one token per request
    # V1: the drafter is wrapped for PIECEWISE (gpu_model_runner.py:5144) in both modes, breaking where the target does
    for mode in ("PIECEWISE", "FULL"):
        graphs = _graphs(report, "v1", mode)
        assert set(graphs) == {f"target {mode}:{verify}", f"mtp draft PIECEWISE:{verify}", f"mtp draft PIECEWISE:{draft}"}
        assert graphs[f"mtp draft PIECEWISE:{draft}"] == ["captured", "eager", "captured"]
    # V2: draft pass 1 in the runner's mode; passes 2..k only as FULL graphs (eager under PIECEWISE)
    assert set(_graphs(report, "v2", "PIECEWISE")) == {f"target PIECEWISE:{verify}", f"mtp draft PIECEWISE:{verify}"}
    assert set(_graphs(report, "v2", "FULL")) == {f"target FULL:{verify}", f"mtp draft FULL:{verify}",
                                                  f"mtp draft FULL:{draft}"}
    # every replay was compared with its eager shadow: per step the verify and the draft's graphed passes
    replays = {("v1", "PIECEWISE"): 1 + K, ("v1", "FULL"): 1 + K, ("v2", "PIECEWISE"): 2, ("v2", "FULL"): 1 + K}
    for c in report["configurations"]:
        assert c["checked"]["shadowed_steps"] == STEPS * replays[c["runner"], c["mode"]]
        assert c["checked"]["eager_twin"] is True
    for n in report["numerical"]:
        assert n["replay_steps"] == STEPS * replays[n["runner"], n["mode"]]
        assert n["max_step_error"] < 1e-4 and n["token_agreement"] == 1.0


def test_a_narrow_region_on_the_draft_alone_is_flagged_in_the_draft(tmp_path, monkeypatch):
    require_vllm()
    from capturelint.adapters.vllm.runners import spec as vllm_spec
    from capturelint.options import EagerRegion

    force = vllm_spec.force_region  # the draft is built with it; the target keeps vLLM's region
    monkeypatch.setattr(vllm_spec, "force_region", lambda attn, region: force(attn, EagerRegion.NARROW))
    code, report = check(tmp_path, "--runner", "v1", "--mode", "PIECEWISE")
    assert code == 1
    cl101 = [f for f in finding_entries(report) if f["code"] == "CL101"]
    assert cl101, report["summary"]
    for f in cl101:  # V1 captures the drafter without metadata (llm_base_proposer.py:1650): the profile-run F.pad
        assert f["scope"] == DRAFT_SCOPE
        assert f["graph"].startswith("mtp draft PIECEWISE:")
        assert f["op"] == "aten.constant_pad_nd.default"
        assert "attn_metadata was None" in f["message"]
    assert not [f for f in finding_entries(report) if not f["scope"].startswith("model.layers.1.")]
    numerical = report["numerical"][0]
    assert numerical["max_step_error"] > 1e-2


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_dspark_under_v1_is_vllms_refusal(capsys):
    assert main(["check", "--engine", "vllm", "--spec", "dspark", "--runner", "v1"]) == 2
    line = _one_line(capsys)
    assert line.startswith("capturelint: error: --spec dspark needs --runner v2")
    assert "config/vllm.py:3110-3113" in line and "Model Runner V1 does not support: dspark" in line


def test_dspark_checks_its_draft_step_under_v2(tmp_path):
    code, report = check(tmp_path, spec="dspark")
    assert code == 0, finding_entries(report)
    assert {c["runner"] for c in report["configurations"]} == {"v2"}  # DSpark's only runner, its default
    verify, block = f"{BATCH * (K + 1)} tokens", f"{BATCH * K} tokens"  # the anchor and k - 1 mask tokens
    # PIECEWISE: the draft runs eagerly (dflash/speculator.py:156-160); only the verify step is graphed
    assert set(_graphs(report, "v2", "PIECEWISE")) == {f"target PIECEWISE:{verify}"}
    assert set(_graphs(report, "v2", "FULL")) == {f"target FULL:{verify}", f"dspark draft FULL:{block}"}
    # the FULL draft graph holds the whole step: the context KV of every draft layer (vLLM's _insert_context_kv,
    # called by the draft step itself), the query block through each layer's attention, then the Markov head
    config = next(c for c in report["configurations"] if c["mode"] == "FULL")
    graph = next(g for g in config["graphs"] if g["graph"].startswith("dspark draft"))
    assert [s["kind"] for s in graph["segments"]] == ["captured"]
    ops = graph["segments"][0]["ops"]
    insert = "_C.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert.default"
    assert ops[""][insert] == 2  # one context insert per draft layer
    assert ops["model.layers.1.attn"][insert] == ops["model.layers.2.attn"][insert] == 1  # the block's own KV
    assert ops["model.layers.1.attn.kv_norm"] and ops["model.markov_head.markov_w1"]
    steps = {"PIECEWISE": 1, "FULL": 2}
    for c in report["configurations"]:
        assert c["checked"]["shadowed_steps"] == STEPS * steps[c["mode"]]
    for n in report["numerical"]:
        assert n["replay_steps"] == STEPS * steps[n["mode"]]
        assert n["max_step_error"] < 1e-4 and n["token_agreement"] == 1.0


@pytest.mark.parametrize("args, needle", [
    (["--engine", "vllm", "--spec", "eagle"], "Invalid value for '--spec'"),
    (["--spec", "mtp"], "--spec configures --engine vllm, and --engine bundled does not read it"),
    (["--engine", "vllm", "--spec", "mtp", "--vllm-runner-impl", "reproduced"], "--spec runs its own loop"),
    (["--engine", "vllm", "--spec", "mtp", "--layers", "3"], "--layers 3 with --spec: the speculative-decoding loop"),
    (["--engine", "vllm", "--spec", "mtp", "--batch-sizes", "2"], "--spec runs its own loop"),
])
def test_bad_spec_is_one_line(args, needle, capsys):
    assert main(["check", *args]) == 2
    assert needle in _one_line(capsys)
