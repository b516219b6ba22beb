"""The Triton kernels against the torch references, on CPU through Triton's interpreter.

``TRITON_INTERPRET`` is set before Triton is imported, as the interpreter requires; the
kernels themselves are decorated at their first launch, so the setting is what counts
then. The GPU test clears it to run the compiled kernels on CUDA tensors.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402

pytest.importorskip("triton")

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from capturelint.engine.dsv4 import ops, triton_kernels  # noqa: E402,F401  (registers the ops)

ATOL = RTOL = 1e-5
BLOCK_SIZE = 8
NUM_BLOCKS = 4
RATIO = 4


def _paged_batch(device: str = "cpu", seed: int = 0):
    """Two requests over a shuffled block table; tokens at positions that cross block
    boundaries and position 0, one padding token (slot -1, position 0)."""
    gen = torch.Generator().manual_seed(seed)
    block_table = torch.tensor([[2, 0, 3, 1], [1, 3, 0, 2]])
    req_idx = torch.tensor([0, 1, 0, 1, 0])
    positions = torch.tensor([0, 2, 9, 17, 0])
    slots = ops.token_slots(positions, req_idx, block_table, BLOCK_SIZE)
    slots[4] = -1
    return gen, {
        "positions": positions.to(device),
        "slot_mapping": slots.to(device),
        "req_idx": req_idx.to(device),
        "block_table": block_table.to(device),
    }


def _insert_args(device: str = "cpu", seed: int = 0):
    gen, batch = _paged_batch(device, seed)
    t, h, hp, d = 5, 3, 4, 16
    q = torch.randn(t, h, d, generator=gen)
    kv = torch.randn(t, d, generator=gen)
    weight = torch.randn(d, generator=gen)
    cache = torch.randn(NUM_BLOCKS * BLOCK_SIZE + 1, d, generator=gen)
    q_out = torch.full((t, hp, d), float("nan"))
    tensors = [q, kv, batch["positions"], batch["slot_mapping"], weight, cache, q_out]
    return [x.to(device) for x in tensors] + [8, 1e-6]


def _attention_args(with_comp: bool, device: str = "cpu", seed: int = 0):
    gen, batch = _paged_batch(device, seed)
    t, h, hp, d = 5, 3, 4, 16
    q = torch.randn(t, hp, d, generator=gen)
    q[:, h:] = float("nan")  # padding heads must never be read
    swa = torch.randn(NUM_BLOCKS * BLOCK_SIZE + 1, d, generator=gen)
    comp = torch.randn(NUM_BLOCKS * BLOCK_SIZE // RATIO + 1, d, generator=gen) if with_comp else None
    rows = (
        torch.tensor([[-1, -1, -1], [-1, -1, -1], [1, -1, 0], [3, 0, 2], [-1, -1, -1]])
        if with_comp else None
    )
    sink = torch.randn(h, generator=gen)
    out = torch.full((t, h, d), float("nan"))
    return [
        q.to(device), swa.to(device), None if comp is None else comp.to(device),
        None if rows is None else rows.to(device), batch["positions"], batch["req_idx"],
        batch["block_table"], sink.to(device), out.to(device),
        6, RATIO if with_comp else 1, BLOCK_SIZE, 0.25,
    ]


def _clone(args):
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def _check_insert(device: str) -> None:
    ref = _insert_args(device)
    tri = _clone(ref)
    scratch = ref[5][-1].clone()
    torch.ops.dsv4.fused_qnorm_rope_kv_insert(*ref)
    torch.ops.dsv4.fused_qnorm_rope_kv_insert_triton(*tri)
    torch.testing.assert_close(tri[6], ref[6], atol=ATOL, rtol=RTOL)
    # The reference sends the padding token to the scratch row; the kernel masks it.
    torch.testing.assert_close(tri[5][:-1], ref[5][:-1], atol=ATOL, rtol=RTOL)
    assert torch.equal(tri[5][-1], scratch)


def _check_attention(with_comp: bool, device: str) -> None:
    ref = _attention_args(with_comp, device)
    tri = _clone(ref)
    torch.ops.dsv4.sparse_attention(*ref)
    torch.ops.dsv4.sparse_attention_triton(*tri)
    assert not tri[8].isnan().any()
    torch.testing.assert_close(tri[8], ref[8], atol=ATOL, rtol=RTOL)


def test_insert_matches_reference() -> None:
    _check_insert("cpu")


@pytest.mark.parametrize("with_comp", [True, False], ids=["compressed", "window-only"])
def test_attention_matches_reference(with_comp: bool) -> None:
    _check_attention(with_comp, "cpu")


def test_attention_with_no_keys_is_zero() -> None:
    args = _attention_args(False)
    args[9] = 0  # window 0 and no compressed cache: the sink alone
    torch.ops.dsv4.sparse_attention_triton(*args)
    assert torch.equal(args[8], torch.zeros_like(args[8]))


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(func._schema.name)
        return func(*args, **(kwargs or {}))


def test_triton_ops_are_one_op_under_a_dispatch_mode() -> None:
    insert, attention = _insert_args(), _attention_args(True)
    with _Recorder() as mode:
        torch.ops.dsv4.fused_qnorm_rope_kv_insert_triton(*insert)
        torch.ops.dsv4.sparse_attention_triton(*attention)
    assert mode.seen == ["dsv4::fused_qnorm_rope_kv_insert_triton", "dsv4::sparse_attention_triton"]


def test_triton_ops_declare_the_references_mutations() -> None:
    for name in ("fused_qnorm_rope_kv_insert", "sparse_attention"):
        reference = getattr(torch.ops.dsv4, name).default._schema
        triton_schema = getattr(torch.ops.dsv4, f"{name}_triton").default._schema
        assert str(triton_schema).replace(f"{name}_triton", name) == str(reference)


def test_cpu_launch_without_interpreter_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        torch.ops.dsv4.sparse_attention_triton(*_attention_args(False))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_kernels_compiled_on_cuda_match_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # compile, rather than interpret
    _check_insert("cuda")
    _check_attention(True, "cuda")
    _check_attention(False, "cuda")
