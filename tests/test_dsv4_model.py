"""The DeepSeek V4 model's capture-relevant structure: profile branches, eager regions,
and what each runner's capture records."""

from __future__ import annotations

import collections

import pytest
import torch

from capturelint.engine.config import EngineConfig
from capturelint.runtime.breakable import BreakCall, CaptureObserver, EagerSegment, SegmentKind, observing
from capturelint.runtime.forward_context import CUDAGraphMode, set_forward_context
from capturelint.engine.llm import Engine
from capturelint.engine.metadata import StepBatch

NARROW_BREAK = "DeepseekV4Attention._sparse_indexer_and_attn"
WIDE_BREAK = "DeepseekV4Attention._prepare_and_attn_eager"
SMALL = dict(steps=4, capture_sizes=(4, 8))


def captured_engine(**kwargs) -> Engine:
    engine = Engine(EngineConfig(**{**SMALL, **kwargs}))
    engine.capture_model()
    return engine


def graphs(engine: Engine):
    return list(engine.runner.cudagraph_wrapper.graphs.values())


def captured_ops(graph) -> collections.Counter:
    ops = collections.Counter()
    for seg in graph.segments:
        if seg.kind is SegmentKind.CAPTURED:
            ops.update(str(call.func) for call in seg.graph._calls)
    return ops


def eager_names(graph) -> list[str]:
    return [seg.name for seg in graph.segments if isinstance(seg, EagerSegment)]


def real_batch(num_tokens: int = 5) -> StepBatch:
    """One request's first ``num_tokens`` prompt tokens in block 2 (slots 32..)."""
    return StepBatch(
        num_tokens=num_tokens,
        num_padded=num_tokens,
        uniform_decode=False,
        input_ids=tuple(range(3, 3 + num_tokens)),
        positions=tuple(range(num_tokens)),
        slot_mapping=tuple(32 + p for p in range(num_tokens)),
        req_idx=(0,) * num_tokens,
        block_table=((2,),),
        seq_lens=(num_tokens,),
        logits_indices=(num_tokens - 1,),
    )


# ---------------------------------------------------------------- profile branches


def snapshot(engine: Engine) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in engine.kv_cache.named_tensors()}


def changed(engine: Engine, before: dict[str, torch.Tensor]) -> set[str]:
    return {name for name, t in engine.kv_cache.named_tensors() if not torch.equal(t, before[name])}


@pytest.mark.parametrize("region", ["narrow", "wide"])
def test_profile_run_leaves_kv_cache_untouched(region):
    engine = Engine(EngineConfig(cudagraph_mode="NONE", eager_region=region, **SMALL))
    batch = real_batch()
    engine.runner._prepare_inputs(batch)
    n = batch.num_padded
    before = snapshot(engine)
    engine.model.model.topk_indices_buffer.fill_(7)
    with torch.no_grad(), set_forward_context(None):
        hidden = engine.model.model(engine.runner.input_ids[:n], engine.runner.positions[:n])
    assert changed(engine, before) == set()
    assert torch.isfinite(hidden).all()
    # The indexer fakes its result: no compressed row selected.
    assert (engine.model.model.topk_indices_buffer[:n] == -1).all()

    # With metadata the same forward writes every cache of every layer.
    with torch.no_grad(), set_forward_context(engine.runner.build_attn_metadata(batch)):
        engine.model.model(engine.runner.input_ids[:n], engine.runner.positions[:n])
    assert changed(engine, before) == set(before)


def test_profile_kv_insert_only_pads_q():
    engine = Engine(EngineConfig(cudagraph_mode="NONE", num_heads=2, **SMALL))
    attn = engine.model.model.layers[0].attn
    q = torch.randn(3, 2, attn.head_dim)
    kv = torch.randn(3, attn.head_dim)
    positions = torch.arange(3)
    before = snapshot(engine)
    q_out = attn._fused_qnorm_rope_kv_insert(q, kv, positions, None)
    assert q_out.shape == (3, 4, attn.head_dim)  # padded to a multiple of 4 heads
    assert torch.equal(q_out[:, :2], q)  # un-normalised, no RoPE
    assert (q_out[:, 2:] == 0).all()
    assert changed(engine, before) == set()


def test_profile_compressor_returns_at_once():
    engine = Engine(EngineConfig(cudagraph_mode="NONE", **SMALL))
    attn = engine.model.model.layers[1].attn
    before = snapshot(engine)
    assert attn.compressor(torch.randn(2, attn.head_dim), torch.arange(2), None) is None
    assert attn.indexer.compressor(torch.randn(2, attn.head_dim), torch.arange(2), None) is None
    assert changed(engine, before) == set()


# ---------------------------------------------------------------- eager regions


def test_narrow_region_v1_piecewise_records_the_profile_branch():
    """The headline hazard, structurally: V1 captures PIECEWISE without metadata, so the
    narrow region's captured segments hold the q pad instead of the KV insert and no
    compressor writes; only the attention break re-runs live."""
    engine = captured_engine(runner="v1", cudagraph_mode="PIECEWISE", eager_region="narrow")
    layers = engine.config.num_layers
    for graph in graphs(engine):
        assert eager_names(graph) == [NARROW_BREAK] * layers
        ops = captured_ops(graph)
        assert ops["aten.constant_pad_nd.default"] == layers
        assert ops["dsv4.fused_qnorm_rope_kv_insert.default"] == 0
        assert ops["dsv4.save_partial_states.default"] == 0


