"""Options shared by the commands that run an engine, and output helpers.

Nothing here imports torch or the engine at import time: the commands' ``-h`` and
argument errors answer at once, and the engine loads only when a command runs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import click
from capturelint.adapters import registry
from capturelint.api import ProgressReporter, plan_for, say, warn  # noqa: F401  (the commands' output)
from capturelint.options import (
    CAPTURE_MODES,
    ENGINE_OPTIONS,
    BreakOutputs,
    CUDAGraphMode,
    EagerRegion,
    EngineOptions,
    Runner,
    parse_modes,
    parse_region,
    parse_runners,
    parse_sizes,
    runners_text,
)
from capturelint.output import stderr_console, stdout_console  # noqa: F401  (the commands' consoles)
from capturelint.settings import Settings, load_settings

if TYPE_CHECKING:
    from capturelint.adapters.registry import CheckPlan


def split_csv(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    """Repeatable, comma-separated values; a value that names nothing (``--mode ""``)
    is an error, not "all"."""
    out: list[str] = []
    for v in value:
        parts = [p.strip() for p in v.split(",") if p.strip()]
        if not parts:
            raise click.BadParameter(f"{v!r} names nothing; give a value or leave the option out", ctx=ctx, param=param)
        out.extend(parts)
    return tuple(out)


# The engine options' values are parsed here, once (capturelint.options): the commands
# and everything downstream hold Runner, CUDAGraphMode, EagerRegion and BreakOutputs.


def parsed_runners(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[Runner, ...] | None:
    """``--runner v1|v2|all``: the runners (``all``: every one)."""
    return None if value is None else parse_runners(value)


def parsed_modes(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[CUDAGraphMode, ...]:
    """``--mode``, repeatable and comma-separated: the modes."""
    return parse_modes(split_csv(ctx, param, value))


def _sizes(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    """``--capture-sizes`` / ``--batch-sizes``: comma-separated counts."""
    return None if value is None else parse_sizes(max(param.opts, key=len), value)


def parsed_region(ctx: click.Context, param: click.Parameter, value: str | None) -> EagerRegion | None:
    return None if value is None else parse_region(value)


def _break_outputs(ctx: click.Context, param: click.Parameter, value: str | None) -> BreakOutputs | None:
    return None if value is None else BreakOutputs(value)  # one of the click choices


RUNNER_METAVAR = "|".join([*map(str, Runner), "all"])
REGION_METAVAR = "|".join(map(str, EagerRegion))


def spelled(value: Any) -> str:
    """A parsed option value as the command line spells it (hints, titles): ``all`` for
    every runner, modes comma-separated."""
    if isinstance(value, tuple) and value and all(isinstance(v, Runner) for v in value):
        return runners_text(value)
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


class _Engines(click.Choice):
    """``--engine``'s choices: the adapter registry's engine names, read when asked (an
    engine registered after the commands were built is one too)."""

    def __init__(self) -> None:
        super().__init__(())

    @property  # type: ignore[override]
    def choices(self) -> tuple[str, ...]:
        return registry.names()

    @choices.setter
    def choices(self, value: Any) -> None:
        pass


def engine_options(fn: Callable) -> Callable:
    """``--engine --jobs --no-reuse --runner --mode --eager-region --fresh-metadata
    --layers --steps --seed --kernels --break-outputs --capture-sizes --batch-sizes
    --platform --spec --config``: which engine
    and which of its configurations to run."""
    opts = [
        click.option("--engine", type=_Engines(),
                     help="Engine to check: the bundled DeepSeek V4 model of vLLM (default), or vLLM's own DeepSeek V4 "
                          "attention as Python imports it (vLLM 0.33.0; settings: engine)."),
        click.option("--jobs", "-j", type=int, metavar="N",
                     help="Configurations checked at once, in worker processes (default: the usable cores; settings: "
                          "jobs). The report is the same for every N."),
        click.option("--no-reuse", "no_reuse", is_flag=True,
                     help="Share no work between configurations (each runs its own eager twin); the report is the same."),
        click.option("--runner", metavar=RUNNER_METAVAR, callback=parsed_runners,
                     help="Model runner; default: the platform's default runner (settings: runners)."),
        click.option("--mode", "modes", multiple=True, callback=parsed_modes, metavar="MODE",
                     help=f"CUDA-graph mode, repeatable or comma-separated: {', '.join(map(str, CAPTURE_MODES))}; "
                          "default: all of them."),
        click.option("--eager-region", metavar=REGION_METAVAR, callback=parsed_region,
                     help="Eager region of the attention; default per-runner."),
        click.option("--fresh-metadata", is_flag=True, help="V1 metadata builders allocate new tensors every step."),
        click.option("--layers", type=int, metavar="N", help="Decoder layers (default 4)."),
        click.option("--steps", type=int, metavar="N", help="Engine steps of the workload, one forward each (default 24)."),
        click.option("--seed", type=int, metavar="N", help="Seed of weights and workload (default 0)."),
        click.option("--kernels", type=click.Choice(["torch", "triton"]), help="Kernel implementations (default torch)."),
        click.option("--break-outputs", type=click.Choice([str(b) for b in BreakOutputs]), callback=_break_outputs,
                     help="What the capture runtime does with eager-break return values on replay: copy them into "
                          "static buffers (default) or discard them, as vLLM 0.33.0 does (settings: break-outputs)."),
        click.option("--capture-sizes", metavar="N,N,...", callback=_sizes,
                     help="--engine vllm: the CUDA-graph capture sizes (vLLM's cudagraph_capture_sizes); each step "
                          "replays the smallest one >= its token count, padded (default 2,4)."),
        click.option("--batch-sizes", metavar="N,N,...", callback=_sizes,
                     help="--engine vllm: the requests running in each step, cycled over --steps; a growing batch "
                          "prefills the joining requests (a mixed prefill-decode step), a shrinking one lets the oldest "
                          "leave (default 1,2,3,3,2,1)."),
        click.option("--platform", type=click.Choice(["cuda", "rocm", "cpu"]), default="cuda", show_default=True,
                     help="Platform whose default runner applies."),
        click.option("--spec", type=click.Choice(["mtp", "dspark"]),
                     help="Speculative decoding (--engine vllm): also check the draft model's graphs and the verify "
                          "step, under the runners that support the method (default: none)."),
        click.option("--config", "config_path", type=click.Path(dir_okay=False), metavar="PYPROJECT",
                     help="Read [tool.capturelint] from this file instead of the nearest pyproject.toml."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def resolve_plan(settings: Settings, kw: dict[str, Any], select: tuple[str, ...] = (), ignore: tuple[str, ...] = (),
                 target: str | None = None) -> CheckPlan:
    """The plan of the command's options (``kw``: its parameters) over ``settings``,
    from the adapter registry (``capturelint.api.plan_for``: its warnings are said)."""
    return plan_for(settings, command_options(kw, select, ignore, target))


def command_options(kw: dict[str, Any], select: tuple[str, ...] = (), ignore: tuple[str, ...] = (),
                    target: str | None = None) -> EngineOptions:
    """The ``EngineOptions`` of the command's parsed options (``kw``: its parameters)."""
    return EngineOptions(
        engine=kw.get("engine"),
        target=target,
        runners=kw.get("runner") or (),
        modes=kw.get("modes") or (),
        eager_region=kw.get("eager_region"),
        fresh_metadata=kw.get("fresh_metadata", False),
        layers=kw.get("layers"),
        steps=kw.get("steps"),
        seed=kw.get("seed"),
        kernels=kw.get("kernels"),
        break_outputs=kw.get("break_outputs"),
        platform=kw.get("platform") or "cuda",
        select=select,
        ignore=ignore,
        invariants_file=kw.get("invariants_file"),
        jobs=kw.get("jobs"),
        reuse=not kw.get("no_reuse", False),
        spec=kw.get("spec"),
        given=given_engine_options(),
        capture_sizes=kw.get("capture_sizes") or (),
        batch_sizes=kw.get("batch_sizes") or (),
    )


def given_engine_options() -> tuple[str, ...]:
    """The engine options (``ENGINE_OPTIONS``) given on the command line of the command
    running now, in its order; defaults are not "given"."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return ()
    given = []
    for param in ctx.command.params:
        flag = max(param.opts, key=len)
        source = ctx.get_parameter_source(param.name) if param.name else None
        if flag in ENGINE_OPTIONS and source not in (None, click.core.ParameterSource.DEFAULT):
            given.append(flag)
    return tuple(given)


def settings_for(kw: dict[str, Any]) -> Settings:
    return load_settings(kw.get("config_path"))
