"""``--engine vllm``: the plan of a vLLM check, its configurations, and the forward-context
probe of ``vllm.forward_context``.

Options, resolved like the bundled engine's (command line over settings over defaults):

- ``--runner v1|v2|all`` (default ``all``: a region change must hold under both);
- ``--mode PIECEWISE,FULL`` (default both; FULL_DECODE_ONLY and FULL_AND_PIECEWISE are
  dispatch policies over these two graphs, the same graphs here, and are refused);
- ``--eager-region``: ``per-runner`` (default) keeps vLLM's own choice
  (attention.py:323-328), ``narrow`` / ``wide`` force ``_prepare_and_attn`` /
  ``_prepare_and_attn_eager`` on every layer;
- ``--layers`` (default 3: one layer of each kind, ``layers``), ``--steps`` (engine steps, default 6), ``--seed``;
- the workload (``workload.schedule``): ``--capture-sizes`` (vLLM's
  ``cudagraph_capture_sizes``, default 2,4; each at most the runner's
  ``max_num_batched_tokens``, 64) and ``--batch-sizes`` (the requests running in each
  step, cycled over ``--steps``, default 1,2,3,3,2,1: a prefill step, a mixed
  prefill-decode step, decode batches padded to their capture size and ones that fill
  it, with long requests joining at the compressors' boundaries when the model has
  compressed layers; each at most ``max_num_seqs``, 16).
- ``--spec mtp|dspark``: speculative decoding (``runners.spec``): each step is the target's
  verify forward and the draft's forwards, their graphs captured as each runner
  captures them, over a fixed batch (``--capture-sizes``/``--batch-sizes`` are
  refused) and sliding-window target layers (``--layers`` 1, its default; more is
  refused). DSpark runs only on V2 (its default runner); ``--runner v1`` (or
  ``all``) with it is vLLM's own refusal (``DSPARK_V1_REFUSAL``).

``--fresh-metadata``, ``--kernels triton`` and ``--break-outputs`` describe the bundled
engine and are refused (vLLM 0.33.0's ``add_eager`` discards break outputs).
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import TYPE_CHECKING, Any, Callable

from capturelint.adapters.common import CheckPlan, layer_scope_group, region_map_of, resolve_plan, run_plan, slots
from capturelint.adapters.vllm.invariants import default_invariants
from capturelint.analyzer import RunLabel
from capturelint.errors import CapturelintError
from capturelint.harness import TwinResult
from capturelint.objects import named_tensors
from capturelint.options import ENGINE_OPTIONS, BreakOutputs, CUDAGraphMode, EngineOptions, Runner
from capturelint.pipeline import Configuration, check_configuration
from capturelint.records import ContextSnapshot, ContextSummary
from capturelint.report import ConfigReport, Report
from capturelint.settings import Settings

if TYPE_CHECKING:
    from capturelint.snapshot import RegionMap
    from capturelint.suggest import Slot

NAME = "vllm"
OPTIONS = frozenset(ENGINE_OPTIONS)  # those of the bundled engine alone are refused by value, in make_plan
OTHER_OPTIONS = ""
UNIT = "configuration"
VLLM_MODES = (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL)
DEFAULT_LAYERS = 3
DEFAULT_STEPS = 6
SPEC_METHODS = (None, "mtp", "dspark")  # --spec: none, or a draft vLLM 0.33.0 ships for DeepSeek V4

SPEC_LAYERS_REFUSAL = ("--layers {layers} with --spec: the speculative-decoding loop verifies over sliding-window "
                       "target layers only (its verify steps build no metadata for the compressed layers); use "
                       "--layers 1, its default")

DSPARK_V1_REFUSAL = ("--spec dspark needs --runner v2: vLLM 0.33.0 runs DSpark only on Model Runner V2 "
                     "(config/vllm.py:3110-3113 lists 'dspark speculative decoding' as unsupported by V1, and "
                     "_validate_v1_model_runner, :3332-3337, raises 'Model Runner V1 does not support: dspark "
                     "speculative decoding'); use --runner v2")


def make_plan(settings: Settings, options: EngineOptions) -> CheckPlan:
    """The plan of a vLLM check; options that describe the bundled engine are refused.
    The default invariants are vLLM's (``invariants``): the bundled engine's region
    decisions, selecting vLLM's functions."""
    if options.platform != "cuda":
        raise CapturelintError(f"--platform {options.platform} picks the bundled engine's default runner; --engine vllm "
                               "checks the CUDA path of vLLM's DeepSeek V4 attention, drop --platform")
    if options.fresh_metadata:
        raise CapturelintError("--fresh-metadata changes the bundled engine's metadata builders; it does not apply to "
                               "--engine vllm, drop it")
    if options.kernels not in (None, "torch"):
        raise CapturelintError("--kernels selects the bundled engine's kernels; --engine vllm runs vLLM's kernels' CPU "
                               "references, drop --kernels")
    if options.break_outputs is not None:
        raise CapturelintError("--break-outputs sets the bundled runtime's policy; vLLM 0.33.0's add_eager discards "
                               "break outputs, drop --break-outputs")

    if options.spec not in SPEC_METHODS:
        raise CapturelintError(f"unknown --spec {options.spec!r}; use mtp or dspark, or leave it out")

    def spec_runners(runners: tuple[Runner, ...]) -> None:
        if options.spec == "dspark" and Runner.V1 in runners:
            raise CapturelintError(DSPARK_V1_REFUSAL)

    def refused(mode: CUDAGraphMode) -> str | None:
        if mode in VLLM_MODES:
            return None
        return (f"--engine vllm checks the PIECEWISE and FULL graphs; mode {mode} is a dispatch policy over them, use "
                "--mode PIECEWISE,FULL")

    from capturelint.adapters.vllm.model import MAX_REQS, MAX_TOKENS

    if options.spec:
        for option, given in (("--capture-sizes", options.capture_sizes), ("--batch-sizes", options.batch_sizes)):
            if given:
                raise CapturelintError(f"{option} sets the serving workload; --spec runs its own loop of verify and "
                                       f"draft steps over a fixed batch, drop {option}")
    for option, sizes, most in (("--capture-sizes", options.capture_sizes, MAX_TOKENS),
                                ("--batch-sizes", options.batch_sizes, MAX_REQS)):
        if any(n > most for n in sizes):
            raise CapturelintError(f"{option} {','.join(map(str, sizes))}: each must be at most {most} (the runner's "
                                   f"{'max_num_batched_tokens' if most == MAX_TOKENS else 'max_num_seqs'})")
    # DSpark runs only on V2 (config/vllm.py:3110-3113): its default runner
    default_runners = (Runner.V2,) if options.spec == "dspark" else tuple(Runner)
    plan = resolve_plan(settings, options, NAME, default_runners=lambda: default_runners, default_modes=VLLM_MODES,
                        invariants=default_invariants, mode_refused=refused, check_runners=spec_runners,
                        break_outputs=BreakOutputs.DISCARD, spec=options.spec,
                        capture_sizes=tuple(sorted(set(options.capture_sizes))) or None,
                        batch_sizes=options.batch_sizes or None)
    if plan.spec and plan.layers not in (None, 1):  # from the command line or the settings
        raise CapturelintError(SPEC_LAYERS_REFUSAL.format(layers=plan.layers))
    return plan


