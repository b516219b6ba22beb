"""A CPU reference for the routed experts of vLLM's unquantized fused MoE
(``model_executor/layers/fused_moe/``), which the gated delta-net family's tiny MoE
layer runs.

vLLM's ``UnquantizedFusedMoEMethod.forward_native`` hands the routed experts to its
modular kernel (``moe_kernel.apply``: prepare, the experts, finalize); a CUDA platform
builds it over Triton's fused MoE kernels (``experts/triton_moe.py``), the CPU platform
over ``vllm._C``/zentorch ones (``experts/cpu_moe.py``), neither of which a CPU without
vLLM's C++ extension runs. ``ReferenceMoEKernel`` stands in for the modular kernel: its
``apply`` is the op ``torch.ops.capturelint_vllm.fused_moe``:

``fused_moe(hidden [T, D], w13 [E, 2I, D], w2 [E, D, I], topk_weights [T, k], topk_ids [T, k], out [T, D])``
    ``out[t] = sum_j topk_weights[t, j] * w2[e] @ (silu(g) * u)`` with ``e = topk_ids[t,
    j]`` and ``g, u`` the two halves of ``w13[e] @ hidden[t]`` (SiLU-and-mul, vLLM's
    default ``MoEActivation.SILU``), in float32, stored in ``out``'s dtype. Written for
    capture: every expert computes every row and a one-hot of the routing picks (no
    host read of the routing), so the ops are the same for any routing.

The router (``select_experts``: softmax top-k, renormalised) and the shared expert stay
vLLM's (the shared expert runs before the routed ones: ``can_overlap_shared_experts``
is False, vLLM's order for a kernel that does not overlap it). Limits: SiLU only, no
expert map (expert parallelism), no routing weights applied on the input; a call with
one is refused in one line.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from capturelint.adapters.vllm.kernels.library import OWN_NAMESPACE, Impls, no_result_fake, own_op
from capturelint.errors import CapturelintError

FUSED_MOE = "fused_moe"


def reference_fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                        topk_ids: torch.Tensor, out: torch.Tensor) -> None:
    """The routed experts' sum (module docstring), written into ``out``."""
    experts = w13.shape[0]
    x = hidden.float()
    gate_up = torch.einsum("td,eid->eti", x, w13.float())  # [E, T, 2I]
    gate, up = gate_up.chunk(2, dim=-1)
    y = torch.einsum("eti,edi->etd", F.silu(gate) * up, w2.float())  # [E, T, D]
    onehot = F.one_hot(topk_ids.to(torch.int64).clamp(0, experts - 1), experts).float()  # [T, k, E]
    weight = (onehot * topk_weights.float()[:, :, None]).sum(1)  # [T, E]
    out.copy_(torch.einsum("te,etd->td", weight, y).to(out.dtype))


class _PrepareFinalize:
    """What vLLM reads of a modular kernel's prepare/finalize: no top-k index dtype wish."""

    def topk_indices_dtype(self) -> None:
        return None


class _Experts:
    consumes_expert_mask = False


class ReferenceMoEKernel:
    """The modular kernel's interface over ``fused_moe`` (module docstring)."""

    is_monolithic = False
    can_overlap_shared_experts = False

    def __init__(self) -> None:
        self.prepare_finalize = _PrepareFinalize()
        self.fused_experts = _Experts()

    def output_is_reduced(self) -> bool:
        return False

    def apply(self, hidden_states: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, activation: Any = None, global_num_experts: int = -1,
              expert_map: torch.Tensor | None = None, apply_router_weight_on_input: bool = False,
              shared_experts: Any = None, shared_experts_input: torch.Tensor | None = None) -> torch.Tensor:
        name = getattr(activation, "name", str(activation)).lower()
        if expert_map is not None or apply_router_weight_on_input or (activation is not None and name != "silu"):
            raise CapturelintError(f"vLLM's fused MoE was called with "
                                   + ("an expert map" if expert_map is not None
                                      else "router weights on the input" if apply_router_weight_on_input
                                      else f"activation {name}")
                                   + ", which capturelint's reference (kernels/moe.py) does not implement")
        out = torch.empty_like(hidden_states)
        own_op(FUSED_MOE, IMPLS)(hidden_states, w1, w2, topk_weights, topk_ids, out)
        return out


def install(model: torch.nn.Module) -> int:
    """Put ``ReferenceMoEKernel`` in each unquantized MoE layer of ``model`` (where vLLM's
    weight loading would build its kernel); returns how many."""
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

    count = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, UnquantizedFusedMoEMethod):
            method.moe_kernel = ReferenceMoEKernel()
            count += 1
    return count


IMPLS: Impls = {
    f"{OWN_NAMESPACE}::{FUSED_MOE}": (
        "(Tensor hidden, Tensor w13, Tensor w2, Tensor topk_weights, Tensor topk_ids, Tensor(a!) out) -> ()",
        reference_fused_moe, no_result_fake,
    ),
}


__all__ = ["FUSED_MOE", "IMPLS", "ReferenceMoEKernel", "install", "reference_fused_moe"]
