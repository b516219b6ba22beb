"""The engine's front door: build, capture, generate, and compare with the eager twin.

``Engine(config)`` validates the config, builds the model from the seed, the KV caches,
the runner and the workload; ``capture_model()`` captures every graph up front (vLLM's
start-up flow); ``generate()`` runs ``config.steps`` steps and returns a
``GenerationResult``. ``run_with_eager_twin(config)`` runs a configuration and the same
configuration with graphs off (same seed, same workload, same schedule) and compares
them: the numerical oracle of docs/replay-model.md, and the engine's own acceptance test
(the outcome matrix of engine.md).

**Errors.** Configuration errors and failures of a graph capture (a host sync inside a
captured segment, a kernel that cannot run there) become ``CapturelintError``: one line,
exit status 2 at the command line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Iterator, NamedTuple

import torch

from capturelint.engine.config import EngineConfig
from capturelint.runtime.breakable import GraphBackend, HostSyncInCaptureError
from capturelint.engine.dsv4.model import DeepseekV4ForCausalLM, init_weights
from capturelint.runtime.forward_context import BatchDescriptor, CUDAGraphMode
from capturelint.engine.kv_cache import BlockAllocator, KVCache
from capturelint.engine.runner import RUNNERS, ModelRunner
from capturelint.engine.scheduler import Scheduler
from capturelint.engine.workload import Workload, make_workload
from capturelint.errors import CapturelintError

EQUAL_LOGIT_TOLERANCE = 1e-4
"""Largest per-step logit difference still counted as "replay equals eager": padded
graphs run matmuls of other shapes than the unpadded eager twin, which moves float32
results by ~1e-6; a wrong replay moves them by whole units."""


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """How one step ran: which requests, how many tokens (real and padded), in which
    runtime mode and graph (``descriptor`` is ``None`` when it ran eagerly), and the
    tokens it sampled (one per request, in ``req_ids`` order)."""

    step: int
    req_ids: tuple[int, ...]
    num_tokens: int
    num_padded: int
    num_prefills: int
    uniform_decode: bool
    runtime_mode: CUDAGraphMode
    descriptor: BatchDescriptor | None
    sampled: tuple[int, ...]


@dataclasses.dataclass(frozen=True, eq=False)
class GenerationResult:
    """One run's output.

    - ``tokens[r]``: the tokens request ``r`` generated, in order.
    - ``step_logits[s]``: ``[len(steps[s].req_ids), vocab]`` logits of the positions
      sampled at step ``s`` (each scheduled request's last token).
    - ``steps[s]``: how step ``s`` ran.
    - ``num_graphs``, ``num_eager_breaks``: graphs captured and eager segments in them,
      from the graph wrapper.
    """

    tokens: tuple[tuple[int, ...], ...]
    step_logits: tuple[torch.Tensor, ...]
    steps: tuple[StepRecord, ...]
    num_graphs: int
    num_eager_breaks: int

    @property
    def num_replayed_steps(self) -> int:
        return sum(1 for s in self.steps if s.descriptor is not None)


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` intra-op threads (``None``: unchanged), then restore."""
    if n is None or n == torch.get_num_threads():
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class Engine:
    """A configured engine: model, caches, runner, workload.

    The device is the GPU for ``graph_backend="cuda"`` (which needs one) and the CPU for
    the emulated backend.
    """

    def __init__(self, config: EngineConfig):
        config.validate()
        self.config = config
        self.device = self._device(config)
        region = config.effective_eager_region
        with torch.device(self.device):
            # Created on the device directly: the layers hold references to shared
            # buffers (the top-k buffer) that a later .to() would orphan.
            self.model = DeepseekV4ForCausalLM(config, region, config.max_num_batched_tokens, self.device)
        init_weights(self.model, config.seed)
        self.model.eval()
        self.kv_cache = KVCache(
            config.layer_ratios,
            config.num_blocks,
            config.block_size,
            config.head_dim,
            config.index_head_dim,
            device=self.device,
        )
        self.model.model.bind_kv_cache(self.kv_cache)
        self.runner: ModelRunner = RUNNERS[config.resolved_runner](config, self.model, self.kv_cache, self.device)
        self.workload: Workload = make_workload(config)
        self.captured = False

    @staticmethod
    def _device(config: EngineConfig) -> torch.device:
        if config.graph_backend is GraphBackend.CUDA:
            if not torch.cuda.is_available():
                raise CapturelintError("graph backend cuda needs a CUDA device and none is visible; use --graph-backend emulated")
            return torch.device("cuda")
        return torch.device("cpu")

    def capture_model(self) -> None:
        """Capture every graph of the configured mode (nothing under mode NONE)."""
        if self.captured:
            return
        try:
            with torch_threads(self.config.torch_threads):
                self.runner.capture_model()
        except HostSyncInCaptureError as e:
            raise CapturelintError(f"graph capture failed: {e}") from e
        except RuntimeError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CapturelintError(f"graph capture failed: {first}; the model cannot be captured in mode {self.config.cudagraph_mode}") from e
        self.captured = True

    def generate(self) -> GenerationResult:
        """Capture if not done yet, then run ``config.steps`` steps from empty caches."""
        self.capture_model()
        with torch_threads(self.config.torch_threads):
            return self._generate()

    def _generate(self) -> GenerationResult:
        config = self.config
        # Caches are cleared in place (captured graphs hold their storages) so that a
        # second generate() on the same engine starts from the same state as the first.
        self.kv_cache.zero_()
        scheduler = Scheduler(self.workload, config, BlockAllocator(config.num_blocks))
        logits: list[torch.Tensor] = []
        records: list[StepRecord] = []
        for step in range(config.steps):
            if not scheduler.has_work():
                break
            sched = scheduler.schedule(step)
            if not sched.requests:
                break
            try:
                out = self.runner.execute_model(sched)
            except HostSyncInCaptureError as e:
                raise CapturelintError(f"graph capture failed at step {step}: {e}") from e
            sampled = out.logits.argmax(dim=-1).tolist()
            scheduler.update(sched, sampled)
            logits.append(out.logits.detach().to("cpu", copy=True))
            records.append(
                StepRecord(
                    step=step,
                    req_ids=tuple(r.req_id for r in sched.requests),
                    num_tokens=out.num_tokens,
                    num_padded=out.num_padded,
                    num_prefills=sched.num_prefills,
                    uniform_decode=sched.uniform_decode,
                    runtime_mode=out.runtime_mode,
                    descriptor=out.descriptor,
                    sampled=tuple(sampled),
                )
            )
        return GenerationResult(
            tokens=scheduler.output_tokens(),
            step_logits=tuple(logits),
            steps=tuple(records),
            num_graphs=self.runner.num_graphs,
            num_eager_breaks=self.runner.num_eager_breaks,
        )

    def named_state_tensors(self):
        """See ``ModelRunner.named_state_tensors``."""
        return self.runner.named_state_tensors()


# ---------------------------------------------------------------------- comparison


class Comparison(NamedTuple):
    """``token_agreement``: the fraction of generated token positions (request ``r``,
    ``i``-th generated token, over all requests) where the captured run sampled the same
    token as its eager twin; 1.0 means identical generations.

    ``max_logit_error``: the largest absolute logit difference, over all sampled
    positions, of the steps whose inputs were still identical in both runs: every step
    up to and including the first step that sampled a differing token (all steps when
    none did). Later steps feed different tokens, so their logits would differ even if
    replay were exact; they are left out.
    """

    token_agreement: float
    max_logit_error: float


def first_divergent_step(captured: GenerationResult, eager: GenerationResult) -> int | None:
    """Index of the first step whose sampled tokens differ, or ``None``."""
    _check_same_schedule(captured, eager)
    for a, b in zip(captured.steps, eager.steps):
        if a.sampled != b.sampled:
            return a.step
    return None


def compare(captured: GenerationResult, eager: GenerationResult) -> Comparison:
    """Compare a run with its eager twin: see ``Comparison`` for both definitions."""
    _check_same_schedule(captured, eager)
    total = sum(len(t) for t in eager.tokens)
    same = sum(sum(1 for x, y in zip(a, b) if x == y) for a, b in zip(captured.tokens, eager.tokens))
    agreement = same / total if total else 1.0
    last = first_divergent_step(captured, eager)
    upto = len(eager.steps) if last is None else last + 1
    err = 0.0
    for a, b in zip(captured.step_logits[:upto], eager.step_logits[:upto]):
        err = max(err, float((a.double() - b.double()).abs().max()))
    return Comparison(agreement, err)


def _check_same_schedule(captured: GenerationResult, eager: GenerationResult) -> None:
    sa = [(s.req_ids, s.num_tokens) for s in captured.steps]
    sb = [(s.req_ids, s.num_tokens) for s in eager.steps]
    if sa != sb:
        raise CapturelintError("the two runs scheduled different batches; compare runs of the same workload and seed")


@dataclasses.dataclass(frozen=True, eq=False)
class TwinReport:
    """A configuration's run, its eager twin's run, and their comparison."""

    config: EngineConfig
    captured: GenerationResult
    eager: GenerationResult
    comparison: Comparison
    first_divergent_step: int | None

    @property
    def matches_eager(self) -> bool:
        """Same tokens everywhere and logits within ``EQUAL_LOGIT_TOLERANCE``."""
        c = self.comparison
        return c.token_agreement == 1.0 and c.max_logit_error < EQUAL_LOGIT_TOLERANCE

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready and deterministic: floats rounded to 6 significant digits so that
        float noise below that never changes the bytes."""
        cap = self.captured
        return {
            "config": self.config.to_dict(),
            "token_agreement": _round(self.comparison.token_agreement),
            "max_logit_error": _round(self.comparison.max_logit_error),
            "first_divergent_step": self.first_divergent_step,
            "matches_eager": self.matches_eager,
            "graphs": cap.num_graphs,
            "eager_breaks": cap.num_eager_breaks,
            "steps": len(cap.steps),
            "decode_steps": sum(1 for s in cap.steps if s.uniform_decode),
            "replayed_steps": cap.num_replayed_steps,
            "tokens_compared": sum(len(t) for t in self.eager.tokens),
        }


def _round(x: float) -> float:
    if x == 0 or not math.isfinite(x):
        return x
    return float(f"{x:.6g}")


def run_configuration(config: EngineConfig) -> GenerationResult:
    """Build an engine for ``config``, capture, generate."""
    return Engine(config).generate()


def run_with_eager_twin(config: EngineConfig) -> TwinReport:
    """Run ``config`` and its eager twin (mode NONE, everything else equal) and compare."""
    config.validate()
    captured = run_configuration(config)
    eager = run_configuration(config.eager_twin())
    return TwinReport(config, captured, eager, compare(captured, eager), first_divergent_step(captured, eager))
