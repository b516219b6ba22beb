"""``capturelint check --engine vllm``: vLLM 0.33.0's own DeepSeek V4 attention, checked
on a CPU under both model runners.

The three commands of the issue's acceptance list run once each (module fixtures, in
this process: vLLM is imported once); the other tests read their reports or run small
configurations (one layer, one mode).
"""

from __future__ import annotations

import json
import sys

import pytest
from vllm_required import require_vllm

from capturelint.cli import main
from capturelint.report import finding_entries

ATTENTION = "vllm/models/deepseek_v4/attention.py"
LAYERS = ["model.layers.0.attn", "model.layers.1.attn", "model.layers.2.attn"]  # compress ratios 1, 4, 128


def check(tmp_path_factory, *args: str) -> tuple[int, dict]:
    require_vllm()
    out = tmp_path_factory.mktemp("vllm") / "report.json"
    code = main(["check", "--engine", "vllm", *args, "--format", "json", "-o", str(out)])
    return code, json.loads(out.read_text())


@pytest.fixture(scope="module")
def v1_narrow(tmp_path_factory):
    return check(tmp_path_factory, "--runner", "v1", "--eager-region", "narrow")


@pytest.fixture(scope="module")
def v1_default(tmp_path_factory):
    # PIECEWISE, where the region acts: a FULL graph bypasses the breaks (V1's FULL is
    # checked by v1_narrow here and, with this region, by the vllm.json pin)
    return check(tmp_path_factory, "--runner", "v1", "--mode", "PIECEWISE")


@pytest.fixture(scope="module")
def v2_narrow(tmp_path_factory):
    return check(tmp_path_factory, "--runner", "v2", "--eager-region", "narrow")


def test_v1_narrow_region_fails_at_the_profile_run_branch(v1_narrow):
    code, report = v1_narrow
    assert code == 1
    cl101 = [f for f in finding_entries(report) if f["code"] == "CL101"]
    assert cl101, report["summary"]
    for f in cl101:
        assert (f["runner"], f["mode"]) == ("v1", "PIECEWISE")
        assert f["capture_frame"]["file"].endswith(ATTENTION)
        assert f["capture_frame"]["function"] == "_fused_qnorm_rope_kv_insert"
        assert f["op"] == "aten.constant_pad_nd.default"  # the profile run's F.pad, captured instead of the insert
        assert "attn_metadata was None" in f["message"]
    # one finding per layer (ratio 1, 4 and 128), each in its own layer's scope
    assert sorted(f["scope"] for f in cl101) == LAYERS  # vLLM's prefixes
    # the compressed layers' finding also names what their capture lost: with attn_metadata None the
    # compressors return before writing (compressor.py:369-371), so replay never writes their states and caches
    for f in cl101:
        compressor_ops = "capturelint_vllm.save_partial_states.default" in f["message"]
        assert compressor_ops == (f["scope"] != "model.layers.0.attn"), f["message"]
    # the declared invariant of vLLM's region decision is broken too, in vLLM's own function
    cl201 = [f for f in finding_entries(report) if f["code"] == "CL201"]
    assert {f["invariant"] for f in cl201} == {"dsv4-v1-attention-prep-eager"}
    assert sorted(f["scope"] for f in cl201) == LAYERS
    # in the ratio-4 layer it selects the indexer's query path as well
    assert "model.layers.1.attn.indexer.wq_b" in next(f for f in cl201 if f["scope"] == LAYERS[1])["message"]
    assert all(f["capture_frame"]["file"].endswith(ATTENTION) for f in cl201)
    piecewise = next(n for n in report["numerical"] if n["mode"] == "PIECEWISE")
    assert piecewise["max_step_error"] > 1e-2
    assert piecewise["token_agreement"] < 1.0
    # a FULL graph is captured with metadata (force_attention): the narrow region is safe there;
    # FULL (FULL_DECODE_ONLY for DeepSeek V4) replays the three decode steps, the prefill and
    # mixed steps run eagerly
    full = next(n for n in report["numerical"] if n["mode"] == "FULL")
    assert full["max_step_error"] < 1e-4 and full["replay_steps"] == 3
    assert not [f for f in finding_entries(report) if f["mode"] == "FULL"]


