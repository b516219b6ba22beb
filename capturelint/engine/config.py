"""Configuration of the bundled engine: one frozen record, resolved and validated once.

**Idea.** Every knob that decides whether CUDA-graph replay of the bundled DeepSeek V4
model computes what eager execution computes lives here: the model runner, the graph
mode, the eager region of the attention, whether metadata tensors are persistent, the
kernels, the graph backend, the capture sizes, and the workload (seed, steps). The model
dimensions live here too, so a test can shrink or grow the model (a 61-layer topology
with tiny dims must run) without touching code.

**Defaults that depend on other fields** are resolved by properties rather than stored,
so a config keeps what the user asked for and can still say what it means:

- ``resolved_runner``: ``runner=None`` means the platform default for the architecture,
  looked up in ``DEFAULT_RUNNER`` (keyed by architecture *and* platform, the way vLLM
  settled it: DeepSeek V4 defaults to V2, except on ROCm where V1 is the default). There
  is deliberately no architecture denylist: which runner is safe for which mode is what
  the checker finds out from traces.
- ``effective_eager_region``: ``per-runner`` means ``wide`` under V1 and ``narrow`` under
  V2 (vLLM PR #52401).
- ``layer_ratios``: ``compress_ratios=None`` cycles ``(1, 4, 16, 4)`` over the layers.
- ``blocks_per_request``: ``max_blocks_per_request=None`` means just enough blocks for
  the longest request the workload can make (``max_prompt_len + steps`` positions).

**Validation** (``validate()``) raises ``CapturelintError`` with one line naming what is
wrong and what to do. It runs on every ``Engine``; a config that passes can be built.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any, Mapping

from capturelint.errors import CapturelintError
from capturelint.limits import MAX_LAYERS, MAX_STEPS, seed_problem
from capturelint.options import BreakOutputs, Choice, CUDAGraphMode, EagerRegion, Runner  # noqa: F401  (the engine's too)
from capturelint.runtime.breakable import GraphBackend

DEEPSEEK_V4 = "DeepseekV4ForCausalLM"
SUPPORTED_ARCHITECTURES = (DEEPSEEK_V4,)
DEFAULT_COMPRESS_RATIOS = (1, 4, 16, 4)
"""Cycled over the layers when ``compress_ratios`` is not given: a sliding-window layer,
an indexer layer, a large-ratio layer and another indexer layer, so four layers already
exercise every attention kind."""


class Platform(Choice):
    """Platform the engine pretends to run on. It only selects the default runner; the
    device is chosen by the graph backend (``cuda`` needs a GPU, ``emulated`` runs on
    the CPU)."""

    CUDA = "cuda"
    ROCM = "rocm"
    CPU = "cpu"


class Kernels(Choice):
    """Implementation of the KV-insert and sparse-attention kernels."""

    TORCH = "torch"
    TRITON = "triton"


DEFAULT_RUNNER: Mapping[tuple[str, Platform], Runner] = {
    (DEEPSEEK_V4, Platform.CUDA): Runner.V2,
    (DEEPSEEK_V4, Platform.ROCM): Runner.V1,
    (DEEPSEEK_V4, Platform.CPU): Runner.V2,
}
"""Default model runner per (architecture, platform), as vLLM settled it for DeepSeek V4:
V2 everywhere except ROCm, whose V2 support came later. A table of defaults, not a list
of forbidden combinations: every combination can be asked for explicitly."""

_REGION_PER_RUNNER: Mapping[Runner, EagerRegion] = {
    Runner.V1: EagerRegion.WIDE,
    Runner.V2: EagerRegion.NARROW,
}


def _coerce(value: Any, parse: Any) -> Any:
    """The enum member for ``value`` when it is a known spelling, else ``value`` as is
    (``validate()`` then reports it)."""
    if value is None:
        return None
    parsed = parse(value)
    return value if parsed is None else parsed


def _parse_mode(value: Any) -> CUDAGraphMode | None:
    if isinstance(value, CUDAGraphMode):
        return value
    try:
        return CUDAGraphMode.parse(str(value))
    except ValueError:
        return None


def _parse_backend(value: Any) -> GraphBackend | None:
    if isinstance(value, GraphBackend):
        return value
    try:
        return GraphBackend.parse(str(value))
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Everything that decides one engine run. Enum fields accept their spelling as a
    string (``runner="v1"``, ``cudagraph_mode="piecewise"``); unknown spellings are kept
    and reported by ``validate()``.

    Capture and runtime:

    - ``runner``: ``v1``, ``v2`` or ``None`` for the platform default (``DEFAULT_RUNNER``).
    - ``cudagraph_mode``: NONE, PIECEWISE, FULL, FULL_DECODE_ONLY or FULL_AND_PIECEWISE
      (vLLM's default).
    - ``eager_region``: ``narrow``, ``wide`` or ``per-runner``.
    - ``fresh_metadata``: V1 metadata builders allocate new tensors every step instead of
      handing out views of persistent buffers (the address hazard for FULL graphs).
      V2 builders always write persistent buffers and ignore it.
    - ``kernels``: ``torch`` reference ops or ``triton`` ones.
    - ``graph_backend``: ``emulated`` (CPU) or ``cuda`` (needs a GPU).
    - ``break_outputs``: ``COPY``, the runtime copies eager-break return values back
      into the capture-time tensors on replay (vLLM's newer runtime); ``DISCARD`` models
      the older runtime that discards them (``to_dict`` says it as
      ``copy_break_outputs``, true or false, as it always has).
    - ``capture_sizes``: padded token counts that get a graph.

    Workload: ``seed`` (weights and workload), ``steps`` (engine steps; every step runs
    one forward and samples one token per scheduled request), ``num_requests``,
    ``max_num_seqs`` (requests running at once, the largest decode batch),
    ``max_prompt_len``, ``max_num_batched_tokens`` (token budget of a step and size of
    the persistent input buffers).

    Model: ``num_layers``, ``compress_ratios`` (per layer; ``None`` cycles 1, 4, 16, 4),
    ``hidden_size``, ``num_heads``, ``head_dim`` (= the shared KV dim), ``rope_dim``,
    ``q_lora_rank``, ``o_lora_rank``, ``window``, ``index_num_heads``,
    ``index_head_dim``, ``index_topk``, ``num_experts``, ``num_experts_per_tok``,
    ``moe_intermediate_size``, ``vocab_size``, ``block_size``,
    ``max_blocks_per_request`` (``None``: as many as the workload needs), ``rms_eps``.

    Execution: ``torch_threads``, torch's intra-op threads while the engine captures and
    generates (restored afterwards; ``None`` leaves torch's setting). One by default:
    the engine's ops are tiny, so extra threads only add synchronisation (tens of times
    slower on a loaded machine), and single-threaded reductions give the same bits on
    every machine, which keeps reports byte-identical.
    """

    architecture: str = DEEPSEEK_V4
    runner: Runner | str | None = None
    platform: Platform | str = Platform.CUDA
    cudagraph_mode: CUDAGraphMode | str = CUDAGraphMode.FULL_AND_PIECEWISE
    eager_region: EagerRegion | str = EagerRegion.PER_RUNNER
    fresh_metadata: bool = False
    kernels: Kernels | str = Kernels.TORCH
    graph_backend: GraphBackend | str = GraphBackend.EMULATED
    break_outputs: BreakOutputs = BreakOutputs.COPY
    capture_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    seed: int = 0
    steps: int = 24
    num_requests: int = 8
    max_num_seqs: int = 4
    max_prompt_len: int = 20
    max_num_batched_tokens: int = 64
    num_layers: int = 4
    compress_ratios: tuple[int, ...] | None = None
    hidden_size: int = 64
    num_heads: int = 4
    head_dim: int = 32
    rope_dim: int = 8
    q_lora_rank: int = 32
    o_lora_rank: int = 32
    window: int = 8
    index_num_heads: int = 2
    index_head_dim: int = 16
    index_topk: int = 4
    num_experts: int = 4
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 64
    vocab_size: int = 256
    block_size: int = 16
    max_blocks_per_request: int | None = None
    rms_eps: float = 1e-6
    torch_threads: int | None = 1

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "runner", _coerce(self.runner, Runner.parse))
        set_(self, "platform", _coerce(self.platform, Platform.parse))
        set_(self, "cudagraph_mode", _coerce(self.cudagraph_mode, _parse_mode))
        set_(self, "eager_region", _coerce(self.eager_region, EagerRegion.parse))
        set_(self, "kernels", _coerce(self.kernels, Kernels.parse))
        set_(self, "graph_backend", _coerce(self.graph_backend, _parse_backend))
        if isinstance(self.capture_sizes, (list, range)):
            set_(self, "capture_sizes", tuple(self.capture_sizes))
        if isinstance(self.compress_ratios, (list, range)):
            set_(self, "compress_ratios", tuple(self.compress_ratios))

    # ------------------------------------------------------------------ resolution

    @property
    def resolved_runner(self) -> Runner:
        """The runner this config runs: the explicit one, or the platform default."""
        if isinstance(self.runner, Runner):
            return self.runner
        key = (self.architecture, self.platform)
        if key not in DEFAULT_RUNNER:
            raise CapturelintError(
                f"no default runner for {self.architecture} on platform {self.platform}; "
                "pass runner v1 or v2"
            )
        return DEFAULT_RUNNER[key]

    @property
    def effective_eager_region(self) -> EagerRegion:
        """``narrow`` or ``wide``; ``per-runner`` resolved by the runner."""
        if self.eager_region is EagerRegion.PER_RUNNER:
            return _REGION_PER_RUNNER[self.resolved_runner]
        return self.eager_region  # type: ignore[return-value]

    @property
    def layer_ratios(self) -> tuple[int, ...]:
        """Compression ratio of every layer (1 = sliding window only)."""
        if self.compress_ratios is not None:
            return tuple(self.compress_ratios)
        n = len(DEFAULT_COMPRESS_RATIOS)
        return tuple(DEFAULT_COMPRESS_RATIOS[i % n] for i in range(self.num_layers))

    @property
    def max_model_len(self) -> int:
        """The longest sequence the workload can make: prompt plus one token per step."""
        return self.max_prompt_len + self.steps

    @property
    def blocks_per_request(self) -> int:
        """Columns of the block table."""
        if self.max_blocks_per_request is not None:
            return self.max_blocks_per_request
        return max(1, math.ceil(self.max_model_len / self.block_size))

    @property
    def num_blocks(self) -> int:
        """Blocks in the KV-cache pool: enough for every running request at full length,
        so the allocator never runs dry."""
        return self.max_num_seqs * self.blocks_per_request

    @property
    def padded_heads(self) -> int:
        """Query heads padded to a multiple of 4, as the attention kernel takes them."""
        return -(-self.num_heads // 4) * 4

    def eager_twin(self) -> "EngineConfig":
        """The same configuration run eagerly: the ground truth it is compared with."""
        return dataclasses.replace(self, cudagraph_mode=CUDAGraphMode.NONE)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, with the resolved runner, region and ratios added."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "break_outputs":
                out["copy_break_outputs"] = v is BreakOutputs.COPY
                continue
            if isinstance(v, enum.Enum):
                v = str(v)
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        out["runner"] = str(self.resolved_runner)
        out["requested_runner"] = None if self.runner is None else str(self.runner)
        out["effective_eager_region"] = str(self.effective_eager_region)
        out["compress_ratios"] = list(self.layer_ratios)
        out["max_blocks_per_request"] = self.blocks_per_request
        return out

    # ------------------------------------------------------------------ validation

    def validate(self) -> "EngineConfig":
        """Raise ``CapturelintError`` (one line: what is wrong, what to do) unless the
        config can be built and run; return ``self`` so calls chain.

        Capture sizes must be positive, at most ``max_num_batched_tokens`` (the persistent
        input buffers a graph reads from), and, when any graph is captured, the largest
        must hold the workload's largest decode batch, ``max_num_seqs`` tokens: otherwise
        the steps where every running request decodes could never fit any graph and would
        all run eagerly, so the run would check nothing for them. Smaller batches are
        padded up to the next size; batches above the largest size run eagerly, as in
        vLLM, which is how long prefills are handled.
        """
        self._validate_choices()
        self._validate_counts()
        self._validate_model()
        self._validate_capture()
        return self

    def _validate_choices(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise CapturelintError(
                f"unknown architecture {self.architecture!r}; the bundled engine implements "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        checks = (
            ("runner", self.runner, Runner, Runner.spellings() + " (or leave it unset)"),
            ("platform", self.platform, Platform, Platform.spellings()),
            ("CUDA-graph mode", self.cudagraph_mode, CUDAGraphMode, ", ".join(m.value for m in CUDAGraphMode)),
            ("eager region", self.eager_region, EagerRegion, EagerRegion.spellings()),
            ("kernels", self.kernels, Kernels, Kernels.spellings()),
            ("graph backend", self.graph_backend, GraphBackend, ", ".join(m.value for m in GraphBackend)),
        )
        for what, value, enum_type, choices in checks:
            if value is None and enum_type is Runner:
                continue
            if not isinstance(value, enum_type):
                raise CapturelintError(f"unknown {what} {value!r}; use one of {choices}")
        self.resolved_runner  # raises when the table has no default for the platform

    def _validate_counts(self) -> None:
        positive = (
            ("layers", self.num_layers),
            ("steps", self.steps),
            ("num_requests", self.num_requests),
            ("max_num_seqs", self.max_num_seqs),
            ("max_prompt_len", self.max_prompt_len),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
        )
        if self.torch_threads is not None:
            positive += (("torch_threads", self.torch_threads),)
        for what, value in positive:
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise CapturelintError(f"{what} must be a positive integer, got {value!r}; pass a value >= 1")
        for what, value, maximum in (("layers", self.num_layers, MAX_LAYERS), ("steps", self.steps, MAX_STEPS)):
            if value > maximum:
                raise CapturelintError(f"{what} must be at most {maximum}, got {value}; pass a smaller value")
        problem = seed_problem(self.seed)
        if problem is not None:
            raise CapturelintError(f"seed {problem}, got {self.seed!r}; pass a smaller seed")
        if self.max_prompt_len > self.max_num_batched_tokens:
            raise CapturelintError(
                f"max_prompt_len {self.max_prompt_len} exceeds the step token budget "
                f"max_num_batched_tokens {self.max_num_batched_tokens}; raise the budget or shorten prompts"
            )
        if self.max_num_seqs > self.max_num_batched_tokens:
            raise CapturelintError(
                f"max_num_seqs {self.max_num_seqs} exceeds max_num_batched_tokens "
                f"{self.max_num_batched_tokens}; a decode batch must fit the token budget"
            )

    def _validate_model(self) -> None:
        dims = (
            ("hidden_size", self.hidden_size),
            ("num_heads", self.num_heads),
            ("head_dim", self.head_dim),
            ("q_lora_rank", self.q_lora_rank),
            ("o_lora_rank", self.o_lora_rank),
            ("window", self.window),
            ("index_num_heads", self.index_num_heads),
            ("index_head_dim", self.index_head_dim),
            ("index_topk", self.index_topk),
            ("num_experts", self.num_experts),
            ("num_experts_per_tok", self.num_experts_per_tok),
            ("moe_intermediate_size", self.moe_intermediate_size),
            ("vocab_size", self.vocab_size),
            ("block_size", self.block_size),
        )
        for what, value in dims:
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise CapturelintError(f"{what} must be a positive integer, got {value!r}")
        if self.rope_dim < 0 or self.rope_dim % 2:
            raise CapturelintError(f"rope_dim must be even and >= 0, got {self.rope_dim}")
        if self.rope_dim > min(self.head_dim, self.index_head_dim):
            raise CapturelintError(
                f"rope_dim {self.rope_dim} exceeds head_dim {self.head_dim} or index_head_dim "
                f"{self.index_head_dim}; RoPE covers the last rope_dim dims of a head"
            )
        if self.num_experts_per_tok > self.num_experts:
            raise CapturelintError(
                f"num_experts_per_tok {self.num_experts_per_tok} exceeds num_experts {self.num_experts}"
            )
        if self.max_blocks_per_request is not None:
            if self.max_blocks_per_request <= 0:
                raise CapturelintError(
                    f"max_blocks_per_request must be positive, got {self.max_blocks_per_request}"
                )
            if self.max_blocks_per_request * self.block_size < self.max_model_len:
                raise CapturelintError(
                    f"max_blocks_per_request {self.max_blocks_per_request} x block_size {self.block_size} "
                    f"holds fewer than the {self.max_model_len} positions the workload needs "
                    "(max_prompt_len + steps); raise it or leave it unset"
                )
        ratios = self.layer_ratios
        if len(ratios) != self.num_layers:
            raise CapturelintError(
                f"compress_ratios has {len(ratios)} entries for {self.num_layers} layers; give one per layer"
            )
        for i, r in enumerate(ratios):
            if not isinstance(r, int) or r <= 0 or self.block_size % r:
                raise CapturelintError(
                    f"compression ratio {r!r} of layer {i} must be a positive divisor of block_size "
                    f"{self.block_size}, so a compressed row never spans two blocks"
                )

    def _validate_capture(self) -> None:
        sizes = self.capture_sizes
        if any(not isinstance(s, int) or isinstance(s, bool) or s <= 0 for s in sizes):
            raise CapturelintError(f"capture sizes must be positive integers, got {list(sizes)}")
        if self.cudagraph_mode is CUDAGraphMode.NONE:
            return
        if not sizes:
            raise CapturelintError(
                f"mode {self.cudagraph_mode} captures graphs but capture sizes are empty; give at least one size"
            )
        if max(sizes) > self.max_num_batched_tokens:
            raise CapturelintError(
                f"capture size {max(sizes)} exceeds max_num_batched_tokens {self.max_num_batched_tokens}, "
                "the size of the persistent input buffers; drop it or raise the budget"
            )
        if max(sizes) < self.max_num_seqs:
            raise CapturelintError(
                f"largest capture size {max(sizes)} is smaller than the workload's decode batch of "
                f"{self.max_num_seqs} requests (max_num_seqs), so full decode batches never fit a graph; "
                f"add a capture size >= {self.max_num_seqs} or lower max_num_seqs"
            )
