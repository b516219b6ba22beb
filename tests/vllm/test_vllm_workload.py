"""The vLLM check's workload (``vllm_runners``): requests joining and leaving, each step
dispatched by vLLM's ``CudagraphDispatcher`` to the smallest capture size that holds it,
and padded as each runner pads it; and the options that choose it.
"""

from __future__ import annotations

import pytest

from capturelint.cli import main
from vllm_required import require_vllm  # tests/vllm/vllm_required.py


def test_the_default_schedule_has_prefill_mixed_padded_and_full_steps():
    from capturelint.adapters.vllm.workload import DEFAULT_BATCH_SIZES, schedule

    steps = schedule(DEFAULT_BATCH_SIZES, 6)
    as_tuples = [[(s.req, s.start, s.query_len) for s in step] for step in steps]
    assert as_tuples == [
        [(0, 0, 2)],  # request 0 joins: a prefill step
        [(0, 2, 1), (1, 0, 3)],  # a mixed step, decodes first
        [(0, 3, 1), (1, 3, 1), (2, 0, 2)],  # another
        [(0, 4, 1), (1, 4, 1), (2, 2, 1)],  # 3 decodes: padded to 4
        [(1, 5, 1), (2, 3, 1)],  # the oldest left: 2 decodes fill a graph of 2
        [(2, 4, 1)],  # 1 decode: padded to 2
    ]
    # cycled over more steps; a request leaves when it holds MAX_SEQ tokens and another joins
    long = schedule((1,), 600)
    assert {s.req for step in long for s in step} == {0, 1, 2}
    assert all(step[0].start + step[0].query_len <= 256 for step in long)


def test_with_compressed_layers_long_requests_join_at_the_boundaries():
    from capturelint.adapters.vllm.workload import DEFAULT_BATCH_SIZES, schedule

    steps = schedule(DEFAULT_BATCH_SIZES, 6, long_context=125)
    positions = [[(s.req, s.start, s.query_len) for s in step] for step in steps]
    # even requests are prefilled from 0; odd ones are long: their 3-token prompt begins at
    # 125 (everything before is stood in) and is prefilled for real
    assert positions == [
        [(0, 0, 2)],  # a prefill step
        [(0, 2, 1), (1, 125, 3)],  # a mixed step; the prefill crosses the ratio-4 and ratio-128 boundary (127)
        [(0, 3, 1), (1, 128, 1), (2, 0, 2)],  # a mixed step: decodes at different positions, a prefill
        [(0, 4, 1), (1, 129, 1), (2, 2, 1)],  # 3 decodes: padded to 4
        [(1, 130, 1), (2, 3, 1)],
        [(2, 4, 1)],
    ]


def _runner(runner, mode):
    from capturelint.adapters.vllm.runners.reproduced import ReproducedLoop
    from capturelint.adapters.vllm.workload import RunSpec
    from capturelint.options import CUDAGraphMode, Runner

    return ReproducedLoop(RunSpec(runner=Runner(runner), mode=CUDAGraphMode[mode], layers=1))


@pytest.mark.parametrize("runner, mode, dispatched, slots, counts", [
    # V1 PIECEWISE: every step replays a PIECEWISE graph; metadata and slots over the real tokens
    ("v1", "PIECEWISE", ["PIECEWISE"] * 6, [2, 4, 4, 3, 2, 1], [(0, 2), (1, 3), (2, 2), (3, 0), (2, 0), (1, 0)]),
    # V2 PIECEWISE: the same graphs; real counts, but slots over the padded tokens
    ("v2", "PIECEWISE", ["PIECEWISE"] * 6, [2, 4, 4, 4, 2, 2], [(0, 2), (1, 3), (2, 2), (3, 0), (2, 0), (1, 0)]),
    # FULL resolves to FULL_DECODE_ONLY: prefill and mixed steps eager; decodes padded, metadata too
    ("v1", "FULL", ["NONE"] * 3 + ["FULL"] * 3, [2, 4, 4, 4, 2, 2], [(0, 2), (1, 3), (2, 2), (4, 0), (2, 0), (2, 0)]),
    ("v2", "FULL", ["NONE"] * 3 + ["FULL"] * 3, [2, 4, 4, 4, 2, 2], [(0, 2), (1, 3), (2, 2), (4, 0), (2, 0), (2, 0)]),
])
def test_each_runner_dispatches_and_pads_as_vllm(runner, mode, dispatched, slots, counts):
    require_vllm()
    import torch

    from capturelint.adapters.vllm.install import cpu_shim

    with cpu_shim():
        run = _runner(runner, mode)
        got_modes, got_slots, got_counts = [], [], []
        for scheduled in run.steps:
            batch, step_mode, _ = run.step_batch(scheduled)
            run.buffers.fill(batch, torch.zeros(batch.num_tokens, dtype=torch.long))
            swa = next(iter(run.metadata(batch).values()))
            got_modes.append(step_mode.name)
            got_slots.append(swa.slot_mapping.shape[0])
            got_counts.append((swa.num_decode_tokens, swa.num_prefill_tokens))
            assert (swa.slot_mapping[batch.num_tokens:] == -1).all()  # padded tokens write nowhere
    assert (got_modes, got_slots, got_counts) == (dispatched, slots, counts)


