"""``--engine vllm``: the plan of a vLLM check, its configurations, and the forward-context
probe of ``vllm.forward_context``.

Options, resolved like the bundled engine's (command line over settings over defaults):

- ``--runner v1|v2|all`` (default ``all``: a region change must hold under both);
- ``--mode PIECEWISE,FULL`` (default both; FULL_DECODE_ONLY and FULL_AND_PIECEWISE are
  dispatch policies over these two graphs, the same graphs here, and are refused);
- ``--eager-region``: ``per-runner`` (default) keeps vLLM's own choice
  (attention.py:323-328), ``narrow`` / ``wide`` force ``_prepare_and_attn`` /
  ``_prepare_and_attn_eager`` on every layer;
- ``--layers`` (default 2), ``--steps`` (decode steps, default 6), ``--seed``.

``--fresh-metadata``, ``--kernels triton`` and ``--break-outputs`` describe the bundled
engine and are refused (vLLM 0.33.0's ``add_eager`` discards break outputs).
"""

from __future__ import annotations

import functools
import re
from typing import Any, Callable, Sequence

from capturelint.adapters.bundled import CheckPlan, check_counts, layer_scope_group, resolve_invariants
from capturelint.adapters.vllm_invariants import default_invariants as vllm_defaults
from capturelint.analyzer import RunLabel
from capturelint.errors import CapturelintError
from capturelint.harness import TwinResult
from capturelint.objects import named_tensors
from capturelint.pipeline import Configuration, check_configuration
from capturelint.records import ContextSnapshot, ContextSummary
from capturelint.report import ConfigReport, Report
from capturelint.rules import select_codes
from capturelint.runtime.forward_context import CUDAGraphMode
from capturelint.settings import Settings, merge

VLLM_MODES = ("PIECEWISE", "FULL")
DEFAULT_LAYERS = 2
DEFAULT_STEPS = 6


def vllm_plan(settings: Settings, runner: str | None = None, modes: Sequence[str] = (), eager_region: str | None = None,
              fresh_metadata: bool = False, layers: int | None = None, steps: int | None = None, seed: int | None = None,
              kernels: str | None = None, break_outputs: str | None = None, platform: str = "cuda",
              select: Sequence[str] = (), ignore: Sequence[str] = (), invariants_file: str | None = None,
              default_invariants: bool = True) -> CheckPlan:
    """The plan of a vLLM check; options that describe the bundled engine are refused.
    The default invariants are vLLM's (``vllm_invariants``): the bundled engine's region
    decisions, selecting vLLM's functions."""
    if platform != "cuda":
        raise CapturelintError(f"--platform {platform} picks the bundled engine's default runner; --engine vllm checks "
                               "the CUDA path of vLLM's DeepSeek V4 attention, drop --platform")
    if fresh_metadata:
        raise CapturelintError("--fresh-metadata changes the bundled engine's metadata builders; it does not apply to "
                               "--engine vllm, drop it")
    if kernels not in (None, "torch"):
        raise CapturelintError("--kernels selects the bundled engine's kernels; --engine vllm runs vLLM's kernels' CPU "
                               "references, drop --kernels")
    if break_outputs is not None:
        raise CapturelintError("--break-outputs sets the bundled runtime's policy; vLLM 0.33.0's add_eager discards "
                               "break outputs, drop --break-outputs")
    if runner is not None:
        runners = ("v1", "v2") if runner.lower() == "all" else (runner.lower(),)
    else:
        runners = tuple(settings.runners or ("v1", "v2"))
    for r in runners:
        if r not in ("v1", "v2"):
            raise CapturelintError(f"unknown runner {r!r}; use v1, v2 or all")
    parsed = []
    for m in tuple(modes) or tuple(settings.modes or ()) or VLLM_MODES:
        try:
            mode = str(CUDAGraphMode.parse(m))
        except ValueError as e:
            raise CapturelintError(str(e)) from None
        if mode not in VLLM_MODES:
            raise CapturelintError(f"--engine vllm checks the PIECEWISE and FULL graphs; mode {mode} is a dispatch "
                                   "policy over them, use --mode PIECEWISE,FULL")
        parsed.append(mode)
    region = merge(eager_region, settings.eager_region, "per-runner")
    if region not in ("narrow", "wide", "per-runner"):
        raise CapturelintError(f"unknown eager region {region!r}; use narrow, wide or per-runner (vLLM's own choice)")
    check_counts(layers, steps, seed)
    return CheckPlan(
        runners=tuple(dict.fromkeys(runners)),
        modes=tuple(dict.fromkeys(parsed)),
        eager_region=region,
        fresh_metadata=False,
        layers=merge(layers, settings.layers, None),
        steps=merge(steps, settings.steps, None),
        seed=merge(seed, settings.seed, 0),
        kernels="torch",
        platform="cuda",
        codes=select_codes(list(select) or list(settings.select or ()), list(ignore) or list(settings.ignore or ())),
        copy_break_outputs=False,
        engine="vllm",
        invariants=resolve_invariants(settings, invariants_file, vllm_defaults() if default_invariants else ()),
    )


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


