"""Options shared by the commands that run an engine, and output helpers.

Nothing here imports torch or the engine at import time: the commands' ``-h`` and
argument errors answer at once, and the engine loads only when a command runs it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable

import click

from capturelint.adapters import registry
from capturelint.api import ProgressReporter, plan_for, say, warn  # noqa: F401  (the commands' output)
from capturelint.common_options import BY_NAME, ENGINE, GROUPS, REPORT, SPEED, WHAT  # noqa: F401
from capturelint.options import EngineOptions, Kind, OptionSpec, Surface, parse_option, spelled  # noqa: F401
from capturelint.output import TERMINAL, quiet_from_env, stderr_console, stdout_console  # noqa: F401  (the commands' consoles)
from capturelint.settings import Settings

if TYPE_CHECKING:
    from capturelint.adapters.registry import CheckPlan

OTHER = "Other options"  # the help section of a command's own options, --debug and --help


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


# ----------------------------------------------------------- options from specs


class GroupedCommand(click.Command):
    """A command whose ``--help`` lists its options by group, as ruff's does: what to
    check, what to report, speed, each engine family's own options, then the rest."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                sections.setdefault(getattr(param, "group", None) or OTHER, []).append(record)
        order = [*GROUPS, *sorted(g for g in sections if g not in GROUPS and g != OTHER), OTHER]
        for group in order:
            if group in sections:
                with formatter.section(group):
                    formatter.write_dl(sections[group])


class SpecOption(click.Option):
    """A click option built from an ``OptionSpec`` (``spec_option``), listed under its group."""

    def __init__(self, *args: Any, group: str | None = None, **kw: Any):
        super().__init__(*args, **kw)
        self.group = group


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


def _parsed(spec: OptionSpec) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """The click callback of ``spec``: its value parsed by the one builder
    (``capturelint.options.parse_option``), ``None`` when not given."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None or value == ():
            return None
        if spec.kind is Kind.SWITCH:
            return value
        if spec.kind is Kind.LIST:
            value = split_csv(ctx, param, value)
        return parse_option(spec, value, Surface.COMMAND_LINE)

    return callback


def spec_option(spec: OptionSpec, help: str | None = None, group: str | None = None,
                apply: Callable[[click.Context, Any], None] | None = None) -> Callable[[Callable], Callable]:
    """The click option of ``spec``: its flag (and short flag), its value parsed by the
    one builder, listed in ``--help`` under its group with its default; ``apply``: the
    command does not receive the value, ``apply(ctx, value)`` is called with it (``None``
    when not given) as the command line is read."""
    decls = [spec.flag, *([spec.short] if spec.short else []), spec.name]
    parsed = _parsed(spec)
    callback = parsed
    if apply is not None:
        def callback(ctx: click.Context, param: click.Parameter, value: Any) -> None:
            apply(ctx, parsed(ctx, param, value))

    kw: dict[str, Any] = dict(cls=SpecOption, group=group or spec.group, help=help or spec.help_text,
                              callback=callback, default=None, expose_value=apply is None)
    if spec.kind is Kind.SWITCH:
        kw.update(is_flag=True, flag_value=spec.switched)
    else:
        kw.update(metavar=spec.metavar, multiple=spec.kind is Kind.LIST)
        if spec.name == "engine":
            kw["type"] = _Engines()
        elif spec.choices:
            kw["type"] = click.Choice(spec.choices, case_sensitive=False)
        elif spec.number is not None:
            kw["type"] = spec.number
    return click.option(*decls, **kw)


def spec_options(*specs: OptionSpec) -> Callable[[Callable], Callable]:
    """The click options of ``specs``, in that order."""

    def decorate(fn: Callable) -> Callable:
        for spec in reversed(specs):
            fn = spec_option(spec)(fn)
        return fn

    return decorate


def _set_color(ctx: click.Context, value: str | None) -> None:
    TERMINAL.color, TERMINAL.lines = value or "auto", True
    ctx.call_on_close(_reset_terminal)  # the next command (or the API) in this process starts afresh


def _set_quiet(ctx: click.Context, value: bool | None) -> None:
    TERMINAL.quiet = bool(value) or quiet_from_env()


def _reset_terminal() -> None:
    TERMINAL.color, TERMINAL.quiet, TERMINAL.lines = "auto", False, False


def terminal_options(fn: Callable) -> Callable:
    """``--quiet`` and ``--color`` (``capturelint.common_options.TERMINAL``): set
    ``capturelint.output.TERMINAL`` for the command while it runs, which its progress
    and consoles read."""
    fn = spec_option(BY_NAME["color"], apply=_set_color)(fn)
    return spec_option(BY_NAME["quiet"], apply=_set_quiet)(fn)


def shared_options(*names: str) -> Callable[[Callable], Callable]:
    """The click options of the shared specs named (``capturelint.common_options``)."""
    return spec_options(*(BY_NAME[n] for n in names))


def engine_specs() -> tuple[OptionSpec, ...]:
    """``--engine``, the shared engine options with each family's defaults in their help,
    and every engine family's own options (``capturelint.adapters.registry``)."""
    out = []
    for spec in ENGINE:
        said = registry.default_texts(spec.name)
        out.append(spec if said is None else dataclasses.replace(spec, default_text=said))
    return (*out, *registry.family_specs())