@pytest.mark.parametrize("runner, mode, rows, tokens, slots", [
    # metadata counts the padded rows under FULL only; V2's slot mappings always span them
    ("v1", "PIECEWISE", [1, 2, 3, 3, 2, 1], [2, 4, 4, 3, 2, 1], [2, 4, 4, 3, 2, 1]),
    ("v2", "PIECEWISE", [1, 2, 3, 3, 2, 1], [2, 4, 4, 3, 2, 1], [2, 4, 4, 4, 2, 2]),
    # FULL_DECODE_ONLY: the prefill and mixed steps (0, 1 and 2) run eagerly, unpadded
    ("v1", "FULL", [1, 2, 3, 4, 2, 2], [2, 4, 4, 4, 2, 2], [2, 4, 4, 4, 2, 2]),
])
def test_the_compressed_layers_metadata_follows_the_runners_padding(runner, mode, rows, tokens, slots):
    require_vllm()
    import torch

    from capturelint.adapters.vllm.install import cpu_shim
    from capturelint.adapters.vllm.runners.reproduced import ReproducedLoop
    from capturelint.adapters.vllm.workload import RunSpec
    from capturelint.options import CUDAGraphMode, Runner

    with cpu_shim():
        run = ReproducedLoop(RunSpec(runner=Runner(runner), mode=CUDAGraphMode[mode]))  # the default three layers
        got = ([], [], [])
        for scheduled in run.steps:
            batch, _, _ = run.step_batch(scheduled)
            run.buffers.fill(batch, torch.zeros(batch.num_tokens, dtype=torch.long))
            md = run.metadata(batch)
            c4, c128 = md["model.layers.1.attn"], md["model.layers.2.attn"]
            state = md["model.layers.2.attn.compressor.state_cache"]
            indexer = md["model.layers.1.attn.indexer.k_cache"]
            got[0].append(c4.block_table.shape[0])
            got[1].append(c128.num_actual_tokens)
            got[2].append(state.slot_mapping.shape[0])
            real = batch.num_tokens
            assert (state.slot_mapping[real:] == -1).all() and (c128.slot_mapping[real:] == -1).all()
            assert (c4.block_table[batch.num_reqs:] == 0).all()  # padded rows: the null block
            decodes = [s for s in scheduled if s.query_len == 1]
            assert indexer.num_decode_tokens == len(decodes) + c128.num_actual_tokens - real
            assert indexer.num_prefill_tokens == real - len(decodes)
            assert (indexer.prefill is None) == (indexer.num_prefills == 0)
            if indexer.prefill is not None:  # a chunk where the prefills hold compressed entries: the long prompt
                long_prefill = any(s.query_len > 1 and s.start > 0 for s in scheduled)
                assert len(indexer.prefill.chunks) == long_prefill
            # each real token's state slot is its request's block at its position (state block 8 at ratio 128)
            t = 0
            for i, s in enumerate(scheduled):
                for pos in range(s.start, s.start + s.query_len):
                    assert int(state.block_table[i, pos // 8]) * 8 + pos % 8 == int(state.slot_mapping[t])
                    t += 1
            if decodes:  # C128A: one compressed entry visible once a request passed position 127
                assert c128.c128a_decode_topk_lens[: len(decodes)].tolist() == [(s.start + 1) // 128 for s in decodes]
    assert got == (rows, tokens, slots)


@pytest.mark.parametrize("args, needle", [
    (["--capture-sizes", "2,x"], "--capture-sizes takes positive integers separated by commas"),
    (["--batch-sizes", "0"], "--batch-sizes takes positive integers"),
    (["--capture-sizes", "128"], "each must be at most 64 (the runner's max_num_batched_tokens)"),
    (["--batch-sizes", "2,17"], "each must be at most 16 (the runner's max_num_seqs)"),
])
def test_bad_workload_values_are_one_line_errors(args, needle, capsys):
    assert main(["check", "--engine", "vllm", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_the_bundled_engine_refuses_the_vllm_workload_options(capsys):
    assert main(["check", "--batch-sizes", "2"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--batch-sizes sets the workload of --engine vllm" in line and "drop --batch-sizes" in line


def test_a_chosen_workload_is_checked_and_its_graphs_are_the_capture_sizes(tmp_path):
    require_vllm()
    import json

    out = tmp_path / "r.json"
    assert main(["check", "--engine", "vllm", "--runner", "v2", "--mode", "PIECEWISE", "--layers", "1", "--steps", "3",
                 "--capture-sizes", "1,3", "--batch-sizes", "1,1,2", "--format", "json", "-o", str(out)]) == 0
    report = json.loads(out.read_text())
    (config,) = report["configurations"]
    assert [g["graph"] for g in config["graphs"]] == ["PIECEWISE:1 tokens", "PIECEWISE:3 tokens"]
    # steps of 2 (prefill), 1 (decode) and 4 (decode + prefill: above 3, eager) tokens
    assert report["numerical"][0]["replay_steps"] == 2


def test_a_snapshot_records_the_workload_and_refuses_a_bad_one(tmp_path, capsys):
    require_vllm()
    import json

    snap = tmp_path / "snap.json"
    args = ["--engine", "vllm", "--runner", "v2", "--mode", "PIECEWISE", "--layers", "1", "--steps", "3"]
    assert main(["snapshot", *args, "--capture-sizes", "1,4", "-o", str(snap)]) == 0
    doc = json.loads(snap.read_text())
    assert doc["engine"]["capture_sizes"] == [1, 4] and "batch_sizes" not in doc["engine"]  # defaults unwritten
    capsys.readouterr()
    assert main(["diff", str(snap), *args]) == 0  # regions unchanged; the workload difference is noted
    assert "recorded with capture_sizes=[1, 4] and the after side with capture_sizes=None" in capsys.readouterr().out
    doc["engine"]["capture_sizes"] = [0]
    snap.write_text(json.dumps(doc))
    assert main(["diff", str(snap), *args]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "field engine.capture_sizes must be a list of positive integers" in line, line


def test_the_prefills_run_every_layer_kinds_prefill_path(monkeypatch):
    """The default workload's prefill and mixed steps (0, 1 and 2) go through each layer
    kind's ``_forward_prefill`` and, at ratio 4, the indexer's prefill: the long prompt
    (step 1) holds compressed entries and reaches its kernels (gather, logits, top-k)."""
    require_vllm()
    from vllm import _custom_ops
    from vllm.models.deepseek_v4.nvidia import flashmla

    from capturelint.adapters.vllm.install import cpu_shim
    from capturelint.adapters.vllm.runners.reproduced import ReproducedLoop
    from capturelint.adapters.vllm.workload import RunSpec
    from capturelint.options import CUDAGraphMode

    prefills, gathers = [], []
    forward_prefill = flashmla.DeepseekV4FlashMLAAttention._forward_prefill
    gather = _custom_ops.cp_gather_indexer_k_quant_cache

    def spy_prefill(self, q, *args, **kwargs):
        prefills.append((self.compress_ratio, q.shape[0]))
        return forward_prefill(self, q, *args, **kwargs)

    def spy_gather(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens):
        gathers.append(cu_seq_lens.tolist())
        return gather(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens)

    with cpu_shim():
        monkeypatch.setattr(flashmla.DeepseekV4FlashMLAAttention, "_forward_prefill", spy_prefill)
        monkeypatch.setattr(_custom_ops, "cp_gather_indexer_k_quant_cache", spy_gather)
        ReproducedLoop(RunSpec(mode=CUDAGraphMode.PIECEWISE), graphs=False).generate()
    # steps 0 and 2: a fresh 2-token prompt; step 1: the long 3-token prompt at 125..127
    assert prefills == [(1, 2), (4, 2), (128, 2), (1, 3), (4, 3), (128, 3), (1, 2), (4, 2), (128, 2)]
    assert gathers == [[0, 32]]  # the long prompt's 32 indexer entries (128 // 4), once
