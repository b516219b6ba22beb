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

- ``--model ARCH|all`` (``options``, ``archs``): the architecture checked. DeepSeek V4 (the
  default) is the tiny model of ``model``; a generic-attention architecture
  (``Qwen3ForCausalLM``, ``LlamaForCausalLM``) is vLLM's own model class run whole on
  vLLM's own runners in both modes (``generic``; ``--layers`` default 2; ``--spec``,
  ``--eager-region narrow|wide`` and ``--vllm-runner-impl reproduced`` are DeepSeek V4's
  and refused). ``all``: every supported architecture, its configurations labelled
  ``ARCH:runner/mode`` (so ``--shard`` deals them and ``merge`` joins them); the names
  of vLLM's list not checked yet are said before the check runs (``archs.table`` makes
  the table of the report).
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
from capturelint.adapters.vllm import archs, families
from capturelint.adapters.vllm.invariants import default_invariants
from capturelint.adapters.vllm.options import (
    DEFAULT_BATCH_SIZES,
    DEFAULT_CAPTURE_SIZES,
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
    model = knobs.model
    if model != archs.DEFAULT:
        # DeepSeek V4's own choices, from the command line or the settings: refused, never ignored
        given = {"--spec": (knobs.spec is not None, "checks DeepSeek V4's drafts"),
                 "--vllm-runner-impl": (knobs.vllm_runner_impl is not RunnerImpl.REAL, "picks DeepSeek V4's step loop"),
                 "--eager-region": (str(settings_region(settings, options)) != "per-runner",
                                    "forces DeepSeek V4's attention regions")}
        for flag, (is_set, why) in given.items():
            if is_set:
                raise CapturelintError(f"{flag} {why}; --model {model} runs vLLM's own regions on vLLM's own runners: "
                                       f"drop {flag} (command line or settings) or use --model {archs.DEFAULT}")

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
                        invariants=lambda: families.default_invariants(model), mode_refused=refused,
                        check_runners=spec_runners, knobs=knobs)
    if model == archs.ALL:
        # every supported architecture's configurations, labelled ARCH:runner (archs.split_label)
        plan = dataclasses.replace(plan, configured=tuple(
            (f"{arch}:{runner}", str(mode)) for arch in archs.SUPPORTED for runner in plan.runners
            for mode in plan.modes), warnings=plan.warnings + (
            f"--model all checks {', '.join(archs.SUPPORTED)}; {len(archs.NOT_YET)} names of vLLM's "
            "DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES are not supported yet (docs/vllm-architectures.md says why)",))
    if spec is not None and plan.layers not in (None, 1):  # from the command line or the settings
        raise CapturelintError(SPEC_LAYERS_REFUSAL.format(layers=plan.layers))
    if spec is None:
        refuse_unreplayed(knobs, plan.steps or DEFAULT_STEPS)
    return plan


def subject(plan: CheckPlan) -> dict[str, Any]:
    """What a vLLM check checked: ``{"engine": "vllm"}``, with ``"model"`` when it is not
    the default architecture (``Qwen3ForCausalLM``, ``all``)."""
    model = plan.knobs.model
    return {"engine": NAME} if model == archs.DEFAULT else {"engine": NAME, "model": model}


def table(report: dict[str, Any]) -> tuple[tuple[str, ...], list[tuple[str, ...]]] | None:
    """Under ``--model all`` (merged shards too), the table of ``docs/vllm-architectures.md``:
    one row per architecture, runner and mode, then the names of vLLM's list not checked."""
    if (report.get("subject") or {}).get("model") != archs.ALL:
        return None
    return ("architecture", "family", "runner", "mode", "breakable graphs"), list(archs.table(report))


def refuse_unreplayed(knobs: Knobs, steps: int) -> None:
    """Refuse, before the run, a serving workload whose every step is larger than every
    capture size: each request schedules at least one token, so such a step runs eagerly
    (vLLM dispatches a step to the smallest capture size >= its token count, eager above
    the largest) and nothing would be replayed, so nothing compared."""
    captures = knobs.capture_sizes or DEFAULT_CAPTURE_SIZES
    sizes = knobs.batch_sizes or DEFAULT_BATCH_SIZES
    batches = [sizes[i % len(sizes)] for i in range(steps)]
    if min(batches) <= max(captures):
        return
    wider = ",".join(map(str, sorted({*captures, max(batches)})))
    raise CapturelintError(
        f"--batch-sizes {','.join(map(str, sizes))} over {steps} step(s) runs at least {min(batches)} requests (a token "
        f"each) per step, more than the largest capture size, {max(captures)} (--capture-sizes "
        f"{','.join(map(str, captures))}), so every step runs eagerly and no CUDA graph is replayed; add a capture size "
        f"as large as a batch (e.g. --capture-sizes {wider}) or run smaller batches (e.g. --batch-sizes "
        f"{','.join(str(n) for n in range(1, max(captures) + 1))})"
    )