def test_v1_with_vllms_own_region_is_clean(v1_default):
    code, report = v1_default
    assert code == 0, finding_entries(report)
    assert finding_entries(report) == []
    assert {c["eager_region"] for c in report["configurations"]} == {"wide"}  # _prepare_and_attn_eager under V1
    (n,) = report["numerical"]
    # PIECEWISE replays all six steps (the prefill and mixed ones too)
    assert (n["mode"], n["replay_steps"]) == ("PIECEWISE", 6)
    assert n["max_step_error"] < 1e-4
    assert n["token_agreement"] == 1.0


def test_v2_narrow_region_is_clean(v2_narrow):
    code, report = v2_narrow
    assert code == 0, finding_entries(report)
    for n in report["numerical"]:
        assert n["runner"] == "v2"
        assert n["replay_steps"] >= 3
        assert n["max_step_error"] < 1e-4


def _segments(report: dict, mode: str) -> list[dict]:
    config = next(c for c in report["configurations"] if c["mode"] == mode)
    return config["graphs"][0]["segments"]


def test_piecewise_graphs_break_where_vllm_breaks(v1_default, v2_narrow):
    wide = [s["break"] for s in _segments(v1_default[1], "PIECEWISE") if s["kind"] == "eager"]
    assert wide == ["DeepseekV4Attention._prepare_and_attn_eager"] * 3  # one per layer
    narrow = _segments(v2_narrow[1], "PIECEWISE")
    assert [s["break"] for s in narrow if s["kind"] == "eager"] == ["DeepseekV4Attention._sparse_indexer_and_attn"] * 3
    captured = {op for s in narrow if s["kind"] == "captured" for ops in s["ops"].values() for op in ops}
    # under V2 the KV insert is captured (metadata was built at capture) ...
    assert "_C.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert.default" in captured
    # ... and vLLM's weak references of break arguments are not ops of the graph
    assert "_C.weak_ref_tensor.default" not in captured
    # FULL: the FULL-mode bypass makes the whole forward one captured segment
    full = _segments(v2_narrow[1], "FULL")
    assert [s["kind"] for s in full] == ["captured"]


def test_json_is_byte_identical_across_runs(tmp_path):
    require_vllm()
    args = ["check", "--engine", "vllm", "--runner", "v1", "--eager-region", "narrow", "--mode", "PIECEWISE",
            "--layers", "1", "--steps", "4", "--format", "json", "-o"]
    assert main([*args, str(tmp_path / "a.json")]) == 1
    assert main([*args, str(tmp_path / "b.json")]) == 1
    assert b'"CL101"' in (tmp_path / "a.json").read_bytes()
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


def test_static_mode_holds_vllm_to_the_declared_region(tmp_path_factory):
    code, report = check(tmp_path_factory, "--static", "--runner", "v1", "--eager-region", "narrow", "--mode", "PIECEWISE")
    assert code == 1
    assert {f["code"] for f in finding_entries(report)} == {"CL201"}
    functions = {f["capture_frame"]["function"] for f in finding_entries(report)}
    assert functions <= {"_prepare_and_attn", "_fused_qnorm_rope_kv_insert", "_wq_b_proj", "project_query_and_cache_kv",
                         "forward"}
    assert report["numerical"] == []  # replay equivalence was not checked, and the report says so
    code, report = check(tmp_path_factory, "--static", "--runner", "v1", "--mode", "PIECEWISE")
    assert code == 0, finding_entries(report)


# ------------------------------------------------------------------ one-line errors


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_unsupported_version_is_refused(monkeypatch, capsys):
    vllm = require_vllm()
    monkeypatch.setattr(vllm, "__version__", "0.34.1")
    assert main(["check", "--engine", "vllm", "--runner", "v1", "--mode", "PIECEWISE"]) == 2
    line = _one_line(capsys)
    assert "vLLM 0.34.1" in line and "not supported" in line and "0.33.0" in line
    assert "pip install -c constraints.txt -r requirements/vllm-deps.txt && pip install --no-deps -r requirements/vllm.txt" in line


def test_missing_vllm_says_how_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ModuleNotFoundError
    assert main(["check", "--engine", "vllm"]) == 2
    line = _one_line(capsys)
    assert "--engine vllm needs vLLM 0.33.0" in line
    assert "pip install -c constraints.txt -r requirements/vllm-deps.txt && pip install --no-deps -r requirements/vllm.txt" in line


