"""vLLM's own KDA kernels (``vllm/models/kimi_k3/nvidia/ops/third_party/kda``) run in Triton's interpreter on fixed fp32 inputs; their inputs
and outputs saved to the path given (``python kda_interpreted.py OUT.pt``).

``tests/vllm/test_family_kimi.py`` compares capturelint's references
(``kernels/kda.py``) with these outputs: live (slow: this script in a fresh
interpreter) and against the stored ``tests/vllm/data/kda_interpreted.pt`` (fast).

Why a fresh interpreter, and what it sets: ``TRITON_INTERPRET=1`` must be set before
Triton is imported, and vLLM keeps the real Triton (rather than its placeholders) only
when it finds one active driver or an empty ``CUDA_VISIBLE_DEVICES``
(``triton_utils/importing.py``). The autotuned kernels are given their first config
(the autotuner would time every config on a device); vLLM's pinned host staging is off
(no pinned allocator on a CPU); and FLA's module-level aliases of ``tl.exp``/``tl.log``
(``ops/op.py``) are rebound to call through ``tl``, which the interpreter patches
(the aliases keep the unpatched builtins). ``vllm.models.kimi_k3`` is entered as a bare
package so the kernels import without the model module (which loads everything).
"""

from __future__ import annotations

import os
import sys
import types

os.environ["TRITON_INTERPRET"] = "1"
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import torch  # noqa: E402

H, K = 2, 16
SLOTS = 5


def _prepare() -> types.ModuleType:
    import importlib.util

    import triton.language as tl
    import vllm.models
    import vllm.utils.torch_utils as torch_utils
    from triton.runtime import autotuner

    torch_utils.PIN_MEMORY = False
    autotuner.Autotuner.prune_configs = lambda self, kwargs: self.configs[:1]
    root = os.path.join(os.path.dirname(vllm.models.__file__), "kimi_k3")
    bare = types.ModuleType("vllm.models.kimi_k3")
    bare.__path__ = [root]
    sys.modules["vllm.models.kimi_k3"] = bare
    kda = importlib.import_module("vllm.models.kimi_k3.nvidia.ops.third_party.kda")
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(("vllm.third_party.flash_linear_attention",
                                                  "vllm.models.kimi_k3.nvidia.ops.third_party.kda")):
            continue
        for fn in ("exp", "exp2", "log", "log2"):
            if getattr(module, fn, None) is getattr(tl, fn):
                setattr(module, fn, (lambda f: lambda x: getattr(tl, f)(x))(fn))
    assert importlib.util.find_spec("triton") is not None
    return kda


def inputs() -> dict[str, torch.Tensor]:
    """Two prefill sequences (5 and 3 tokens; the second from a stored state), a decode
    batch of three (one padded: state index 0), gate parameters."""
    gen = torch.Generator().manual_seed(27)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    T = 8
    return {
        "q": randn(1, T, H, K), "k": randn(1, T, H, K), "v": randn(1, T, H, K),
        "raw_g": randn(1, T, H, K), "raw_beta": randn(1, T, H),
        "A_log": randn(H, scale=0.5), "dt_bias": randn(H * K, scale=0.5),
        "cu_seqlens": torch.tensor([0, 5, 8], dtype=torch.int32),
        "state": randn(SLOTS, H, K, K, scale=0.3),
        "mixed_qkv": randn(3, 3 * H * K), "decode_g": randn(1, 3, H, K), "decode_beta": randn(1, 3, H),
        "decode_slots": torch.tensor([4, 0, 1], dtype=torch.int32),
    }


def run(x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    kda = _prepare()
    got: dict[str, torch.Tensor] = {}
    for bound, tag in ((None, "softplus"), (-2.0, "bounded")):
        g, beta = kda.fused_kda_gate_chunk_cumsum(x["raw_g"], x["raw_beta"], x["A_log"], g_bias=x["dt_bias"],
                                                  lower_bound=bound, cu_seqlens=x["cu_seqlens"])
        got[f"gate_cumsum_{tag}"], got["beta"] = g, beta
        # the prefill recurrence: a state row per sequence, written after every token
        state = torch.zeros(SLOTS, H, K, K)
        state[2] = x["state"][2]
        rows = torch.tensor([[3] * 5, [2] * 5], dtype=torch.int32)
        q, k = (t.clone() for t in (x["q"], x["k"]))
        o, _ = kda.fused_recurrent_kda(q, k, x["v"].clone(), x["raw_g"], x["raw_beta"], x["A_log"], x["dt_bias"],
                                       bound, state, x["cu_seqlens"], rows)
        got[f"prefill_out_{tag}"], got[f"prefill_state_{tag}"] = o, state[[3, 2]]
        state = x["state"].clone()
        out, _ = kda.fused_recurrent_kda_packed_decode(x["mixed_qkv"], x["decode_g"], x["decode_beta"], x["A_log"],
                                                       x["dt_bias"], bound, state, x["decode_slots"])
        got[f"decode_out_{tag}"], got[f"decode_state_{tag}"] = out, state
    return got


if __name__ == "__main__":
    given = inputs()
    torch.save({"inputs": given, "vllm": run(given)}, sys.argv[1])
