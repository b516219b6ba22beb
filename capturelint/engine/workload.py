"""A deterministic synthetic workload: requests made from a seed, no tokenizer.

The workload is shaped so that a run exercises what graph replay depends on:

- request 0 arrives at step 0 and wants a token on every step, so every step has work
  and a run is exactly ``steps`` forwards long;
- request 1 arrives with it, so the first step is a prefill of two prompts (often more
  tokens than the largest capture size: an eager step);
- the others arrive at later steps, so prefills mix with running decodes (mixed
  batches) and wait when ``max_num_seqs`` requests are running;
- prompt lengths and ``max_new_tokens`` (between ``steps // 6`` and ``steps // 2`` for
  all but request 0) differ, so requests finish at different times, batch sizes
  change, and padding to the capture sizes varies.

Token ids are integers below ``vocab_size``. The same config gives the same workload.
"""

from __future__ import annotations

import dataclasses
import random

from capturelint.engine.config import EngineConfig


@dataclasses.dataclass(frozen=True)
class Request:
    """One generation request: its prompt, how many tokens it wants, when it arrives."""

    req_id: int
    prompt_token_ids: tuple[int, ...]
    max_new_tokens: int
    arrival_step: int

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclasses.dataclass(frozen=True)
class Workload:
    """The requests of one run, ordered by id (= arrival order)."""

    requests: tuple[Request, ...]


def make_workload(config: EngineConfig) -> Workload:
    """The workload of ``config``: a function of the seed, the steps and the sizes."""
    rng = random.Random(f"capturelint-workload:{config.seed}")
    steps = config.steps
    last_arrival = max(1, (2 * steps) // 3)
    # Short enough that requests finish mid-run and later ones take their place.
    shortest, longest = max(1, steps // 6), max(1, steps // 2)
    requests = []
    for i in range(config.num_requests):
        prompt_len = rng.randint(min(2, config.max_prompt_len), config.max_prompt_len)
        prompt = tuple(rng.randrange(config.vocab_size) for _ in range(prompt_len))
        if i == 0:
            arrival, max_new = 0, steps
        else:
            arrival = 0 if i == 1 else rng.randint(1, last_arrival)
            max_new = rng.randint(shortest, longest)
        requests.append(Request(i, prompt, max_new, arrival))
    return Workload(tuple(requests))
