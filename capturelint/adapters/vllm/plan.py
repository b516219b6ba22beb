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

- ``--vllm-runner-impl real|reproduced`` (``options``): vLLM's own model runners drive
  the PIECEWISE configurations (``runners.real``, the default), or the reproduction of
  their capture conditions drives every one (``runners.reproduced``; FULL always).

vLLM's own options are declared in ``options`` and resolve into ``options.Knobs``
(``plan.knobs``); the bundled engine's (``--fresh-metadata``, ``--kernels``,
``--break-outputs``, ``--platform``) are refused by the adapter registry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from typing import TYPE_CHECKING, Any, Callable

from capturelint.adapters.common import (
    CheckPlan,
    layer_scope_group,
    region_map_of,
    resolve_knobs,
    resolve_plan,
    run_plan,
    slots,
)
from capturelint.adapters.vllm.invariants import default_invariants
from capturelint.adapters.vllm.options import (
    DEFAULT_LAYERS,
    DEFAULT_STEPS,
    MAX_REQS,
    MAX_TOKENS,
    Knobs,
    RunnerImpl,
    SpecMethod,
)
from capturelint.analyzer import RunLabel
from capturelint.errors import CapturelintError
from capturelint.options import CUDAGraphMode, EngineOptions, Runner
from capturelint.records import ContextSnapshot, ContextSummary
from capturelint.settings import Settings

if TYPE_CHECKING:
    from capturelint.pipeline import Configuration
    from capturelint.report import ConfigReport, Report
    from capturelint.snapshot import RegionMap
    from capturelint.suggest import Slot

NAME = "vllm"
UNIT = "configuration"
VLLM_MODES = (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL)
RETIRED_ENV = "CAPTURELINT_VLLM_RUNNER_IMPL"  # read by earlier versions; --vllm-runner-impl now

SPEC_LAYERS_REFUSAL = ("--layers {layers} with --spec: the speculative-decoding loop verifies over sliding-window "
                       "target layers only (its verify steps build no metadata for the compressed layers); use "
                       "--layers 1, its default")

DSPARK_V1_REFUSAL = ("--spec dspark needs --runner v2: vLLM 0.33.0 runs DSpark only on Model Runner V2 "
                     "(config/vllm.py:3110-3113 lists 'dspark speculative decoding' as unsupported by V1, and "
                     "_validate_v1_model_runner, :3332-3337, raises 'Model Runner V1 does not support: dspark "
                     "speculative decoding'); use --runner v2")


def make_plan(settings: Settings, options: EngineOptions) -> CheckPlan:
    """The plan of a vLLM check: the shared options resolved with vLLM's defaults, its
    own into ``options.Knobs``. The default invariants are vLLM's (``invariants``): the
    bundled engine's region decisions, selecting vLLM's functions."""
    if os.environ.get(RETIRED_ENV) is not None:
        raise CapturelintError(f"{RETIRED_ENV} is no longer read; use --vllm-runner-impl real or reproduced (settings: "
                               f"vllm-runner-impl), and unset {RETIRED_ENV}")
    knobs = resolve_knobs(Knobs, settings, options)
    spec = knobs.spec

    def spec_runners(runners: tuple[Runner, ...]) -> None:
        if spec is SpecMethod.DSPARK and Runner.V1 in runners:
            raise CapturelintError(DSPARK_V1_REFUSAL)

    def refused(mode: CUDAGraphMode) -> str | None:
        if mode in VLLM_MODES:
            return None
        return (f"--engine vllm checks the PIECEWISE and FULL graphs; mode {mode} is a dispatch policy over them, use "
                "--mode PIECEWISE,FULL")

    if spec is not None:
        for name, flag in (("capture_sizes", "--capture-sizes"), ("batch_sizes", "--batch-sizes"),
                           ("vllm_runner_impl", "--vllm-runner-impl")):
            if name in options.given:
                what = "picks the step loop of the serving workload" if name == "vllm_runner_impl" else \
                    "sets the serving workload"
                raise CapturelintError(f"{flag} {what}; --spec runs its own loop of verify and draft steps over a "
                                       f"fixed batch, drop {flag}")
    for flag, sizes, most in (("--capture-sizes", knobs.capture_sizes, MAX_TOKENS),
                              ("--batch-sizes", knobs.batch_sizes, MAX_REQS)):
        if sizes is not None and any(n > most for n in sizes):
            raise CapturelintError(f"{flag} {','.join(map(str, sizes))}: each must be at most {most} (the runner's "
                                   f"{'max_num_batched_tokens' if most == MAX_TOKENS else 'max_num_seqs'})")
    if knobs.capture_sizes is not None:
        knobs = dataclasses.replace(knobs, capture_sizes=tuple(sorted(set(knobs.capture_sizes))))
    # DSpark runs only on V2 (config/vllm.py:3110-3113): its default runner
    default_runners = (Runner.V2,) if spec is SpecMethod.DSPARK else tuple(Runner)
    plan = resolve_plan(settings, options, NAME, default_runners=lambda: default_runners, default_modes=VLLM_MODES,
                        invariants=default_invariants, mode_refused=refused, check_runners=spec_runners, knobs=knobs)
    if spec is not None and plan.layers not in (None, 1):  # from the command line or the settings
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

    from capturelint.objects import named_tensors

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

    knobs: Knobs = plan.knobs
    workload = {name: value for name, value in (("capture_sizes", knobs.capture_sizes),
                                                 ("batch_sizes", knobs.batch_sizes)) if value is not None}
    # --spec: sliding-window target layers (SPEC_LAYERS_REFUSAL)
    layers = plan.layers or (1 if knobs.spec else DEFAULT_LAYERS)
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


