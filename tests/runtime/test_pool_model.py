"""The emulated caching allocator's private pools (``runtime.emulated``'s pool model).

The sizes, the best fit, splitting and merging follow c10/cuda/CUDACachingAllocator.cpp;
the captures follow PyTorch's "Graph memory management" notes: a capture into a shared
pool reuses the blocks an earlier capture freed, never those of live tensors.
"""

import pytest
import torch

from capturelint.runtime import protocol
from capturelint.runtime.emulated import (
    EmulatedStream,
    PrivatePool,
    emulate_cuda,
    private_pool,
    round_size,
    segment_size,
)

MiB = 1 << 20


def test_sizes_are_rounded_as_the_caching_allocator_rounds_them():
    assert [round_size(n) for n in (1, 511, 512, 513, 4000)] == [512, 512, 512, 1024, 4096]
    # small requests share 2 MiB segments, 1-10 MiB ones 20 MiB segments, larger ones their own
    assert [segment_size(n) for n in (512, MiB, MiB + 512, 10 * MiB - 512, 10 * MiB, 10 * MiB + 512)] == [
        2 * MiB, 2 * MiB, 20 * MiB, 20 * MiB, 10 * MiB, 12 * MiB]


def test_best_fit_splits_and_merges():
    pool, s = PrivatePool(("test", 1)), EmulatedStream()
    a, b, c = pool.malloc(1024, s), pool.malloc(4096, s), pool.malloc(1024, s)
    assert (b.ptr - a.ptr, c.ptr - b.ptr) == (1024, 4096)  # packed into one 2 MiB segment
    pool.free_block(b)
    pool.free_block(a)  # merges with the free block after it
    assert sorted(blk.size for blk in pool.free) == [5120, 2 * MiB - 6144]
    # the smallest block that fits, split: the rest stays free
    d = pool.malloc(1000, s)
    assert (d.ptr, d.size) == (a.ptr, 1024)
    assert sorted(blk.size for blk in pool.free) == [4096, 2 * MiB - 6144]


def test_a_large_block_is_split_only_when_more_than_a_small_request_is_left():
    pool, s = PrivatePool(("test", 2)), EmulatedStream()
    block = pool.malloc(19 * MiB, s)  # a 20 MiB segment; 1 MiB left is not worth a block
    assert block.size == 20 * MiB
    pool.free_block(block)
    block = pool.malloc(2 * MiB, s)
    assert block.size == 2 * MiB and [b.size for b in pool.free] == [18 * MiB]


def test_a_free_block_serves_its_own_stream_only():
    pool, s1, s2 = PrivatePool(("test", 3)), EmulatedStream(), EmulatedStream()
    a = pool.malloc(1024, s1)
    pool.free_block(a)
    assert pool.malloc(1024, s2).ptr != a.ptr
    assert pool.malloc(1024, s1).ptr == a.ptr


def _capture_docs_example(shared: bool):
    """PyTorch's "Sharing memory across captures" example; g1 frees an intermediate."""
    static_in_1, static_in_2 = torch.randn(256), torch.randn(256)
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):
        t = static_in_1 * 2
        static_out_1 = t + 1
        del t
    with torch.cuda.graph(g2, pool=g1.pool() if shared else None):
        static_out_2 = static_in_2 * 3
    return g1, g2, static_in_1, static_in_2, static_out_1, static_out_2


class Overwrites(protocol.CaptureObserver):
    def __init__(self):
        self.events = []

    def on_pool_overwrite(self, event):
        self.events.append(event)


def test_a_capture_into_a_shared_pool_reuses_the_block_a_former_capture_freed():
    with emulate_cuda(force=True), torch.no_grad(), protocol.observing(Overwrites()) as seen:
        g1, g2, in1, in2, out1, out2 = _capture_docs_example(shared=True)
        pool = private_pool(g1.pool())
        (t, o1), (o2,) = g1._pool_allocations, g2._pool_allocations
        assert o2.ptr == t.ptr and o1.ptr != t.ptr  # the freed intermediate's block, not the live output's
        assert set(pool.live) == {o1.sid, o2.sid}

        g1.replay(), g2.replay()  # capture order: g2 rewrites what g1 overwrote
        assert torch.equal(out2, in2 * 3) and torch.equal(out1, in1 * 2 + 1)
        g2.replay(), g1.replay()  # out of order: g1's intermediate lands in out2
        assert torch.equal(out2, in1 * 2)
        assert [(e.graph.id, e.writer.id, e.nbytes) for e in seen.events] == [(g2.info.id, g1.info.id, 1024)] * 2


def test_graphs_in_separate_pools_never_share_a_block():
    with emulate_cuda(force=True), torch.no_grad(), protocol.observing(Overwrites()) as seen:
        g1, g2, _, in2, _, out2 = _capture_docs_example(shared=False)
        assert private_pool(g1.pool()) is not private_pool(g2.pool())
        g2.replay(), g1.replay()
        assert torch.equal(out2, in2 * 3) and seen.events == []


def test_an_output_dropped_after_its_capture_is_reused_by_the_next_capture():
    with emulate_cuda(force=True), torch.no_grad():
        x = torch.randn(64)
        g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(g1):
            y1 = x + 1
        dropped = g1._pool_allocations[0]
        del y1  # the private pool gets the block back; g1's replays still write it
        with torch.cuda.graph(g2, pool=g1.pool()):
            y2 = x * 5
        assert g2._pool_allocations[0].ptr == dropped.ptr
        g1.replay()
        assert torch.equal(y2, x + 1)


@pytest.mark.parametrize("record", [False, True])
def test_record_stream_keeps_a_block_from_reuse_until_the_capture_ends(record):
    with emulate_cuda(force=True), torch.no_grad():
        x, side = torch.randn(64), torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            t = x * 2
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                s = t.sum()
            if record:
                t.record_stream(side)
            del t
            u = x + 1
            torch.cuda.current_stream().wait_stream(side)
        t_alloc, _, u_alloc = g._pool_allocations
        assert (u_alloc.ptr == t_alloc.ptr) is not record
        if record:  # freed when the capture ended
            assert t_alloc.sid not in private_pool(g.pool()).live
        del s, u