def _spec(plan: CheckPlan, runner: str, mode: str) -> Any:
    from capturelint.adapters.vllm_runners import RunSpec

    return RunSpec(runner=runner, mode=mode, eager_region=None if plan.eager_region == "per-runner" else plan.eager_region,
                   layers=plan.layers or DEFAULT_LAYERS, steps=plan.steps or DEFAULT_STEPS, seed=plan.seed)


_MISSING_OP = re.compile(r"'_OpNamespace' '(\w+)' object has no attribute '(\w+)'")


def missing_op(e: BaseException) -> CapturelintError | None:
    """The one-line error for a ``torch.ops`` kernel vLLM called that does not exist
    here, found in ``e`` or its causes; None when ``e`` is something else."""
    from capturelint.adapters.vllm_kernels import missing_kernel_error

    while e is not None:
        m = _MISSING_OP.search(str(e)) if isinstance(e, AttributeError) else None
        if m is not None:
            return CapturelintError(f"{missing_kernel_error(f'{m.group(1)}::{m.group(2)}')}; a vLLM other than "
                                    "0.33.0 may need one: add it there")
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return None


def configuration(plan: CheckPlan, runner: str, mode: str) -> Configuration:
    """Build the tiny model for one runner and mode (inside ``cpu_shim``)."""
    from capturelint.adapters.vllm_runners import Runner, compare, region_of

    spec = _spec(plan, runner, mode)
    engine = Runner(spec)

    def twin(output: Any) -> TwinResult:
        agreement, error = compare(output, Runner(spec, graphs=False).generate())
        return TwinResult(agreement, error)

    return Configuration(RunLabel(runner, mode), engine.generate, engine.roots(), region_of(engine.model),
                         forward_context_probe, layer_scope_group, twin, require_replays=True,
                         eager_region_option=plan.eager_region, invariants=plan.invariants,
                         capture_only=engine.capture)


def check_one(plan: CheckPlan, runner: str, mode: str, shadow: bool = True, static: bool = False) -> ConfigReport:
    """Build and check one configuration under ``cpu_shim``; a ``torch.ops`` kernel vLLM
    calls without a reference here (while building, running or in the eager twin) is the
    one-line error that names it."""
    from capturelint.adapters.vllm import cpu_shim

    with cpu_shim():
        try:
            return check_configuration(configuration(plan, runner, mode), plan.codes, shadow=shadow, static=static)
        except (CapturelintError, AttributeError) as e:
            error = missing_op(e)
            if error is None:
                raise
            raise error from None


def run_vllm_check(plan: CheckPlan, progress: Callable[[str], None] | None = None, shadow: bool = True,
                   static: bool = False, keep_captures: bool = False) -> Report:
    """Run the plan's configurations, each under ``cpu_shim`` (``plan.jobs`` at once: vLLM
    is imported before the workers are forked, and each worker builds its own model)."""
    from capturelint.adapters.vllm import require_vllm
    from capturelint.pipeline import Task, run_all

    require_vllm()

    def task(runner: str, mode: str) -> Task:
        return Task(f"vLLM · runner {runner} · {mode}", functools.partial(check_one, plan, runner, mode, shadow, static))

    tasks = [task(r, m) for r, m in plan.configurations]
    return Report(run_all(tasks, plan.jobs, progress, keep_captures), invariants=plan.invariants, static=static)


def suggest_slots(plan: CheckPlan) -> list[Any]:
    """``capturelint suggest --engine vllm``: the plan's configurations, then the same
    modes under the runner the plan leaves out (to cross-check a suggestion). Each check
    builds vLLM's attention afresh, so ``_prepare_and_attn_fn`` binds the functions made
    breaks at that moment; breaks are made with vLLM's own ``eager_break_during_capture``,
    the decorator its runtime knows (whose replays discard return values)."""
    from capturelint.adapters.vllm import require_vllm
    from capturelint.suggest import BreakDecorator, Slot

    require_vllm()  # for the CPU target, before anything of vLLM is imported
    from vllm.compilation.breakable_cudagraph import eager_break_during_capture

    decorator = BreakDecorator(eager_break_during_capture, "eager_break_during_capture",
                               "from vllm.compilation.breakable_cudagraph import eager_break_during_capture")
    slots = []
    for runner in plan.runners + tuple(r for r in ("v1", "v2") if r not in plan.runners):
        for mode in plan.modes:
            check = functools.partial(check_one, plan, runner, mode)
            slots.append(Slot(f"{runner}/{mode}", runner, mode, check, requested=runner in plan.runners,
                              decorator=decorator))
    return slots


__all__ = ["DEFAULT_LAYERS", "DEFAULT_STEPS", "VLLM_MODES", "check_one", "configuration", "forward_context_probe",
           "missing_op", "run_vllm_check", "suggest_slots", "vllm_plan"]