def settings_region(settings: Settings, options: EngineOptions) -> Any:
    """The eager region asked for: the command line's, else the settings', else ``per-runner``."""
    if options.eager_region is not None:
        return options.eager_region
    return getattr(settings, "eager_region", None) or "per-runner"


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


def _arch(runner: Any, plan: CheckPlan) -> tuple[str, Runner]:
    """The architecture and runner of a configuration: ``ARCH:v1`` under ``--model all``
    (``archs.split_label``), else the plan's ``--model``."""
    if isinstance(runner, Runner):
        return plan.knobs.model, runner
    arch, plain = archs.split_label(str(runner))
    return arch, Runner(plain)


def _spec(plan: CheckPlan, runner: Runner, mode: CUDAGraphMode, arch: str = archs.DEFAULT) -> Any:
    from capturelint.adapters.vllm.workload import RunSpec

    knobs: Knobs = plan.knobs
    workload = {name: value for name, value in (("capture_sizes", knobs.capture_sizes),
                                                 ("batch_sizes", knobs.batch_sizes)) if value is not None}
    # --spec: sliding-window target layers (SPEC_LAYERS_REFUSAL)
    family = families.of(arch)
    default_layers = family.default_layers if family is not None else (1 if knobs.spec else DEFAULT_LAYERS)
    layers = plan.layers or default_layers
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


def real_runner(plan: CheckPlan, runner: Any, mode: CUDAGraphMode) -> bool:
    """Whether vLLM's own model runner drives this configuration (``runners.real``:
    PIECEWISE graphs, V1 and V2) rather than the reproduction of its capture conditions
    (``runners.reproduced``: FULL graphs, and every one with ``--vllm-runner-impl
    reproduced``); the speculative-decoding loops are ``runners.spec``'s."""
    from capturelint.adapters.vllm.runners import real

    knobs: Knobs = plan.knobs
    arch, runner = _arch(runner, plan)
    if families.of(arch) is not None:
        return True  # vLLM's own runners, PIECEWISE and FULL (families)
    return not knobs.spec and knobs.vllm_runner_impl is RunnerImpl.REAL and real.supports(runner, mode)


def step_loop(plan: CheckPlan, runner: Runner, mode: CUDAGraphMode) -> Any:
    """The step loop of one configuration: the speculative-decoding loop of ``--spec``,
    vLLM's own model runner (``runners.real``) where it drives the configuration, else
    the model runner's capture conditions reproduced (``runners.reproduced``)."""
    arch, _ = _arch(runner, plan)
    family = families.of(arch)
    if family is not None:
        return family.load().loop_for(arch)
    if plan.knobs.spec:
        from capturelint.adapters.vllm.runners.spec import LOOPS

        return LOOPS[plan.knobs.spec]
    if real_runner(plan, runner, mode):
        from capturelint.adapters.vllm.runners.real import VllmRunnerLoop

        return VllmRunnerLoop
    from capturelint.adapters.vllm.runners.reproduced import ReproducedLoop

    return ReproducedLoop