def real_runner(plan: CheckPlan, runner: Runner, mode: CUDAGraphMode) -> bool:
    """Whether vLLM's own model runner drives this configuration (``runners.real``:
    PIECEWISE graphs, V1 and V2) rather than the reproduction of its capture conditions
    (``runners.reproduced``: FULL graphs, and every one with ``--vllm-runner-impl
    reproduced``); the speculative-decoding loops are ``runners.spec``'s."""
    from capturelint.adapters.vllm.runners import real

    knobs: Knobs = plan.knobs
    return not knobs.spec and knobs.vllm_runner_impl is RunnerImpl.REAL and real.supports(runner, mode)


def step_loop(plan: CheckPlan, runner: Runner, mode: CUDAGraphMode) -> Any:
    """The step loop of one configuration: the speculative-decoding loop of ``--spec``,
    vLLM's own model runner (``runners.real``) where it drives the configuration, else
    the model runner's capture conditions reproduced (``runners.reproduced``)."""
    if plan.knobs.spec:
        from capturelint.adapters.vllm.runners.spec import LOOPS

        return LOOPS[plan.knobs.spec]
    if real_runner(plan, runner, mode):
        from capturelint.adapters.vllm.runners.real import VllmRunnerLoop

        return VllmRunnerLoop
    from capturelint.adapters.vllm.runners.reproduced import ReproducedLoop

    return ReproducedLoop


def configuration(plan: CheckPlan, runner: Runner, mode: CUDAGraphMode) -> Configuration:
    """Build the tiny model for one runner and mode (inside ``cpu_shim``, and for vLLM's
    own runner inside ``runners.real.runner_context``)."""
    from capturelint.adapters.vllm.model import compare, region_of
    from capturelint.harness import TwinResult
    from capturelint.pipeline import Configuration

    spec = _spec(plan, runner, mode)
    loop = step_loop(plan, runner, mode)
    engine = loop(spec)

    def twin(output: Any) -> TwinResult:
        # The numbers a report prints are the program's: an untraced graph run of the
        # configuration against its eager twin, not the traced run, whose replays reuse
        # their shadow's break calls (``protocol.run_or_reuse``) and so may differ from
        # what the program computes on its own (docs/vllm.md, "The numbers").
        agreement, error = compare(loop(spec).generate(), loop(spec, graphs=False).generate())
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
    from capturelint.pipeline import check_configuration

    real = real_runner(plan, runner, mode)
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


__all__ = ["NAME", "VLLM_MODES", "check_one", "configuration", "default_invariants", "forward_context_probe", "load",
           "make_plan", "missing_op", "real_runner", "record_regions", "run_check", "step_loop", "suggest_slots"]
