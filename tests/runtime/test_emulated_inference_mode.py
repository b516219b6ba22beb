"""The emulated graph under ``torch.inference_mode()``, where vLLM captures and runs.

With autograd off, composite ops (``Tensor.to``, ``reshape``) reach dispatch modes
undecomposed, and their schemas say they may alias their input; a graph that took the
fresh tensor of a dtype conversion for an alias replayed stale (poisoned) values.
"""

from __future__ import annotations

import pytest
import torch

from capturelint.runtime.emulated import emulate_cuda


@pytest.mark.parametrize("inference", [False, True])
def test_a_dtype_conversion_is_recomputed_on_replay(inference):
    with emulate_cuda(force=True), torch.inference_mode(inference):
        ids = torch.tensor([1, 2])
        table = torch.randn(8, 4, dtype=torch.bfloat16)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = torch.nn.functional.embedding(ids, table).to(torch.float32).reshape(-1).pow(2)
        ids.copy_(torch.tensor([3, 4]))
        g.replay()
        assert torch.equal(out, table[[3, 4]].to(torch.float32).reshape(-1).pow(2))