def test_a_kernel_without_reference_is_named(monkeypatch, capsys):
    require_vllm()
    import torch
    from vllm.models.deepseek_v4.attention import DeepseekV4Attention

    def new_kernel(self, q, kv, positions, attn_metadata):  # as a newer vLLM might call a new _C op
        return torch.ops._C.fused_deepseek_v5_qnorm_rope_kv_insert(q, kv, positions)

    monkeypatch.setattr(DeepseekV4Attention, "_fused_qnorm_rope_kv_insert", new_kernel)
    assert main(["check", "--engine", "vllm", "--runner", "v2", "--mode", "PIECEWISE", "--layers", "1"]) == 2
    line = _one_line(capsys)
    assert "_C.fused_deepseek_v5_qnorm_rope_kv_insert" in line
    assert "no CPU reference" in line


@pytest.mark.parametrize("args, needle", [
    (["--mode", "FULL_DECODE_ONLY"], "PIECEWISE and FULL"),
    (["--fresh-metadata", "--runner", "v1"], "--fresh-metadata configures --engine bundled, and --engine vllm does not "
                                             "read it, so it would be ignored; drop --fresh-metadata"),
    (["--break-outputs", "copy"], "--break-outputs configures --engine bundled"),
    (["--kernels", "triton"], "drop --kernels"),
    (["--platform", "rocm"], "drop --platform"),
    (["--eager-region", "medium"], "unknown eager region"),
])
def test_options_of_the_bundled_engine_are_refused(args, needle, capsys):
    assert main(["check", "--engine", "vllm", *args]) == 2
    assert needle in _one_line(capsys)


# ------------------------------------------------------------- regions commands


def test_snapshot_and_show_work_on_vllm(tmp_path, capsys):
    require_vllm()
    snap = tmp_path / "snap.json"
    assert main(["snapshot", "--engine", "vllm", "--runner", "v1", "--mode", "PIECEWISE", "--layers", "1",
                 "-o", str(snap)]) == 0
    doc = json.loads(snap.read_text())
    assert doc["engine"]["name"] == "vllm"
    (config,) = doc["configurations"]
    assert (config["runner"], config["mode"], config["eager_region"]) == ("v1", "PIECEWISE", "wide")
    capsys.readouterr()
    assert main(["show", "--engine", "vllm", "--runner", "v1", "--mode", "PIECEWISE", "--layers", "1",
                 "--eager-region", "narrow", "--format", "dot"]) == 0
    shown = capsys.readouterr().out
    assert "_sparse_indexer_and_attn" in shown


# ------------------------------------------------- layers of every kind, built by vLLM


def test_compressor_and_indexer_layers_build_through_vllms_init():
    require_vllm()
    import torch
    from vllm.config import set_current_vllm_config

    from capturelint.adapters.vllm.install import cpu_shim
    from capturelint.adapters.vllm.model import build_attention, ensure_distributed, vllm_config
    from capturelint.options import Runner

    with cpu_shim():
        vc = vllm_config(3, Runner.V1, ratios=(1, 4, 128))
        with set_current_vllm_config(vc):
            ensure_distributed(vc)
            topk = torch.zeros(64, 16, dtype=torch.int32)
            layers = [build_attention(vc, i, topk) for i in range(3)]
    sliding, c4, c128 = layers
    assert (sliding.compress_ratio, sliding.compressor, sliding.indexer) == (1, None, None)
    assert c4.compress_ratio == 4 and c4.indexer is not None and c4.compressor is not None
    assert c128.compress_ratio == 128 and c128.indexer is None and c128.compressor is not None
    assert {layer.padded_heads for layer in layers} == {64}
    assert {layer.kv_cache_dtype for layer in layers} == {"fp8_ds_mla"}
    registered = set(vc.compilation_config.static_forward_context)
    assert {"model.layers.1.attn.indexer.k_cache", "model.layers.2.attn.compressor.state_cache"} <= registered


# ------------------------------------------------------------------------ suggest


