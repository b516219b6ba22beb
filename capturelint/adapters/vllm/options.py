"""vLLM's own options (``--engine vllm``), and what it reads of the shared ones.

Declared here, read by the adapter registry when a command builds its options (``check
--help`` lists them under "Engine options (vllm)"), by the settings reader (their keys)
and by the Python API (their keywords); resolved by ``plan.make_plan`` into ``Knobs``.
Nothing here imports torch or vLLM.

- ``--spec mtp|dspark``: speculative decoding: each step is the target's verify forward
  and the draft's forwards (``runners.spec``);
- ``--capture-sizes N,N,...``: vLLM's ``cudagraph_capture_sizes`` (default 2,4);
- ``--batch-sizes N,N,...``: the requests running in each step, cycled over ``--steps``
  (default 1,2,3,3,2,1; ``workload``);
- ``--model ARCH|all``: the architecture checked (``archs``; default
  ``DeepseekV4ForCausalLM``): a name of vLLM's model registry that the adapter builds, or
  ``all`` (every one, a row per architecture, runner and mode);
- ``--vllm-runner-impl real|reproduced``: which step loop runs a serving configuration:
  ``real`` (the default), vLLM's own model runners wherever they can drive it
  (PIECEWISE graphs; DeepSeek V4's FULL ones run the reproduction, ``runners.real`` says
  why; the generic attention family runs both modes there);
  ``reproduced``, the model runners' capture conditions reproduced for every
  configuration (``runners.reproduced``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from capturelint.adapters.vllm import archs
from capturelint.options import BreakOutputs, Choice, OptionProblem, OptionSpec, choice_value, sizes_value

DEFAULT_LAYERS = 3  # one layer of each kind (layers.layer_ratios)
MAX_TOKENS = 64  # scheduler_config.max_num_batched_tokens of the tiny model: the largest capture size
MAX_REQS = 16  # scheduler_config.max_num_seqs: the largest batch
DEFAULT_STEPS = 6
DEFAULT_CAPTURE_SIZES = (2, 4)  # the workload's (``workload.RunSpec``), known before torch loads
DEFAULT_BATCH_SIZES = (1, 2, 3, 3, 2, 1)
SPEC_METHODS = ("mtp", "dspark")  # the drafts vLLM 0.33.0 ships for DeepSeek V4


class SpecMethod(Choice):
    """``--spec``: the speculative-decoding method."""

    MTP = "mtp"
    DSPARK = "dspark"


class RunnerImpl(Choice):
    """``--vllm-runner-impl``: which step loop runs a serving configuration."""

    REAL = "real"  # vLLM's own model runners where they can drive it (PIECEWISE)
    REPRODUCED = "reproduced"  # their capture conditions, reproduced, everywhere


def model_value(value: Any) -> str:
    """``--model``: an architecture ``archs`` checks (any case), or ``all``; a name of
    vLLM's list not checked yet says why, any other name lists the supported ones."""
    if not isinstance(value, str):
        raise OptionProblem("must be an architecture name or \"all\"", f'"{archs.DEFAULT}"')
    if value.lower() == archs.ALL:
        return archs.ALL
    arch = archs.lookup(value)
    supported = ", ".join(archs.SUPPORTED) + " or all"
    if arch is None:
        raise OptionProblem(f"unknown architecture {value!r}; --engine vllm checks {supported}", alone=True)
    if not arch.supported:
        raise OptionProblem(f"architecture {arch.name} is not supported yet ({arch.reason}); --engine vllm checks "
                            f"{supported}", alone=True)
    return arch.name


READS = ("engine", "runner", "mode", "eager_region", "layers", "steps", "seed", "reuse")
"""The shared engine options it reads (``capturelint.common_options.ENGINE``)."""

DEFAULTS = {"runner": "all", "mode": "PIECEWISE,FULL", "layers": str(DEFAULT_LAYERS), "steps": str(DEFAULT_STEPS)}
"""What ``--help`` says of its defaults of the shared options."""

OPTIONS = (
    OptionSpec("spec", choice_value(SpecMethod, "speculative-decoding method"), "Speculative decoding: also check the "
               "draft model's graphs and the verify step, under the runners that support the method.", "",
               choices=SPEC_METHODS, default_text="none"),
    OptionSpec("capture_sizes", sizes_value, "The CUDA-graph capture sizes (vLLM's cudagraph_capture_sizes); each "
               "step replays the smallest one >= its token count, padded.", "", metavar="N,N,...",
               default_text="2,4"),
    OptionSpec("batch_sizes", sizes_value, "The requests running in each step, cycled over --steps; a growing batch "
               "prefills the joining requests (a mixed prefill-decode step), a shrinking one lets the oldest leave.",
               "", metavar="N,N,...", default_text="1,2,3,3,2,1"),
    OptionSpec("model", model_value, "The architecture checked: vLLM's own model class where the adapter builds "
               "one (a tiny configuration made in code, random weights), or all: every supported architecture, a row "
               "per architecture, runner and mode (docs/vllm-architectures.md).", "", metavar="ARCH",
               default=archs.DEFAULT),
    OptionSpec("vllm_runner_impl", choice_value(RunnerImpl, "runner implementation"), "Which step loop runs a "
               "serving configuration: vLLM's own model runners wherever they can drive it (PIECEWISE; FULL runs the "
               "reproduction), or the model runners' capture conditions reproduced everywhere.", "",
               choices=tuple(r.value for r in RunnerImpl), default=RunnerImpl.REAL),
)


@dataclasses.dataclass(frozen=True)
class Knobs:
    """vLLM's own options, resolved (command line over settings over these defaults):
    ``spec`` (None: the serving workload), the workload sizes (None: ``workload``'s
    defaults), the step loop of serving configurations."""

    spec: SpecMethod | None = None
    capture_sizes: tuple[int, ...] | None = None
    batch_sizes: tuple[int, ...] | None = None
    vllm_runner_impl: RunnerImpl = RunnerImpl.REAL
    model: str = archs.DEFAULT

    def recorded(self) -> dict[str, Any]:
        """What a region map records of them (``capturelint.snapshot.EngineParams``):
        vLLM 0.33.0's ``add_eager`` discards break outputs."""
        return {"break_outputs": BreakOutputs.DISCARD, "capture_sizes": self.capture_sizes,
                "batch_sizes": self.batch_sizes}


__all__ = ["DEFAULTS", "DEFAULT_BATCH_SIZES", "DEFAULT_CAPTURE_SIZES", "DEFAULT_LAYERS", "DEFAULT_STEPS", "Knobs", "MAX_REQS", "MAX_TOKENS", "OPTIONS", "READS", "RunnerImpl", "SPEC_METHODS",
           "SpecMethod"]
