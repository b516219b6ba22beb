"""The causal conv1d references (``kernels/causal_conv1d.py``) against vLLM's own Triton
kernels (``model_executor/layers/mamba/ops/causal_conv1d.py``) run as they are in
Triton's interpreter (``kernels.interpreter``), fp32, on the same inputs: a prefill
batch (initial state or not, a sequence shorter than the window, one on the null
block), single-token decode with a padded (null-block) row, varlen decode, speculative
decode (the sliding window of drafts)."""

from __future__ import annotations

import pytest
import torch


DIM, LINES = 8, 6
MODULE = "vllm.model_executor.layers.mamba.ops.causal_conv1d"


def _theirs(name, *args, **kwargs):
    """vLLM's launcher ``name`` over its kernel in Triton's interpreter (``triton_twin``)."""
    from triton_twin import run  # tests/vllm/triton_twin.py

    return run(MODULE, name, *args, **kwargs)


def _weights(width, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(DIM, width, generator=gen), torch.randn(DIM, generator=gen), gen


def _states(width, gen, extra=0):
    """A token-major cache seen as ``[lines, dim, columns]`` (vLLM's SD layout, transposed)."""
    return torch.randn(LINES, width - 1 + extra, DIM, generator=gen).transpose(1, 2)


def _prefill(width, seed=0):
    weight, bias, gen = _weights(width, seed)
    lens = [5, 2, 1, 7]  # 2 and 1: shorter than the window
    tokens = sum(lens)
    x = torch.randn(tokens, DIM, generator=gen).t()  # [dim, T], channel-last as the mixer passes it
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return x, weight, bias, _states(width, gen), qsl


def _metadata(qsl):
    """The launch bookkeeping vLLM's Mamba metadata builder hands the kernel (the chunks of
    8 tokens each sequence splits into: ``compute_causal_conv1d_metadata``'s layout);
    its own helper pins memory, which wants a GPU."""
    from types import SimpleNamespace

    nums = -(-qsl.diff().long() // 8)
    chunks = [(seq, chunk) for seq, n in enumerate(nums.tolist()) for chunk in range(n)]
    batch_ptr = torch.full((64,), -1, dtype=torch.int32)
    offsets = torch.full((64,), -1, dtype=torch.int32)
    batch_ptr[:len(chunks)] = torch.tensor([c[0] for c in chunks], dtype=torch.int32)
    offsets[:len(chunks)] = torch.tensor([c[1] for c in chunks], dtype=torch.int32)
    entry = {"tot": len(chunks), "mlist_len": len(chunks), "mlist": batch_ptr[:len(chunks)],
             "offsetlist": offsets[:len(chunks)], "batch_ptr": batch_ptr, "token_chunk_offset_ptr": offsets}
    return SimpleNamespace(nums_dict={8: entry}, batch_ptr=batch_ptr, token_chunk_offset_ptr=offsets)


@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("activation", ["silu", None])
def test_causal_conv1d_fn_reference_matches_vllms_triton_kernel(width, activation):
    from capturelint.adapters.vllm.kernels.causal_conv1d import causal_conv1d_fn

    x, weight, bias, states, qsl = _prefill(width)
    indices = torch.tensor([2, 1, 5, 3], dtype=torch.int32)
    has = torch.tensor([True, True, False, True])
    theirs_states, ours_states = states.clone(), states.clone()
    theirs = _theirs("causal_conv1d_fn", x, weight, bias, theirs_states, qsl, indices, has, activation,
                     metadata=_metadata(qsl))
    ours = causal_conv1d_fn(x, weight, bias, ours_states, qsl, indices, has, activation)
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()
    assert torch.allclose(ours_states, theirs_states, atol=1e-6)
    assert not torch.equal(ours_states[[1, 2, 3, 5]], states[[1, 2, 3, 5]])  # every line written
    assert torch.equal(ours_states[[0, 4]], states[[0, 4]])  # no other


def test_causal_conv1d_fn_skips_a_null_block_sequence_and_ignores_a_state_it_does_not_start_from():
    from capturelint.adapters.vllm.kernels.causal_conv1d import causal_conv1d_fn

    x, weight, bias, states, qsl = _prefill(4, seed=1)
    indices = torch.tensor([2, 0, 5, 3], dtype=torch.int32)  # sequence 1 on the null block 0
    has = torch.tensor([False, True, True, True])
    theirs_states, ours_states = states.clone(), states.clone()
    theirs = _theirs("causal_conv1d_fn", x, weight, bias, theirs_states, qsl, indices, has, "silu",
                     metadata=_metadata(qsl))
    ours = causal_conv1d_fn(x, weight, bias, ours_states, qsl, indices, has, "silu")
    live = torch.ones(x.shape[1], dtype=torch.bool)
    live[5:7] = False  # the null-block sequence's columns: the kernel leaves them unwritten
    assert torch.allclose(ours[:, live], theirs[:, live], atol=1e-5)
    assert torch.equal(ours[:, ~live], torch.zeros(DIM, 2))
    assert torch.allclose(ours_states, theirs_states, atol=1e-6)
    assert torch.equal(ours_states[0], states[0])
    # sequence 0 starts from zeros: its state line's values do not reach its output
    poked = states.clone()
    poked[2] += 100.0
    again = causal_conv1d_fn(x, weight, bias, poked, qsl, indices, has, "silu")
    assert torch.equal(again[:, :5], ours[:, :5])


@pytest.mark.parametrize("width", [3, 4])
def test_causal_conv1d_update_reference_matches_vllms_triton_kernel_for_single_token_decode(width):
    from capturelint.adapters.vllm.kernels.causal_conv1d import causal_conv1d_update

    weight, bias, gen = _weights(width, 2)
    states = _states(width, gen)
    x = torch.randn(4, DIM, generator=gen)
    indices = torch.tensor([3, 1, 0, 4], dtype=torch.int32)  # row 2 padded: the null block
    theirs_states, ours_states = states.clone(), states.clone()
    theirs = _theirs("causal_conv1d_update", x.clone(), theirs_states, weight, bias, "silu",
                     conv_state_indices=indices)
    ours = causal_conv1d_update(x.clone(), ours_states, weight, bias, "silu", conv_state_indices=indices)
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()
    assert torch.equal(ours[2], x[2])  # a padded row is left as it was (in place: x itself)
    assert torch.allclose(ours_states, theirs_states, atol=1e-6)
    assert torch.equal(ours_states[[0, 2, 5]], states[[0, 2, 5]])
    # the window slid by one: the old columns 1.. then the token
    assert torch.equal(ours_states[3, :, :-1], states[3, :, 1:])
    assert torch.equal(ours_states[3, :, -1], x[0])


def test_causal_conv1d_update_writes_out_when_given_and_leaves_x():
    from capturelint.adapters.vllm.kernels.causal_conv1d import causal_conv1d_update

    weight, bias, gen = _weights(4, 3)
    states = _states(4, gen)
    x = torch.randn(2, DIM, generator=gen)
    out = torch.full_like(x, 9.0)
    kept = x.clone()
    result = causal_conv1d_update(x, states, weight, bias, None, conv_state_indices=torch.tensor([1, 2]), out=out)
    assert torch.equal(x, kept)
    assert result.data_ptr() == out.data_ptr() and not torch.equal(out, torch.full_like(x, 9.0))


def test_causal_conv1d_update_reference_matches_vllms_triton_kernel_varlen():
    from capturelint.adapters.vllm.kernels.causal_conv1d import causal_conv1d_update

    weight, bias, gen = _weights(4, 4)
    states = _states(4, gen)
    x = torch.randn(5, DIM, generator=gen)
    qsl = torch.tensor([0, 1, 2, 3, 3], dtype=torch.int32)  # three decodes, one empty sequence
    indices = torch.tensor([2, 4, 1, 5], dtype=torch.int32)
    theirs_states, ours_states = states.clone(), states.clone()
    theirs = _theirs("causal_conv1d_update", x.clone(), theirs_states, weight, bias, "silu",
                     conv_state_indices=indices, query_start_loc=qsl, max_query_len=1)
    ours = causal_conv1d_update(x.clone(), ours_states, weight, bias, "silu", conv_state_indices=indices,
                                query_start_loc=qsl, max_query_len=1)
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()
    assert torch.equal(ours[3:], x[3:])  # rows past the last sequence: not written
    assert torch.allclose(ours_states, theirs_states, atol=1e-6)
    assert torch.equal(ours_states[5], states[5])  # the empty sequence's line


def test_causal_conv1d_update_reference_matches_vllms_triton_kernel_for_speculative_decode():
    from capturelint.adapters.vllm.kernels.causal_conv1d import causal_conv1d_update

    width, drafts = 4, 2
    weight, bias, gen = _weights(width, 5)
    states = _states(width, gen, extra=drafts)  # W-1+num_spec columns
    query = drafts + 1
    x = torch.randn(3 * query, DIM, generator=gen)
    qsl = torch.tensor([0, 3, 6, 9], dtype=torch.int32)
    accepted = torch.tensor([1, 3, 2], dtype=torch.int32)
    indices = torch.tensor([1, 3, 4], dtype=torch.int32)
    theirs_states, ours_states = states.clone(), states.clone()
    theirs = _theirs("causal_conv1d_update", x.clone(), theirs_states, weight, bias, "silu",
                     conv_state_indices=indices, num_accepted_tokens=accepted, query_start_loc=qsl,
                     max_query_len=query)
    ours = causal_conv1d_update(x.clone(), ours_states, weight, bias, "silu", conv_state_indices=indices,
                                num_accepted_tokens=accepted, query_start_loc=qsl, max_query_len=query)
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()
    assert torch.allclose(ours_states, theirs_states, atol=1e-6)
    # sequence 1 accepted 3: its window starts 2 columns in, and the new line is
    # columns 3.. of the old line then its 3 tokens
    assert torch.equal(ours_states[3, :, :width - 2], states[3, :, 3:width + 1])
    assert torch.equal(ours_states[3, :, width - 2:], x[3:6].t())


def test_the_references_refuse_what_they_do_not_implement_in_one_line():
    from capturelint.adapters.vllm.kernels.causal_conv1d import causal_conv1d_fn, causal_conv1d_update
    from capturelint.errors import CapturelintError

    x, _, bias, states, qsl = _prefill(4)
    with pytest.raises(CapturelintError, match="width-5 kernel .*kernels/causal_conv1d.py"):
        causal_conv1d_fn(x, torch.zeros(DIM, 5), bias, states, qsl)
    with pytest.raises(CapturelintError, match="activation None, True, 'silu' or 'swish', not 'relu'"):
        causal_conv1d_update(torch.zeros(2, DIM), states, torch.zeros(DIM, 4), activation="relu")


def test_the_decode_reference_reads_no_host_value():
    """Capture-safe: the same calls with other indices and lengths record the same ops
    (no ``.item()``/``.tolist()`` and no shape decided by a tensor's values)."""
    from capturelint.adapters.vllm.kernels.causal_conv1d import reference_causal_conv1d_update

    weight, bias, gen = _weights(4, 6)
    states = _states(4, gen, extra=2)
    x = torch.randn(6, DIM, generator=gen)
    calls: list[str] = []

    class Count(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", str(func))
            if name in ("item", "tolist", "nonzero", "__bool__", "__int__"):
                raise AssertionError(f"host read: {name}")
            calls.append(name)
            return func(*args, **(kwargs or {}))

    runs = []
    for qsl, accepted in (([0, 3, 6], [1, 2]), ([0, 2, 5], [3, 1])):
        calls.clear()
        with Count():
            reference_causal_conv1d_update(x, states, weight, bias, True, torch.tensor([1, 2]),
                                           torch.tensor(accepted), torch.tensor(qsl), 3, 0, x.clone())
        runs.append(list(calls))
    assert runs[0] == runs[1] and len(runs[0]) > 10