def test_narrow_region_v2_piecewise_records_real_writes():
    engine = captured_engine(runner="v2", cudagraph_mode="PIECEWISE", eager_region="narrow")
    ratios = engine.config.layer_ratios
    compressors = sum(1 for r in ratios if r > 1) + sum(1 for r in ratios if r == 4)
    for graph in graphs(engine):
        assert eager_names(graph) == [NARROW_BREAK] * len(ratios)
        ops = captured_ops(graph)
        assert ops["dsv4.fused_qnorm_rope_kv_insert.default"] == len(ratios)
        assert ops["dsv4.save_partial_states.default"] == compressors
        assert ops["dsv4.compress_norm_rope_store.default"] == compressors
        assert ops["aten.constant_pad_nd.default"] == 0
        # The attention and the indexer are never captured under PIECEWISE.
        assert ops["dsv4.sparse_attention.default"] == 0
        assert ops["dsv4.sparse_attn_indexer.default"] == 0


class BreakLog(CaptureObserver):
    def __init__(self):
        self.calls: list[BreakCall] = []

    def on_break_enter(self, call: BreakCall) -> None:
        self.calls.append(call)


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_wide_region_is_one_break_per_layer_with_the_attention_nested(runner):
    log = BreakLog()
    with observing(log):
        engine = captured_engine(runner=runner, cudagraph_mode="PIECEWISE", eager_region="wide")
    layers = engine.config.num_layers
    for graph in graphs(engine):
        assert eager_names(graph) == [WIDE_BREAK] * layers
        assert [s.kind for s in graph.segments] == [SegmentKind.CAPTURED, SegmentKind.EAGER] * layers + [
            SegmentKind.CAPTURED
        ]
        assert not any(op.startswith("dsv4.") for op in captured_ops(graph))
    # Inside the wide break (an eager segment, not recording) the attention break runs
    # inline: once per layer per graph.
    nested = [c for c in log.calls if c.name == NARROW_BREAK and c.phase.value == "capture"]
    assert len(nested) == layers * len(graphs(engine))
    assert all(c.inline for c in nested)


@pytest.mark.parametrize("runner,region", [("v1", "narrow"), ("v2", "wide")])
def test_full_capture_has_no_eager_segment(runner, region):
    engine = captured_engine(runner=runner, cudagraph_mode="FULL", eager_region=region)
    assert engine.runner.num_eager_breaks == 0
    layers = engine.config.num_layers
    indexers = sum(1 for r in engine.config.layer_ratios if r == 4)
    for graph in graphs(engine):
        assert graph.runtime_mode is CUDAGraphMode.FULL
        assert [s.kind for s in graph.segments] == [SegmentKind.CAPTURED]
        ops = captured_ops(graph)
        # FULL capture forces metadata: the real kernels are recorded, attention included.
        assert ops["dsv4.fused_qnorm_rope_kv_insert.default"] == layers
        assert ops["dsv4.sparse_attention.default"] == layers
        assert ops["dsv4.sparse_attn_indexer.default"] == indexers


# ---------------------------------------------------------------- naming


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_named_state_tensors(runner):
    engine = Engine(EngineConfig(runner=runner, **SMALL))
    named = list(engine.runner.named_state_tensors())
    names = [n for n, _ in named]
    assert len(names) == len(set(names))
    for expected in (
        "model.layers.0.attn.wq_a.weight",
        "model.layers.1.attn.indexer.compressor.wkv.weight",
        "model.layers.0.ffn.w1",
        "model.topk_indices_buffer",
        "lm_head.weight",
        "runner.input_ids",
        "runner.positions",
        "runner.block_table",
        "kv_cache.layers.0.swa",
        "kv_cache.layers.1.indexer.k",
        "kv_cache.layers.2.compressor.kv",
    ):
        assert expected in names
    if runner == "v1":
        assert "runner.slot_mapping" in names and "metadata.swa.slot_mapping" not in names
    else:
        assert "metadata.swa.slot_mapping" in names and "runner.slot_mapping" not in names
    # Every parameter, and the caches the layers write, are among them (same objects).
    ids = {id(t) for _, t in named}
    assert all(id(p) in ids for p in engine.model.parameters())
    assert id(engine.model.model.layers[0].attn.kv_cache.swa) in ids


def test_v1_metadata_are_views_of_runner_buffers_unless_fresh():
    batch = real_batch()
    persistent = Engine(EngineConfig(runner="v1", **SMALL)).runner
    persistent._prepare_inputs(batch)
    md = persistent.build_attn_metadata(batch)["layers.0.swa"]
    assert md.slot_mapping.data_ptr() == persistent.metadata_buffers.slot_mapping.data_ptr()
    fresh = Engine(EngineConfig(runner="v1", fresh_metadata=True, **SMALL)).runner
    fresh._prepare_inputs(batch)
    a = fresh.build_attn_metadata(batch)["layers.0.swa"]
    b = fresh.build_attn_metadata(batch)["layers.0.swa"]
    # Both alive, so distinct addresses mean distinct allocations.
    assert a.slot_mapping.data_ptr() != b.slot_mapping.data_ptr()
    assert a.slot_mapping.data_ptr() != fresh.metadata_buffers.slot_mapping.data_ptr()
    assert torch.equal(a.slot_mapping, md.slot_mapping)


def test_triton_kernels_are_selected_lazily(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    engine = Engine(EngineConfig(kernels="triton", cudagraph_mode="NONE", **SMALL))
    attn = engine.model.model.layers[0].attn
    assert attn._kv_insert_op is torch.ops.dsv4.fused_qnorm_rope_kv_insert_triton
    assert attn._attention_op is torch.ops.dsv4.sparse_attention_triton
    torch_attn = Engine(EngineConfig(cudagraph_mode="NONE", **SMALL)).model.model.layers[0].attn
    assert torch_attn._attention_op is torch.ops.dsv4.sparse_attention