def load(plan: CheckPlan) -> CheckPlan:
    """Nothing to load: vLLM's attention is built per configuration."""
    return plan


def forward_context_probe() -> ContextSnapshot:
    """Reads ``vllm.forward_context``: whether ``attn_metadata`` is a dict (a real step,
    or a capture with metadata) or not (a dummy or profile run), and the metadata's
    tensors by path (``attn_metadata['model.layers.0.attn.swa_cache'].slot_mapping``)."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return ContextSnapshot(ContextSummary("none", "no forward context was set"))
    md = get_forward_context().attn_metadata
    if not isinstance(md, dict):
        return ContextSnapshot(ContextSummary(
            "none", "attn_metadata was None (a dummy or profile run: no attention metadata)"))
    tensors: list[tuple[str, Any]] = []
    for key, value in md.items():
        tensors.extend(named_tensors(f"attn_metadata[{key!r}]", value, sep=""))
    return ContextSnapshot(ContextSummary("metadata", f"attn_metadata held {len(md)} entries"), tuple(tensors))


def _spec(plan: CheckPlan, runner: Runner, mode: CUDAGraphMode) -> Any:
    from capturelint.adapters.vllm.workload import RunSpec

    workload = {name: value for name, value in (("capture_sizes", plan.capture_sizes), ("batch_sizes", plan.batch_sizes))
                if value is not None}
    # --spec: sliding-window target layers (SPEC_LAYERS_REFUSAL)
    layers = plan.layers or (1 if plan.spec else DEFAULT_LAYERS)
    return RunSpec(runner=runner, mode=mode, eager_region=plan.eager_region, layers=layers,
                   steps=plan.steps or DEFAULT_STEPS, seed=plan.seed, **workload)


_MISSING_OP = re.compile(r"'_OpNamespace' '(\w+)' object has no attribute '(\w+)'")


def missing_op(e: BaseException) -> CapturelintError | None:
    """The one-line error for a ``torch.ops`` kernel vLLM called that does not exist
    here, found in ``e`` or its causes; None when ``e`` is something else."""
    from capturelint.adapters.vllm.kernels.reference import missing_kernel_error

    while e is not None:
        m = _MISSING_OP.search(str(e)) if isinstance(e, AttributeError) else None
        if m is not None:
            return CapturelintError(f"{missing_kernel_error(f'{m.group(1)}::{m.group(2)}')}; a vLLM other than "
                                    "0.33.0 may need one: add it there")
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return None


RUNNER_IMPL_ENV = "CAPTURELINT_VLLM_RUNNER_IMPL"


def real_runner(runner: Runner, mode: CUDAGraphMode) -> bool:
    """Whether vLLM's own model runner drives this configuration
    (``runners.real``: PIECEWISE graphs, V1 and V2) rather than ``reproduced``' reproduction of
    its capture conditions (FULL graphs, and PIECEWISE with ``shim``): the internal switch
    ``CAPTURELINT_VLLM_RUNNER_IMPL``, ``real`` (the default) or ``shim``."""
    from capturelint.adapters.vllm.runners import real

    impl = os.environ.get(RUNNER_IMPL_ENV, "real")
    if impl not in ("real", "shim"):
        raise CapturelintError(f"{RUNNER_IMPL_ENV}={impl!r} is not a runner implementation; use real or shim")
    return impl == "real" and real.supports(runner, mode)


def step_loop(plan: CheckPlan, runner: Runner, mode: CUDAGraphMode) -> Any:
    """The step loop of one configuration: the speculative-decoding loop of ``--spec``,
    vLLM's own model runner (``runners.real``) where it drives the configuration, else
    the model runner's capture conditions reproduced (``runners.reproduced``)."""
    if plan.spec:
        from capturelint.adapters.vllm.runners.spec import LOOPS

        return LOOPS[plan.spec]
    if real_runner(runner, mode):
        from capturelint.adapters.vllm.runners.real import VllmRunnerLoop

        return VllmRunnerLoop
    from capturelint.adapters.vllm.runners.reproduced import ReproducedLoop

    return ReproducedLoop