def engine_options(fn: Callable) -> Callable:
    """Which engine and which of its configurations to run: ``--engine``, the shared
    engine options, every engine family's own, ``--jobs`` and ``--config``."""
    return spec_options(*engine_specs(), BY_NAME["jobs"], BY_NAME["config"])(fn)


def resolve_plan(settings: Settings, kw: dict[str, Any], also_given: tuple[str, ...] = ()) -> CheckPlan:
    """The plan of the command's options (``kw``: its parameters) over ``settings``,
    from the adapter registry (``capturelint.api.plan_for``: its warnings are said)."""
    return plan_for(settings, command_options(kw, also_given=also_given))


def command_options(kw: dict[str, Any], also_given: tuple[str, ...] = ()) -> EngineOptions:
    """The ``EngineOptions`` of the command's parsed options (``kw``: its parameters);
    ``also_given``: engine options the command set itself (``diff --against-*``)."""
    family = {s.name for s in registry.family_specs()}
    given = given_engine_options() + tuple(n for n in also_given if kw.get(n) is not None)
    return EngineOptions(
        engine=kw.get("engine"),
        target=kw.get("target"),
        runners=kw.get("runner") or (),
        modes=kw.get("mode") or (),
        eager_region=kw.get("eager_region"),
        layers=kw.get("layers"),
        steps=kw.get("steps"),
        seed=kw.get("seed"),
        select=kw.get("select") or (),
        ignore=kw.get("ignore") or (),
        invariants_file=kw.get("invariants"),
        jobs=kw.get("jobs"),
        reuse=kw.get("reuse") is not False,
        family=tuple((name, value) for name, value in kw.items() if name in family and value is not None),
        given=tuple(dict.fromkeys(given)),
    )


def given_engine_options() -> tuple[str, ...]:
    """The engine options (``registry.engine_option_names``) given on the command line of
    the command running now, in its order; defaults are not "given"."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return ()
    engine_options = set(registry.engine_option_names())
    given = []
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name) if param.name else None
        if param.name in engine_options and source not in (None, click.core.ParameterSource.DEFAULT):
            given.append(param.name)
    return tuple(given)


def given_flags(kw: dict[str, Any], names: tuple[str, ...]) -> list[str]:
    """The command line of the options ``names`` given in ``kw``, as typed (hints)."""
    specs = {s.name: s for s in registry.option_specs()}
    args: list[str] = []
    for name in names:
        value, spec = kw.get(name), specs[name]
        if value is None or value == () or (spec.kind is Kind.SWITCH and value is spec.default):
            continue
        args += [spec.flag] if spec.kind is Kind.SWITCH else [spec.flag, spec.spelled(value)]
    return args


def settings_for(kw: dict[str, Any]) -> Settings:
    """``[tool.capturelint]`` of the command's ``--config`` (or the nearest), read with
    every engine family's keys."""
    return registry.load_settings(kw.get("config"))
