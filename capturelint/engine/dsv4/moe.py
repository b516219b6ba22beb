"""DeepSeek V4's mixture-of-experts feed-forward, written to be capturable.

A shared expert sees every token; ``num_experts`` routed experts see the tokens that
route to them, ``num_experts_per_tok`` per token, weighted by their renormalised router
scores.

**Fixed shapes, no host syncs.** Real MoE kernels gather the tokens of each expert, which
on the host means ``nonzero`` or a boolean mask: a host synchronisation that a graph
capture cannot contain. Here every expert runs on every token (the experts are few and
tiny) and the routing is a dense ``[T, E]`` gate matrix built with ``topk`` and
``scatter``, so the op sequence and every shape depend only on the token count.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SwiGLU(nn.Module):
    """The shared expert: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.w1 = nn.Linear(hidden, inter, bias=False)
        self.w3 = nn.Linear(hidden, inter, bias=False)
        self.w2 = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    """Shared expert plus top-k routed SwiGLU experts (stacked weights ``[E, ...]``)."""

    def __init__(self, hidden: int, inter: int, num_experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(hidden, num_experts, bias=False)
        self.w1 = nn.Parameter(torch.empty(num_experts, inter, hidden))
        self.w3 = nn.Parameter(torch.empty(num_experts, inter, hidden))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden, inter))
        self.shared_expert = SwiGLU(hidden, inter)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = torch.softmax(self.gate(x), dim=-1)  # [T, E]
        top_w, top_i = torch.topk(scores, self.top_k, dim=-1)
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        gates = torch.zeros_like(scores).scatter(1, top_i, top_w)  # [T, E], k nonzeros per row
        h1 = torch.einsum("th,eih->tei", x, self.w1)
        h3 = torch.einsum("th,eih->tei", x, self.w3)
        routed = torch.einsum("tei,ehi->teh", F.silu(h1) * h3, self.w2)  # [T, E, hidden]
        return self.shared_expert(x) + torch.einsum("te,teh->th", gates, routed)