def test_suggest_finds_vllms_own_region_with_vllms_decorator(tmp_path, capsys, monkeypatch):
    require_vllm()
    from capturelint import api

    # The JSON and the patch are two forms of one search: it runs once (the second
    # command renders the report of the first; the search's own tests are test_suggest.py)
    searched = []
    search = api.suggest_with

    def once(*given, **kwargs):
        if not searched:
            searched.append(search(*given, **kwargs))
        return searched[0]

    monkeypatch.setattr(api, "suggest_with", once)
    args = ["suggest", "--engine", "vllm", "--runner", "v1", "--eager-region", "narrow", "--mode", "PIECEWISE",
            "--layers", "1"]
    out = tmp_path / "suggest.json"
    assert main([*args, "--format", "json", "-o", str(out)]) == 0
    report = json.loads(out.read_text())
    top = report["suggestions"][0]
    # the region vLLM chose by hand for V1 (#52401): the whole attention input preparation
    assert [r["function"] for r in top["region"]] == ["DeepseekV4Attention._prepare_and_attn"]
    assert top["region"][0]["file"].endswith(ATTENTION)
    assert all(v["clean"] for v in top["verification"])
    capsys.readouterr()
    assert main([*args, "--format", "patch"]) == 0
    diff = capsys.readouterr().out
    # against vLLM's own tree, with vLLM's decorator, which attention.py already imports
    assert diff.startswith(f"--- a/{ATTENTION}\n+++ b/{ATTENTION}\n")
    assert "+    @eager_break_during_capture\n     def _prepare_and_attn(\n" in diff
    assert "+from" not in diff and "+import" not in diff


def test_invariants_explain_selects_vllms_ops(capsys):
    require_vllm()
    assert main(["invariants", "--engine", "vllm", "--explain", "dsv4-v1-attention-prep-eager", "--runner", "v1",
                 "--mode", "PIECEWISE", "--eager-region", "narrow", "--layers", "1", "--format", "json"]) == 0
    explained = json.loads(capsys.readouterr().out)
    (config,) = explained["configurations"]
    (selection,) = config["selections"]
    # vLLM's graphs, one per capture size (largest first, as vLLM captures), not the bundled engine's
    assert selection["graphs"] == ["PIECEWISE:4 tokens", "PIECEWISE:2 tokens"]
    placed = {(o["scope"], o["op"], o["placement"]) for o in selection["ops"]}
    assert ("model.layers.0.attn", "aten.constant_pad_nd.default", "captured") in placed
    assert ("model.layers.0.attn.wq_b", "aten.mm.default", "captured") in placed


# ------------------------------------------------- the compressed layers' paths


def _scope_ops(segment: dict, prefix: str) -> set[str]:
    return {op for scope, ops in segment["ops"].items() if scope.startswith(prefix) for op in ops}


def test_v2_captures_the_compressors_and_breaks_for_the_indexer_and_attention(v2_narrow):
    narrow = _segments(v2_narrow[1], "PIECEWISE")
    eager = [s for s in narrow if s["kind"] == "eager"]
    captured = [s for s in narrow if s["kind"] == "captured"]
    c4 = set().union(*(_scope_ops(s, "model.layers.1.attn") for s in captured))
    c128 = set().union(*(_scope_ops(s, "model.layers.2.attn") for s in captured))
    compressor = {"capturelint_vllm.save_partial_states.default", "capturelint_vllm.compress_norm_rope_store.default"}
    # metadata at capture: the compressors' state writes and compression are in the graph (under capture the
    # C128 compressor does not take its off-boundary skip, compressor.py:410-417) ...
    assert compressor <= c4 and compressor <= c128
    # ... as is the indexer's query (under capture it does not take the short-context fill, attention.py:1121)
    assert "capturelint_vllm.fused_indexer_q_rope_quant.default" in c4
    assert "capturelint_vllm.fill_short_context_topk_indices.default" not in c4
    # the break runs vLLM's sparse_attn_indexer op, the C4A slot mapping and the sparse decode over both caches
    assert {"vllm.sparse_attn_indexer.default", "capturelint_vllm.compute_global_topk_indices_and_lens.default",
            "_flashmla_C.sparse_decode_fwd.default"} <= _scope_ops(eager[1], "model.layers.1.attn")
    assert "_flashmla_C.sparse_decode_fwd.default" in _scope_ops(eager[2], "model.layers.2.attn")
    assert "vllm.sparse_attn_indexer.default" not in _scope_ops(eager[2], "model.layers.2.attn")