def configuration(plan: CheckPlan, runner: Runner, mode: CUDAGraphMode) -> Configuration:
    """Build the tiny model for one runner and mode (inside ``cpu_shim``, and for vLLM's
    own runner inside ``runners.real.runner_context``)."""
    from capturelint.adapters.vllm.model import compare, region_of

    spec = _spec(plan, runner, mode)
    loop = step_loop(plan, runner, mode)
    engine = loop(spec)

    def twin(output: Any) -> TwinResult:
        agreement, error = compare(output, loop(spec, graphs=False).generate())
        return TwinResult(agreement, error)

    return Configuration(RunLabel(str(runner), str(mode)), engine.generate, engine.roots(), region_of(engine.model),
                         forward_context_probe, layer_scope_group, twin, require_replays=True,
                         eager_region_option=str(plan.eager_region), invariants=plan.invariants,
                         capture_only=engine.capture)


def check_one(plan: CheckPlan, runner: Runner, mode: CUDAGraphMode, shadow: bool = True,
              static: bool = False) -> ConfigReport:
    """Build and check one configuration under ``cpu_shim``; a ``torch.ops`` kernel vLLM
    calls without a reference here (while building, running or in the eager twin) is the
    one-line error that names it."""
    from capturelint.adapters.vllm.install import cpu_shim
    from capturelint.adapters.vllm.runners.real import runner_context

    real = not plan.spec and real_runner(runner, mode)  # the speculative loops are runners.spec's
    with cpu_shim(), runner_context(runner) if real else contextlib.nullcontext():
        try:
            return check_configuration(configuration(plan, runner, mode), plan.codes, shadow=shadow, static=static)
        except (CapturelintError, AttributeError) as e:
            error = missing_op(e)
            if error is None:
                raise
            raise error from None


def run_check(plan: CheckPlan, progress: Callable[[str], None] | None = None, shadow: bool = True,
              static: bool = False, keep_captures: bool = False) -> Report:
    """Run the plan's configurations, each under ``cpu_shim`` (``plan.jobs`` at once: vLLM
    is imported before the workers are forked, and each worker builds its own model)."""
    from capturelint.adapters.vllm.install import require_vllm

    require_vllm()
    return run_plan(plan, check_one, progress, shadow, static, keep_captures, title="vLLM · ")


def record_regions(plan: CheckPlan, progress: Callable[[str], None] | None = None) -> RegionMap:
    """Every configuration's captures, recorded without the shadow."""
    return region_map_of(run_check(plan, progress, shadow=False), plan)


def suggest_slots(plan: CheckPlan) -> list[Slot]:
    """``capturelint suggest --engine vllm``: each check builds vLLM's attention afresh,
    so ``_prepare_and_attn_fn`` binds the functions made breaks at that moment; breaks
    are made with vLLM's own ``eager_break_during_capture``, the decorator its runtime
    knows (whose replays discard return values)."""
    from capturelint.adapters.vllm.install import require_vllm
    from capturelint.suggest import BreakDecorator

    require_vllm()  # for the CPU target, before anything of vLLM is imported
    from vllm.compilation.breakable_cudagraph import eager_break_during_capture

    decorator = BreakDecorator(eager_break_during_capture, "eager_break_during_capture",
                               "from vllm.compilation.breakable_cudagraph import eager_break_during_capture")
    return slots(plan, check_one, decorator)


__all__ = ["DEFAULT_LAYERS", "DEFAULT_STEPS", "NAME", "OPTIONS", "VLLM_MODES", "check_one", "configuration",
           "default_invariants", "forward_context_probe", "load", "make_plan", "missing_op", "record_regions",
           "run_check", "suggest_slots"]