def configuration(plan: CheckPlan, runner: Any, mode: Any) -> Configuration:
    """Build the tiny model for one runner and mode (inside ``cpu_shim``, and for vLLM's
    own runner inside ``runners.real.runner_context``). Under ``--model all`` the
    configuration is checked as its plain runner (``v1``: the invariants of a runner
    apply) and labelled ``ARCH:runner`` after (``check_one``)."""
    from capturelint.adapters.vllm.break_probe import BreakProbe, divergence
    from capturelint.adapters.vllm.model import compare, region_of
    from capturelint.analyzer import EnteredAt
    from capturelint.findings import DIVERGENCE_TOLERANCE
    from capturelint.harness import TwinResult
    from capturelint.pipeline import Configuration

    arch, plain = _arch(runner, plan)
    mode = CUDAGraphMode(str(mode))
    spec = _spec(plan, plain, mode, arch)
    loop = step_loop(plan, runner, mode)
    engine = loop(spec)

    def twin(output: Any) -> TwinResult:
        # The traced run's replays compute what the program computes on its own
        # (``capturelint.shadow_isolation``; docs/vllm.md, "The numbers"), so its output
        # is compared with the eager twin's: no second graph run. The twin's eager-break
        # calls are recorded, and where the outputs differ, an untraced graph run's too,
        # to locate the break where the divergence enters (break_probe; CL901).
        probe = BreakProbe()
        eager = loop(spec, graphs=False)
        with probe.recording(_models(eager)):
            eager_out, eager_calls = probe.run(eager.generate)
        agreement, error = compare(output, eager_out)
        entered = None
        if agreement < 1.0 or not error <= DIVERGENCE_TOLERANCE:
            graphs = loop(spec)
            with probe.recording(_models(graphs)):
                _, graph_calls = probe.run(graphs.generate)
            found = divergence(graph_calls, eager_calls)
            entered = EnteredAt(found.name, found.frame, found.step, found.real, found.rows) if found else None
        return TwinResult(agreement, error, entered)

    region = "per-runner" if families.of(arch) is not None else region_of(engine.model)
    return Configuration(RunLabel(str(plain), str(mode)), engine.generate, engine.roots(), region,
                         forward_context_probe, layer_scope_group, twin, require_replays=True,
                         eager_region_option=str(plan.eager_region),
                         invariants=families.family_invariants(arch, plan.invariants), capture_only=engine.capture)


def _models(loop: Any) -> list[Any]:
    """The model of a step loop, for the break probe (a loop without one: none)."""
    model = getattr(loop, "model", None)
    return [model] if model is not None else []


def _relabel(report: ConfigReport, runner: str) -> ConfigReport:
    """``report`` with its runner label ``runner`` (``ARCH:v1``), its findings too."""
    report.runner = runner
    report.findings = [dataclasses.replace(f, runner=runner) for f in report.findings]
    report.waived = [dataclasses.replace(w, finding=dataclasses.replace(w.finding, runner=runner)) for w in report.waived]
    if report.numerical is not None:
        report.numerical = dataclasses.replace(report.numerical, runner=runner)
    return report


def check_one(plan: CheckPlan, runner: Any, mode: Any, shadow: bool = True, static: bool = False) -> ConfigReport:
    """Build and check one configuration under ``cpu_shim``; a ``torch.ops`` kernel vLLM
    calls without a reference here (while building, running or in the eager twin) is the
    one-line error that names it."""
    from capturelint.adapters.vllm.install import cpu_shim
    from capturelint.adapters.vllm.runners.real import runner_context
    from capturelint.pipeline import check_configuration

    arch, plain = _arch(runner, plan)
    mode = CUDAGraphMode(str(mode))  # a --model all configuration's mode is its label
    real = real_runner(plan, runner, mode)
    with contextlib.ExitStack() as stack:
        stack.enter_context(cpu_shim())
        if real:
            stack.enter_context(runner_context(plain))
        family = families.of(arch)
        if family is not None:
            stack.enter_context(family.load().backend())
        try:
            report = check_configuration(configuration(plan, runner, mode), plan.codes, shadow=shadow, static=static)
        except (CapturelintError, AttributeError) as e:
            error = missing_op(e)
            if error is None:
                raise
            raise error from None
    return report if isinstance(runner, Runner) else _relabel(report, str(runner))


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

    if plan.knobs.model == archs.ALL:
        raise CapturelintError(f"suggest finds the eager region of one architecture; use --model ARCH (one of "
                               f"{', '.join(archs.SUPPORTED)}), not --model all")
    require_vllm()  # for the CPU target, before anything of vLLM is imported
    from vllm.compilation.breakable_cudagraph import eager_break_during_capture

    decorator = BreakDecorator(eager_break_during_capture, "eager_break_during_capture",
                               "from vllm.compilation.breakable_cudagraph import eager_break_during_capture")
    return slots(plan, check_one, decorator)


__all__ = ["NAME", "VLLM_MODES", "check_one", "configuration", "default_invariants", "forward_context_probe", "load",
           "make_plan", "missing_op", "real_runner", "record_regions", "run_check", "step_loop", "subject",
           "suggest_slots", "table"]
