"""The serving workload of a vLLM check, and the configuration it runs in (``RunSpec``).

**The workload** (``schedule``): requests of different prompt lengths (2 and 3
tokens) join and leave; step ``i`` runs ``batch_sizes[i % len]`` of them (default
1,2,3,3,2,1), the batch ordered decodes first. A joining request is prefilled whole in
its first step, from position 0. With compressed layers (the default) every other
request is a long one instead: its prompt begins at ``layers.START_POSITION``
(125), the positions before it are a stand-in prefill of its caches
(``LayerCaches.prefill``), and its prompt (125..127) is prefilled for real. The default
six steps are then a prefill step, two mixed steps (a decode and the long prompt; two
decodes at different positions and a fresh prompt: 4 tokens each, which PIECEWISE
replays and FULL_DECODE_ONLY runs eagerly), a decode batch padded from 3 to 4, a full
one and one padded from 1 to 2. They cross the ratio-4 boundaries (3, 127), the
ratio-128 boundary (127, inside the long prompt's prefill) and the indexer's switch
between its short-context fill and its real top-k, and every layer kind runs its
``_forward_prefill``: the long prompt with compressed entries (the indexer's prefill
chunk: gather, MQA logits, top-k; the C128A prefill indices; the compressed gather and
the combined indices), the fresh ones without (no chunk: vLLM's builder makes none).
``--layers 1`` (sliding-window only) runs every request fresh.
"""

from __future__ import annotations

import dataclasses

import torch

from capturelint.adapters.vllm import layers as vllm_layers
from capturelint.adapters.vllm.model import MAX_BLOCKS, SWA_BLOCK, VOCAB
from capturelint.adapters.vllm.options import DEFAULT_BATCH_SIZES, DEFAULT_CAPTURE_SIZES
from capturelint.options import CUDAGraphMode, EagerRegion, Runner

PROMPT_LENS = (2, 3)  # request r's prompt has PROMPT_LENS[r % 2] tokens
MAX_SEQ = MAX_BLOCKS * SWA_BLOCK  # a request finishes when it holds this many tokens


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One configuration: runner, CUDA-graph mode, region (``per-runner``: vLLM's own
    choice), size, seed, and the workload: ``capture_sizes`` (vLLM's
    ``cudagraph_capture_sizes``) and ``batch_sizes`` (the requests running in each
    step, cycled over ``steps``; see ``schedule``). ``batch``: the requests of the
    speculative-decoding loops (``runners.spec``), which run a fixed batch."""

    runner: Runner = Runner.V1
    mode: CUDAGraphMode = CUDAGraphMode.PIECEWISE
    eager_region: EagerRegion = EagerRegion.PER_RUNNER
    layers: int = 3
    steps: int = 6
    seed: int = 0
    capture_sizes: tuple[int, ...] = DEFAULT_CAPTURE_SIZES
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    batch: int = 2

@dataclasses.dataclass(frozen=True)
class Scheduled:
    """One request's share of a step: ``query_len`` tokens from position ``start`` (the
    tokens it computed before). ``query_len`` 1 after the first step: a decode."""

    req: int
    start: int
    query_len: int

def schedule(batch_sizes: tuple[int, ...], steps: int, long_context: int | None = None) -> list[tuple[Scheduled, ...]]:
    """The workload: step ``i`` runs ``batch_sizes[i % len(batch_sizes)]`` requests.

    As a scheduler with continuous batching would: a request that joins is prefilled
    whole in its first step (request ``r``'s prompt has ``PROMPT_LENS[r % 2]`` tokens,
    from position 0) and then decodes one token per step. With ``long_context``, the
    odd requests are long ones: their prompt begins at position ``long_context``, every
    position before its last token is a stand-in prefill of the caches, and they join
    with a decode of that token; when the batch shrinks the oldest requests
    leave, and a request that reaches ``MAX_SEQ`` tokens leaves and another joins. The
    batch is ordered decodes first, then the joining prefills (vLLM reorders it so,
    ``split_decodes_and_prefills``). A step that grows the batch is a mixed
    prefill-decode step (the first one a prefill-only step)."""
    running: list[tuple[int, int]] = []  # (request, tokens computed)
    next_req = 0
    out = []
    for i in range(steps):
        want = batch_sizes[i % len(batch_sizes)]
        running = [r for r in running if r[1] < MAX_SEQ]
        running = running[len(running) - want:] if len(running) > want else running
        batch = [Scheduled(req, computed, 1) for req, computed in running]
        while len(batch) < want:
            prompt = PROMPT_LENS[next_req % len(PROMPT_LENS)]
            long = long_context is not None and next_req % 2 == 1
            batch.append(Scheduled(next_req, long_context if long else 0, prompt))
            next_req += 1
        running = [(s.req, s.start + s.query_len) for s in batch]
        out.append(tuple(batch))
    return out

def workload(spec: RunSpec) -> list[tuple[Scheduled, ...]]:
    """``spec``'s steps: with compressed layers, long requests join near their
    boundaries (``layers.START_POSITION``; module docstring)."""
    compressed = any(r > 1 for r in vllm_layers.layer_ratios(spec.layers))
    return schedule(spec.batch_sizes, spec.steps, vllm_layers.START_POSITION if compressed else None)

def prompts(steps: list[tuple[Scheduled, ...]], seed: int) -> dict[int, torch.Tensor]:
    """Each request's prompt (request ``r``: ``PROMPT_LENS[r % 2]`` random tokens)."""
    gen = torch.Generator().manual_seed(seed + 1)
    return {r: torch.randint(0, VOCAB, (PROMPT_LENS[r % len(PROMPT_LENS)],), generator=gen)
            for r in sorted({s.req for step in steps for s in step})}


__all__ = ["DEFAULT_BATCH_SIZES", "DEFAULT_CAPTURE_SIZES", "MAX_SEQ", "PROMPT_LENS", "RunSpec", "Scheduled", "prompts",
           "schedule", "workload"]
