"""The ``dsv4`` torch reference ops against hand-computed cases, and their capture contract.

Small shapes throughout: every expected value here can be checked with a pencil, and the
capture properties (one op per call, no host sync, fake kernels) are checked per op.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from capturelint.engine.dsv4 import ops

EPS = 1e-6


# ------------------------------------------------------------------------------ helpers


def test_rope_rotates_pairs_half_apart() -> None:
    # D = R = 4: pairs (0, 2) at frequency 1 and (1, 3) at 10000**-0.5 = 0.01.
    x = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    out = ops.rope(x, torch.tensor([1]), rope_dim=4)
    expected = torch.tensor([[math.cos(1.0), math.cos(0.01), math.sin(1.0), math.sin(0.01)]])
    torch.testing.assert_close(out, expected)


def test_rope_leaves_leading_dims_and_position_zero() -> None:
    x = torch.randn(2, 3, 8)
    out = ops.rope(x, torch.tensor([0, 5]), rope_dim=4)
    torch.testing.assert_close(out[0], x[0])
    torch.testing.assert_close(out[1, :, :4], x[1, :, :4])
    assert not torch.allclose(out[1, :, 4:], x[1, :, 4:])


def test_rope_inverse_undoes_rope() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 3, 16)
    positions = torch.tensor([0, 1, 17, 300])
    back = ops.rope(ops.rope(x, positions, 8), positions, 8, inverse=True)
    torch.testing.assert_close(back, x, atol=1e-5, rtol=1e-5)


def test_rms_norm_hand_computed() -> None:
    out = ops.rms_norm(torch.tensor([[3.0, 4.0]]), torch.tensor([1.0, 2.0]), eps=0.0)
    rms = math.sqrt(12.5)
    torch.testing.assert_close(out, torch.tensor([[3.0 / rms, 8.0 / rms]]))


# -------------------------------------------------------------- fused q-norm / RoPE / KV insert


def test_fused_insert_writes_valid_slots_and_skips_negative_ones() -> None:
    torch.manual_seed(0)
    num_heads, padded_heads, dim = 3, 4, 4
    q = torch.randn(2, num_heads, dim)
    kv = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
    weight = torch.tensor([1.0, 2.0, 3.0, 4.0])
    cache = torch.full((5, dim), 7.0)  # 4 slots + scratch
    q_out = torch.full((2, padded_heads, dim), float("nan"))
    # Position 0: RoPE is the identity, so the expectations are plain arithmetic.
    torch.ops.dsv4.fused_qnorm_rope_kv_insert(
        q, kv, torch.tensor([0, 0]), torch.tensor([2, -1]), weight, cache, q_out, 2, EPS
    )
    rms = q.pow(2).mean(-1, keepdim=True).add(EPS).sqrt()
    torch.testing.assert_close(q_out[:, :num_heads], q / rms * weight)
    assert torch.equal(q_out[:, num_heads:], torch.zeros(2, 1, dim))
    assert torch.equal(cache[2], kv[0])
    assert torch.equal(cache[[0, 1, 3]], torch.full((3, dim), 7.0))
    assert torch.equal(cache[4], kv[1])  # the negative slot landed in the scratch row


def test_fused_insert_ropes_q_and_kv_at_their_positions() -> None:
    torch.manual_seed(1)
    q, kv = torch.randn(2, 1, 8), torch.randn(2, 8)
    positions = torch.tensor([3, 11])
    cache, q_out = torch.zeros(9, 8), torch.empty(2, 4, 8)
    weight = torch.ones(8)
    torch.ops.dsv4.fused_qnorm_rope_kv_insert(
        q, kv, positions, torch.tensor([0, 5]), weight, cache, q_out, 4, EPS
    )
    torch.testing.assert_close(q_out[:, :1], ops.rope(ops.rms_norm(q, weight, EPS), positions, 4))
    torch.testing.assert_close(cache[[0, 5]], ops.rope(kv, positions, 4))


def test_save_partial_states() -> None:
    kv = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    score = torch.tensor([[5.0, 6.0], [7.0, 8.0]])
    cache = torch.zeros(4, 2, 2)
    torch.ops.dsv4.save_partial_states(kv, score, torch.tensor([-1, 1]), cache)
    assert torch.equal(cache[1], torch.tensor([[3.0, 4.0], [7.0, 8.0]]))
    assert torch.equal(cache[0], torch.zeros(2, 2)) and torch.equal(cache[2], torch.zeros(2, 2))
    assert torch.equal(cache[3], torch.tensor([[1.0, 2.0], [5.0, 6.0]]))


# ------------------------------------------------------------------------------ compressor


def _compress_case():
    """ratio 2, block size 4, one request whose blocks are [1, 0] (8 positions).

    Compressed row j lives in block ``bt[(2j) // 4]`` at offset ``(2j % 4) // 2``:
    j=0 -> slot 2, j=1 -> slot 3, j=2 -> slot 0, j=3 -> slot 1 (plus scratch slot 4).
    """
    block_table = torch.tensor([[1, 0]])
    channels = 4
    state = torch.zeros(9, 2, channels)
    for p in range(8):
        slot = int(block_table[0, p // 4]) * 4 + p % 4
        state[slot, 0] = torch.arange(channels, dtype=torch.float32) + 10 * p
    return block_table, state


def test_compress_stores_only_on_ratio_boundaries() -> None:
    block_table, state = _compress_case()
    positions = torch.arange(8)
    slots = ops.token_slots(positions, torch.zeros(8, dtype=torch.long), block_table, 4)
    slots[7] = -1  # p=7 completes row 3, but is a padding token: no store
    out = torch.full((5, 4), -5.0)
    weight = torch.ones(4)
    torch.ops.dsv4.compress_norm_rope_store(
        positions, slots, torch.zeros(8, dtype=torch.long), block_table, state, weight, out, 2, 4, 2, EPS
    )
    # Equal scores: the pool is the mean of positions 2j and 2j+1.
    for j, slot in ((0, 2), (1, 3), (2, 0)):
        pooled = torch.arange(4, dtype=torch.float32) + 10 * (2 * j) + 5
        expected = ops.rope(ops.rms_norm(pooled[None], weight, EPS), torch.tensor([2 * j]), 2)
        torch.testing.assert_close(out[slot], expected[0])
    assert torch.equal(out[1], torch.full((4,), -5.0))


def test_compress_pools_with_softmax_of_scores() -> None:
    block_table, state = _compress_case()
    # Positions 4 and 5 (slots 0 and 1): scores 0 and ln 3 weight them 1/4 and 3/4.
    state[1, 1] = math.log(3.0)
    out = torch.zeros(5, 4)
    torch.ops.dsv4.compress_norm_rope_store(
        torch.tensor([5]), torch.tensor([1]), torch.tensor([0]), block_table, state,
        torch.ones(4), out, 2, 4, 0, 0.0,
    )
    pooled = 0.25 * state[0, 0] + 0.75 * state[1, 0]
    torch.testing.assert_close(out[0], pooled / pooled.pow(2).mean().sqrt())


# ------------------------------------------------------------------------------- indexer


def test_indexer_ranks_complete_rows_and_pads_with_minus_one() -> None:
    # ratio 2, block size 4, blocks [0, 1]: N = 4 rows at slots 0..3; K = 6 > N.
    block_table = torch.tensor([[0, 1]])
    keys = torch.tensor([[1.0, 0.0], [3.0, 0.0], [2.0, 0.0], [-1.0, 0.0], [9.0, 9.0]])
    q = torch.tensor([[[1.0, 0.0]]]).expand(3, 1, 2)
    topk = torch.full((4, 6), 99, dtype=torch.int32)
    torch.ops.dsv4.sparse_attn_indexer(
        q, torch.ones(3, 1), keys, torch.tensor([5, 0, 7]), torch.zeros(3, dtype=torch.long),
        block_table, topk, 2, 4,
    )
    # p=5 sees rows 0..2 (scores 1, 3, 2); p=0 sees none; p=7 sees all (row 3 scores 0).
    assert topk[0].tolist() == [1, 2, 0, -1, -1, -1]
    assert topk[1].tolist() == [-1] * 6
    assert topk[2].tolist() == [1, 2, 0, 3, -1, -1]
    assert topk[3].tolist() == [99] * 6  # rows past T are untouched


def test_indexer_weights_heads_after_relu() -> None:
    block_table = torch.tensor([[0]])
    keys = torch.tensor([[1.0], [1.0], [0.0]])  # rows 0 and 1 at ratio 2, block size 4
    keys[1] = -1.0
    q = torch.tensor([[[2.0], [-1.0]]])  # head 0: relu(2), relu(-2); head 1: relu(-1), relu(1)
    topk = torch.empty(1, 2, dtype=torch.int64)
    torch.ops.dsv4.sparse_attn_indexer(
        q, torch.tensor([[1.0, 3.0]]), keys, torch.tensor([3]), torch.tensor([0]), block_table, topk, 2, 4
    )
    assert topk.tolist() == [[1, 0]]  # scores: row 0 -> 2, row 1 -> 3


# ------------------------------------------------------------------------- sparse attention


def _attend(q, swa, positions, sink, window, comp=None, rows=None, scale=1.0, table=((0, 1),)):
    """Attention of one request (ratio 4, block size 4) into a NaN-filled ``out``."""
    num_heads = sink.shape[0]
    out = torch.full((q.shape[0], num_heads, q.shape[2]), float("nan"))
    torch.ops.dsv4.sparse_attention(
        q, swa, comp, rows, positions, torch.zeros(q.shape[0], dtype=torch.long),
        torch.tensor(table), sink, out, window, 4, 4, scale,
    )
    return out


def test_attention_sink_only_gives_zeros() -> None:
    out = _attend(torch.randn(2, 4, 2), torch.randn(9, 2), torch.tensor([0, 6]), torch.zeros(1), window=0)
    assert torch.equal(out, torch.zeros(2, 1, 2))


def test_attention_masks_window_before_position_zero() -> None:
    # q = 0: every valid key gets logit 0, as does the sink, so out = sum(v) / (n + 1).
    swa = torch.arange(18, dtype=torch.float32).view(9, 2)
    out = _attend(torch.zeros(1, 4, 2), swa, torch.tensor([1]), torch.zeros(1), window=4)
    torch.testing.assert_close(out[0, 0], (swa[0] + swa[1]) / 3)


def test_attention_sink_joins_denominator_only() -> None:
    swa = torch.zeros(9, 2)
    swa[2] = torch.tensor([2.0, 0.0])
    q = torch.tensor([[[1.0, 0.0]] * 4])
    # Logits: position 2 -> 0.5 * 2 = 1, position 3 -> 0, sink -> ln 2.
    out = _attend(q, swa, torch.tensor([3]), torch.tensor([math.log(2.0)]), window=2, scale=0.5)
    e = math.e
    torch.testing.assert_close(out[0, 0], torch.tensor([2.0 * e / (e + 1 + 2), 0.0]))


def test_attention_uses_valid_compressed_rows_and_first_heads() -> None:
    # Blocks [1, 0]: position 5 is slot 0 * 4 + 1 = 1; at ratio 4 and block size 4 there is
    # one compressed row per block, so row 0 is comp slot 1 and row 1 is comp slot 0.
    swa = torch.zeros(9, 2)
    swa[1] = torch.tensor([1.0, 0.0])
    comp = torch.zeros(3, 2)
    comp[1] = torch.tensor([0.0, 4.0])
    comp[0] = torch.tensor([100.0, 100.0])  # row 1: masked by its -1 below
    q = torch.zeros(1, 4, 2)
    q[0, 2:] = float("nan")  # padding heads: never read
    out = _attend(q, swa, torch.tensor([5]), torch.zeros(2), window=1, comp=comp,
                  rows=torch.tensor([[0, -1]]), table=((1, 0),))
    torch.testing.assert_close(out[0], ((swa[1] + comp[1]) / 3).expand(2, 2))


# ------------------------------------------------------------------------- capture contract


def _example_calls():
    """One call per op: (op name, reference body, arguments), shapes as in the contract."""
    torch.manual_seed(0)
    t, h, hp, d, rope_dim, bs, ratio = 3, 3, 4, 8, 4, 8, 4
    block_table = torch.tensor([[0, 2, 1], [1, 0, 2]])
    req_idx = torch.tensor([0, 1, 0])
    positions = torch.tensor([3, 17, 0])
    slots = torch.tensor([3, 9, -1])
    slots_total, comp_total = 3 * bs, 3 * bs // ratio
    return [
        ("fused_qnorm_rope_kv_insert", ops.fused_qnorm_rope_kv_insert_reference, (
            torch.randn(t, h, d), torch.randn(t, d), positions, slots, torch.randn(d),
            torch.zeros(slots_total + 1, d), torch.empty(t, hp, d), rope_dim, EPS)),
        ("save_partial_states", ops.save_partial_states_reference, (
            torch.randn(t, d), torch.randn(t, d), slots, torch.zeros(slots_total + 1, 2, d))),
        ("compress_norm_rope_store", ops.compress_norm_rope_store_reference, (
            positions, slots, req_idx, block_table, torch.randn(slots_total + 1, 2, d),
            torch.randn(d), torch.zeros(comp_total + 1, d), ratio, bs, rope_dim, EPS)),
        ("sparse_attn_indexer", ops.sparse_attn_indexer_reference, (
            torch.randn(t, 2, d), torch.randn(t, 2), torch.randn(comp_total + 1, d), positions,
            req_idx, block_table, torch.empty(t + 2, 8, dtype=torch.int32), ratio, bs)),
        ("sparse_attention", ops.sparse_attention_reference, (
            torch.randn(t, hp, d), torch.randn(slots_total + 1, d), torch.randn(comp_total + 1, d),
            torch.tensor([[0, 3, -1], [4, -1, 1], [-1, -1, -1]]), positions, req_idx, block_table,
            torch.randn(h), torch.empty(t, h, d), 5, ratio, bs, 0.25)),
        ("sparse_attention", ops.sparse_attention_reference, (
            torch.randn(t, hp, d), torch.randn(slots_total + 1, d), None, None, positions, req_idx,
            block_table, torch.randn(h), torch.empty(t, h, d), 5, 1, bs, 0.25)),
    ]


class _Recorder(TorchDispatchMode):
    """Records every op it sees and fails on the ops a host synchronisation goes through."""

    SYNCING = ("aten::_local_scalar_dense", "aten::nonzero", "aten::item")

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in self.SYNCING:
            raise AssertionError(f"{name}: a host synchronisation, not capturable")
        self.seen.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("index", range(6))
def test_op_is_one_op_under_a_dispatch_mode(index: int) -> None:
    name, _, args = _example_calls()[index]
    with _Recorder() as mode:
        getattr(torch.ops.dsv4, name)(*args)
    assert mode.seen == [f"dsv4::{name}"]


@pytest.mark.parametrize("index", range(6))
def test_reference_body_never_syncs_with_the_host(index: int) -> None:
    _, body, args = _example_calls()[index]
    with _Recorder() as mode:
        body(*args)
    assert mode.seen and all(n.startswith("aten::") for n in mode.seen)


def test_recorder_catches_a_sync() -> None:
    with pytest.raises(AssertionError, match="_local_scalar_dense"):
        with _Recorder():
            torch.ones(2).sum().item()


@pytest.mark.parametrize("index", range(6))
def test_fake_registration_matches_schema(index: int) -> None:
    name, _, args = _example_calls()[index]
    torch.library.opcheck(
        getattr(torch.ops.dsv4, name).default, args, test_utils=("test_schema", "test_faketensor")
    )


def test_mutated_arguments_are_declared() -> None:
    declared = {
        name: sorted(a.name for a in getattr(torch.ops.dsv4, name).default._schema.arguments
                     if a.alias_info is not None and a.alias_info.is_write)
        for name in ("fused_qnorm_rope_kv_insert", "save_partial_states", "compress_norm_rope_store",
                     "sparse_attn_indexer", "sparse_attention")
    }
    assert declared == {
        "fused_qnorm_rope_kv_insert": ["kv_cache", "q_out"],
        "save_partial_states": ["state_cache"],
        "compress_norm_rope_store": ["out_cache"],
        "sparse_attn_indexer": ["topk_out"],
        "sparse_attention": ["out"],
    }


# ------------------------------------------------------- the torch._dynamo import spared


def test_running_the_engine_does_not_import_torch_dynamo() -> None:
    """custom_op's dynamo guard would import torch._dynamo (seconds) at the first op call;
    a fresh process that runs the engine, its custom ops included, never loads it, and
    the ops still compute (the run equals its eager twin)."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from capturelint.engine.config import EngineConfig\n"
        "from capturelint.engine.llm import Engine, compare\n"
        "cfg = EngineConfig(runner='v1', cudagraph_mode='FULL', num_layers=2, steps=6)\n"
        "engine = Engine(cfg); engine.capture_model(); out = engine.generate()\n"
        "agreement, error = compare(out, Engine(cfg.eager_twin()).generate())\n"
        "print('torch._dynamo' in sys.modules, agreement, error < 1e-4)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "1.0", "True"], done.stdout


def test_the_dynamo_guard_is_kept_once_torch_dynamo_is_loaded(monkeypatch) -> None:
    """A program that has loaded torch._dynamo (it compiles something) keeps torch's guard
    on a newly registered op; before that, the op's body is its own disabled form."""
    import sys
    import types

    def register(name: str):
        def body(x: torch.Tensor) -> torch.Tensor:
            return x * 2

        op = torch.library.custom_op(f"capturelint_test::{name}", mutates_args=())(body)
        return op, [getattr(w, "__wrapped__", None) for w in op._backend_fns.values()]

    monkeypatch.setitem(sys.modules, "torch._dynamo", types.ModuleType("torch._dynamo"))
    kept, bodies = register("kept")
    ops.without_dynamo_import(kept)
    assert bodies and all(getattr(b, "__dynamo_disable", None) is None for b in bodies)

    monkeypatch.delitem(sys.modules, "torch._dynamo")
    spared, bodies = register("spared")
    ops.without_dynamo_import(spared)
    assert bodies and all(getattr(b, "__dynamo_disable", None) is b for b in bodies)
    torch.testing.assert_close(spared(torch.ones(2)), torch.full((2,), 2.0))
