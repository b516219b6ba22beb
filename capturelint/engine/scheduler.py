"""The request scheduler: whole-prompt prefill, then one token per step until done.

Per step, in this order: every running request decodes one token (its last sampled
token), then waiting requests that have arrived are admitted first-come first-served
while fewer than ``max_num_seqs`` run and their whole prompt fits the remaining token
budget (``max_num_batched_tokens``). Every scheduled request samples one token from the
logits of its last scheduled position (greedy). A request that has its
``max_new_tokens`` finishes and frees its KV blocks at once, so blocks get reused by
later requests.

The schedule never depends on the sampled token values (no stop tokens), so a captured
run and its eager twin schedule identical batches step for step even after their
tokens diverge; this is what makes a token-by-token comparison meaningful.
"""

from __future__ import annotations

import dataclasses
import math

from capturelint.engine.config import EngineConfig
from capturelint.engine.kv_cache import BlockAllocator
from capturelint.engine.workload import Request, Workload


@dataclasses.dataclass(frozen=True)
class ScheduledRequest:
    """One request's share of a step: ``token_ids`` at positions ``start_position ..``."""

    req_id: int
    token_ids: tuple[int, ...]
    start_position: int
    block_ids: tuple[int, ...]
    is_prefill: bool

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclasses.dataclass(frozen=True)
class SchedulerOutput:
    """What one step runs, decodes first, then prefills."""

    step: int
    requests: tuple[ScheduledRequest, ...]

    @property
    def num_tokens(self) -> int:
        return sum(r.num_tokens for r in self.requests)

    @property
    def uniform_decode(self) -> bool:
        """Every request decodes exactly one token: the batch a FULL decode graph takes."""
        return all(not r.is_prefill and r.num_tokens == 1 for r in self.requests)

    @property
    def num_prefills(self) -> int:
        return sum(1 for r in self.requests if r.is_prefill)


@dataclasses.dataclass
class _RequestState:
    request: Request
    output_token_ids: list[int] = dataclasses.field(default_factory=list)
    block_ids: list[int] = dataclasses.field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return self.request.prompt_len + len(self.output_token_ids)

    @property
    def finished(self) -> bool:
        return len(self.output_token_ids) >= self.request.max_new_tokens


class Scheduler:
    """Schedules a ``Workload`` step by step; ``update`` feeds back the sampled tokens."""

    def __init__(self, workload: Workload, config: EngineConfig, allocator: BlockAllocator):
        self.block_size = config.block_size
        self.max_num_seqs = config.max_num_seqs
        self.token_budget = config.max_num_batched_tokens
        self.allocator = allocator
        self.waiting: list[_RequestState] = [_RequestState(r) for r in workload.requests]
        self.running: list[_RequestState] = []
        self.states = {s.request.req_id: s for s in self.waiting}

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, step: int) -> SchedulerOutput:
        scheduled: list[ScheduledRequest] = []
        budget = self.token_budget
        for state in self.running:
            position = state.num_tokens - 1
            scheduled.append(self._schedule(state, (state.output_token_ids[-1],), position, False))
            budget -= 1
        while self.waiting and len(self.running) < self.max_num_seqs:
            state = self.waiting[0]
            req = state.request
            if req.arrival_step > step or req.prompt_len > budget:
                break
            self.waiting.pop(0)
            self.running.append(state)
            scheduled.append(self._schedule(state, req.prompt_token_ids, 0, True))
            budget -= req.prompt_len
        return SchedulerOutput(step, tuple(scheduled))

    def _schedule(
        self, state: _RequestState, token_ids: tuple[int, ...], start: int, is_prefill: bool
    ) -> ScheduledRequest:
        needed = math.ceil((start + len(token_ids)) / self.block_size) - len(state.block_ids)
        if needed > 0:
            state.block_ids.extend(self.allocator.allocate(needed))
        return ScheduledRequest(state.request.req_id, token_ids, start, tuple(state.block_ids), is_prefill)

    def update(self, output: SchedulerOutput, sampled: list[int]) -> None:
        """Append each scheduled request's sampled token; finish and free the done ones."""
        for req, token in zip(output.requests, sampled):
            self.states[req.req_id].output_token_ids.append(token)
        still = []
        for state in self.running:
            if state.finished:
                self.allocator.free(state.block_ids)
                state.block_ids = []
            else:
                still.append(state)
        self.running = still

    def output_tokens(self) -> tuple[tuple[int, ...], ...]:
        """Generated tokens per request, by request id."""
        return tuple(tuple(self.states[i].output_token_ids) for i in sorted(self.states))