def _spy_runs(runner, mode, region, graphs=True):
    """Run a configuration recording, per call of the compressors' store, the indexer's
    short-context fill and the paged logits, whether the stream was capturing."""
    import torch
    import vllm.model_executor.layers.sparse_attn_indexer as indexer_layer
    from vllm.models.deepseek_v4 import attention
    from vllm.models.deepseek_v4.compressor import DeepseekCompressor

    from capturelint.adapters.vllm.install import cpu_shim
    from capturelint.adapters.vllm.runners.reproduced import ReproducedLoop
    from capturelint.adapters.vllm.workload import RunSpec

    calls = []
    with cpu_shim(), pytest.MonkeyPatch.context() as mp:
        store, fill, logits = DeepseekCompressor._compress_norm_rope_store, attention._fill_short_context_topk_indices, \
            indexer_layer.fp8_fp4_paged_mqa_logits

        def spy_store(self, state_metadata, *args):
            calls.append((f"store{self.compress_ratio}:{self.head_dim}", torch.cuda.is_current_stream_capturing()))
            return store(self, state_metadata, *args)

        class SpyFill:
            def __getitem__(self, grid):
                calls.append(("short-fill", torch.cuda.is_current_stream_capturing()))
                return fill[grid]

        def spy_logits(*args, **kwargs):
            calls.append(("indexer-topk", torch.cuda.is_current_stream_capturing()))
            return logits(*args, **kwargs)

        mp.setattr(DeepseekCompressor, "_compress_norm_rope_store", spy_store)
        mp.setattr(attention, "_fill_short_context_topk_indices", SpyFill())
        mp.setattr(indexer_layer, "fp8_fp4_paged_mqa_logits", spy_logits)
        engine = ReproducedLoop(RunSpec(runner=runner, mode=mode, eager_region=region, layers=3), graphs=graphs)
        engine.capture()
        captured = list(calls)
        calls.clear()
        if not graphs:
            engine.generate()
    return captured, calls


def test_capture_answers_capturing_in_segments_and_not_in_breaks():
    require_vllm()
    from capturelint.options import CUDAGraphMode, EagerRegion, Runner

    # V2, narrow region: metadata at capture; the compressors and the indexer's query run in captured
    # segments, where is_current_stream_capturing() is True: the C128 store is captured although the dummy
    # batch is off the boundary, and the indexer takes its real path although the context is short; the
    # indexer's logits run in the break, where it is False (the segment's capture_end ran before it).
    # The warmups (mode NONE, one per capture size) are eager: short context, every candidate, and the
    # C128 store skipped off the boundary.
    captured, _ = _spy_runs(Runner.V2, CUDAGraphMode.PIECEWISE, EagerRegion.PER_RUNNER)
    assert set(captured) == {("short-fill", False), ("store4:512", False), ("store4:128", False),  # warmups
                             ("store4:512", True), ("store4:128", True), ("store128:512", True),  # captures
                             ("indexer-topk", False)}  # the captures' breaks
    # V1, wide region: everything runs in the eager break, not capturing, and without metadata: no store at all
    captured, _ = _spy_runs(Runner.V1, CUDAGraphMode.PIECEWISE, EagerRegion.PER_RUNNER)
    assert captured == []


def test_eager_steps_cross_each_kinds_boundary():
    require_vllm()
    from capturelint.options import CUDAGraphMode, EagerRegion, Runner

    _, steps = _spy_runs(Runner.V2, CUDAGraphMode.PIECEWISE, EagerRegion.PER_RUNNER, graphs=False)
    # the indexer fills every candidate while max_seq_len // 4 <= index_topk (16): the steps with fresh requests
    # only (the first and the last); with the long request (from its prompt at 125..127 on) it ranks
    assert [c for c, _ in steps if c in ("short-fill", "indexer-topk")] == \
        ["short-fill"] + ["indexer-topk"] * 4 + ["short-fill"]
    # the C128 compressor stores only at its boundary (position 127, in step 1's prefill), eagerly; the C4 ones
    # every step
    assert sum(c == "store128:512" for c, _ in steps) == 1
    assert sum(c == "store4:512" for c, _ in steps) == 6
    assert not any(capturing for _, capturing in steps)
