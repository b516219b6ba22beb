"""The engine families, keyed by engine name, and what the commands ask of them.

Every engine family capturelint checks is one adapter: ``bundled`` (the bundled DeepSeek
V4 engine, the default), ``vllm`` (vLLM's own attention), ``target`` (a user's engine,
``--target SPEC``) and ``script`` (a plain program, ``capturelint run SCRIPT.py``), and
any engine an installed plug-in adds. This is the one module that knows the names: the
commands hand it their options (``capturelint.options.EngineOptions``) and get a plan
back, then hand it the plan to run.

**A family** is a package of the shape of ``capturelint/adapters/vllm/``: its ``plan``
module is the adapter (the members of ``Adapter``), its ``options`` module declares its
options (``OPTIONS``: ``capturelint.options.OptionSpec``\\ s; ``READS``: the names of the
shared engine options it reads, ``capturelint.common_options.ENGINE``; ``DEFAULTS``: what
``--help`` says of its defaults of those; ``Knobs``: the frozen record its options
resolve into, ``capturelint.adapters.common.resolve_knobs``). Modules are imported when
first asked for: the ``options`` modules when a command builds its options (they import
no torch: ``capturelint -h`` and a settings error stay fast), the ``plan`` module when
the engine is planned or run (vLLM's adapter imports vLLM, which takes seconds).

**Options are the families'.** The command line, the settings reader and the Python API
build their options and keys from ``option_specs()``: the shared ones
(``capturelint.common_options``) and each family's, listed in ``check --help`` under
"Engine options (NAME)". An engine option given (on the command line or to the API) that
the chosen engine does not read is refused here with one message, whichever family owns
it; a family's settings are project-wide and only its own adapter reads them.

**Plug-ins** (as pytest finds its plug-ins through the ``pytest11`` entry points): an
installed distribution whose metadata has an entry point in the group
``capturelint.adapters`` (``toy = "toy_engine"``: the engine's name and its package)
adds the engine ``--engine toy``. ``register(name, adapter, options)`` adds one in
process (a test's toy engine). Adding a built-in family is one package and one entry in
``_FAMILIES``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import types
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

from capturelint.adapters.common import CheckPlan
from capturelint.common_options import CHECK, ENGINE, SHARED
from capturelint.errors import CapturelintError
from capturelint.hosting import hosting
from capturelint.limits import default_jobs
from capturelint.options import DEFAULT_ENGINE, EngineOptions, Kind, OptionSpec, Surface, parse_option
from capturelint.settings import Settings, merge, shown
from capturelint.settings import load_settings as read_settings

if TYPE_CHECKING:
    from capturelint.invariants import Invariant
    from capturelint.report import Report
    from capturelint.snapshot import RegionMap
    from capturelint.suggest import Slot

Progress = Callable[[str], None]
ENTRY_POINTS = "capturelint.adapters"  # the entry-point group of plug-in engines


class Adapter(Protocol):
    """What an adapter (a family's ``plan`` module) provides.

    - ``NAME``: its engine's name (``--engine NAME``);
    - ``UNIT``: what its configurations are called in messages (``configuration``, ``target``);
    - ``make_plan(settings, options)``: its options resolved over the settings (the
      helpers of ``capturelint.adapters.common``), validated: a one-line error otherwise;
    - ``load(plan)``: what the plan needs built before it runs (a target's engines);
    - ``run_check(plan, progress, shadow, static, keep_captures)``: its configurations
      checked through the check pipeline (``plan.shard``'s, ``plan.jobs`` at once);
    - ``record_regions(plan, progress)``: the region map of its captures (no shadow);
    - ``suggest_slots(plan)``: its configurations for ``capturelint suggest``, each slot
      carrying the break decorator of its runtime;
    - ``default_invariants()``: the declared invariants it ships;
    - optionally ``subject(plan)``: what its reports say they checked, when more than
      ``{"engine": NAME}`` (vLLM's ``--model``), and ``table(report_json)``: a table
      printed under its rich report (columns, rows), or None.
    """

    NAME: str
    UNIT: str

    def make_plan(self, settings: Settings, options: EngineOptions) -> CheckPlan: ...

    def load(self, plan: CheckPlan) -> CheckPlan: ...

    def run_check(self, plan: CheckPlan, progress: Progress | None = None, shadow: bool = True, static: bool = False,
                  keep_captures: bool = False) -> Report: ...

    def record_regions(self, plan: CheckPlan, progress: Progress | None = None) -> RegionMap: ...

    def suggest_slots(self, plan: CheckPlan) -> list[Slot]: ...

    def default_invariants(self) -> tuple[Invariant, ...]: ...


@dataclasses.dataclass(frozen=True)
class Family:
    """One engine family: its adapter and its options' module, each a module or its
    import path (``None``: it has no options of its own and reads only ``--engine``);
    ``plugin``: the entry point that added it (messages name it)."""

    name: str
    adapter: str | Any
    options: str | Any | None = None
    plugin: str | None = None


@dataclasses.dataclass(frozen=True)
class FamilyOptions:
    """What a family's ``options`` module declares (module docstring)."""

    specs: tuple[OptionSpec, ...] = ()
    reads: frozenset[str] = frozenset({"engine"})
    defaults: Mapping[str, str] = dataclasses.field(default_factory=dict)


TARGET = "target"  # the adapter ``--target SPEC`` chooses; ``--engine`` names the others
SCRIPT = "script"  # the adapter ``capturelint run SCRIPT.py`` chooses
CHOSEN_BY = {TARGET: "--target", SCRIPT: "capturelint run"}

_FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("bundled", "capturelint.adapters.bundled.plan", "capturelint.adapters.bundled.options"),
    Family("vllm", "capturelint.adapters.vllm.plan", "capturelint.adapters.vllm.options"),
    Family(TARGET, "capturelint.adapters.plain.target", None),
    Family(SCRIPT, "capturelint.adapters.plain.script", None),
)}
_BUILT_IN = frozenset(_FAMILIES)
_plugins_read = False
_options: dict[str, FamilyOptions] = {}


def _read_plugins() -> None:
    """Add the engines of installed plug-ins (entry points ``capturelint.adapters``),
    once, in name order; a name taken already is an error naming both."""
    global _plugins_read
    if _plugins_read:
        return
    _plugins_read = True
    for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINTS), key=lambda e: e.name):
        where = f"the plug-in engine {ep.name!r} ({ENTRY_POINTS} entry point {ep.name} = {ep.value!r})"
        if ep.name in _FAMILIES:
            raise CapturelintError(f"{where} takes the name of an engine that is there already; rename its entry "
                                   "point, or uninstall its distribution")
        package = ep.value.strip()
        _FAMILIES[ep.name] = Family(ep.name, f"{package}.plan", f"{package}.options", plugin=where)


def _family(name: str) -> Family:
    _read_plugins()
    family = _FAMILIES.get(name)
    if family is None:
        raise CapturelintError(f"unknown engine {name!r}; use {' or '.join(names())}")
    return family


def _imported(family: Family, what: str) -> Any:
    module = getattr(family, what)
    if not isinstance(module, str):
        return module
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if what == "options" and e.name == module:
            return None  # a plug-in without options of its own
        if family.plugin is None:
            raise
        raise CapturelintError(f"{family.plugin} cannot be imported: {type(e).__name__}: {e}; reinstall its "
                               "distribution, or uninstall it") from None
    except Exception as e:  # noqa: BLE001 - a plug-in's import error, in one line
        if family.plugin is None:
            raise
        raise CapturelintError(f"{family.plugin} cannot be imported: {type(e).__name__}: {e}; reinstall its "
                               "distribution, or uninstall it") from None


def names() -> tuple[str, ...]:
    """The engines ``--engine`` may name, in registry order (the default first, plug-ins last)."""
    _read_plugins()
    return tuple(n for n in _FAMILIES if n not in (TARGET, SCRIPT))


def adapter(name: str) -> Adapter:
    """The adapter of engine ``name``, or a one-line error listing the engines."""
    return _imported(_family(name), "adapter")  # type: ignore[no-any-return]  # a module with Adapter's members


def family_options(name: str) -> FamilyOptions:
    """What engine ``name``'s options module declares; each of its specs knows its owner
    and its help group (``Engine options (NAME)``)."""
    if name not in _options:
        family = _family(name)
        module = _imported(family, "options") if family.options is not None else None
        if family.options is None:
            _options[name] = FamilyOptions(reads=frozenset())  # chosen otherwise (--target, run): reads none
        elif module is None:
            _options[name] = FamilyOptions()
        else:
            group = f"Engine options ({name})"
            specs = tuple(dataclasses.replace(s, owner=name, group=group) for s in getattr(module, "OPTIONS", ()))
            _options[name] = FamilyOptions(specs, frozenset(getattr(module, "READS", ("engine",))),
                                           dict(getattr(module, "DEFAULTS", {})))
    return _options[name]


def family_specs() -> tuple[OptionSpec, ...]:
    """Every engine family's own options, families in registry order; a plug-in's option
    that another family or the shared ones declare already is an error naming it."""
    out: dict[str, OptionSpec] = {}
    flags = {s.flag: s for s in SHARED if s.flag}
    for name in names():
        for spec in family_options(name).specs:
            taken = out.get(spec.name) or (BY_SHARED.get(spec.name)) or flags.get(spec.flag)
            if taken is not None:
                owner = f"--engine {taken.owner}" if taken.owner else "capturelint"
                raise CapturelintError(f"--engine {name} declares the option {spec.flag or spec.name}, which {owner} "
                                       "declares already; rename it in its options module")
            out[spec.name] = spec
            if spec.flag:
                flags[spec.flag] = spec
    return tuple(out.values())


BY_SHARED = {s.name: s for s in SHARED}


def option_specs() -> tuple[OptionSpec, ...]:
    """Every option: the shared ones (``capturelint.common_options``), then the families'."""
    return SHARED + family_specs()


def engine_option_names() -> tuple[str, ...]:
    """The names of the options that configure an engine: the shared engine options and
    every family's own (an engine refuses those it does not read)."""
    return tuple(s.name for s in ENGINE) + tuple(s.name for s in family_specs())


def default_texts(name: str) -> str | None:
    """What ``--help`` says of shared option ``name``'s default, per engine
    (``bundled 4, vllm 3``), from the families' ``DEFAULTS``."""
    said = [(family, family_options(family).defaults.get(name)) for family in names()]
    said = [(f, d) for f, d in said if d is not None]
    if not said:
        return None
    return "; ".join(f"{f}: {d}" for f, d in said)


def load_settings(config: str | None = None, start: Any = None) -> Settings:
    """``[tool.capturelint]`` read with every family's keys (``capturelint.settings``)."""
    return read_settings(config, start, family_specs())


def refusal(name: str, chosen: str, surface: Surface) -> str:
    """The one message for an engine option given that engine ``chosen`` does not read."""
    spec = {s.name: s for s in option_specs()}[name]
    spelled = spec.named(surface)
    owners = [f for f in names() if name in _reads(f)]
    if surface is Surface.API:
        chosen_text = {TARGET: "target=", SCRIPT: "a script"}.get(chosen, f"engine={chosen!r}")
        owner_text = ", ".join(f"engine={o!r}" for o in owners) or "no engine"
        if spec.owner is None:
            owner_text = f"capturelint's engines ({owner_text})"
    else:
        chosen_text = CHOSEN_BY.get(chosen, f"--engine {chosen}")
        owner_text = "--engine " + ", ".join(owners) if owners else "no engine"
        if spec.owner is None:
            owner_text = f"capturelint's engines ({owner_text})"
    return f"{spelled} configures {owner_text}, and {chosen_text} does not read it, so it would be ignored; drop {spelled}"


def _reads(name: str) -> frozenset[str]:
    options = family_options(name)
    return options.reads | {s.name for s in options.specs}


def engine_options(surface: Surface = Surface.API, caller: str = "check()", extra: tuple[str, ...] = (),
                   **values: Any) -> EngineOptions:
    """The ``EngineOptions`` of keyword arguments spelled as on the command line or given as
    values (``runner="v1"`` or ``Runner.V1``, ``mode="PIECEWISE,FULL"``,
    ``capture_sizes=[2, 4]``), each parsed by its spec; an unknown keyword or a bad value
    is a one-line error naming it as given. ``None`` (and a switch at its default) is not
    given. ``extra``: the caller's own keywords, named in the error for an unknown one."""
    specs = {s.name: s for s in (*ENGINE, *_API_CHECK, *family_specs())}
    by_keyword = {k: s for s in specs.values() for k in (s.name, *s.aliases)}
    parsed: dict[str, Any] = {}
    given = []
    for keyword, value in values.items():
        spec = by_keyword.get(keyword)
        if spec is None:
            raise CapturelintError(f"{caller} has no option {keyword!r}; its options are "
                                   f"{', '.join(sorted({*specs, *extra}))}")
        if spec.name in parsed:
            raise CapturelintError(f"{caller} got {spec.name} twice (also as {keyword}); give it once")
        if value is None or (spec.kind is Kind.SWITCH and value is spec.default):
            continue
        parsed[spec.name] = parse_option(dataclasses.replace(spec, name=keyword), value, surface)
        if spec.name in engine_option_names():
            given.append(spec.name)
    shared = {"runner": "runners", "mode": "modes", "invariants": "invariants_file"}
    family_names = {s.name for s in family_specs()}
    fields = {shared.get(n, n): v for n, v in parsed.items() if n not in family_names}
    return EngineOptions(**fields, family=tuple((n, v) for n, v in parsed.items() if n in family_names),
                         given=tuple(given), surface=surface)


_API_CHECK = tuple(s for s in CHECK if s.name in ("target", "select", "ignore", "invariants", "default_invariants",
                                                   "jobs"))


# --------------------------------------------------------------- the commands' door

_before_run: list[Callable[[], None]] = []


def before_engines_run(hook: Callable[[], None]) -> None:
    """Run ``hook`` once, before the first engine of this process is loaded or run (the
    command line sets torch's threads there: after its options and settings are read)."""
    if hook not in _before_run:
        _before_run.append(hook)


def _starting() -> None:
    while _before_run:
        _before_run.pop(0)()


@hosting
def make_plan(settings: Settings, options: EngineOptions) -> CheckPlan:
    """The plan of the engine asked for: a script (``capturelint run``) chooses the
    script adapter, ``--target`` the target adapter, else ``--engine`` over the settings
    over ``DEFAULT_ENGINE``; an engine option given that it does not read is refused
    (``refusal``); ``plan.jobs`` is ``--jobs`` over the setting over the usable cores,
    ``plan.reuse`` false with ``--no-reuse``."""
    if options.script is not None:
        name = SCRIPT
    elif options.target is not None or options.targets is not None:
        name = TARGET
    elif options.engine is None and settings.targets:  # the project's own engine is the default
        name = TARGET
    else:
        name = merge(options.engine, settings.engine, DEFAULT_ENGINE)
        if name not in names() and options.engine is None and settings.source is not None:
            raise CapturelintError(f"{shown(settings.source)}: [tool.capturelint] engine {name!r} is no engine; use "
                                   f"{' or '.join(names())}")
        if name not in names():
            raise CapturelintError(f"unknown engine {name!r}; use {' or '.join(names())}")
    by_settings = name == TARGET and options.target is None and options.targets is None
    for given in options.given:
        if given not in _reads(name):
            if by_settings:
                spelled = {s.name: s for s in option_specs()}[given].named(options.surface)
                engine = "--engine bundled" if options.surface is not Surface.API else "engine='bundled'"
                raise CapturelintError(f"{spelled} configures capturelint's engines, and this project checks its own "
                                       f"targets ({shown(settings.source)}: targets), which do not read it; add "
                                       f"{engine} to check capturelint's engine, or drop {spelled}")
            raise CapturelintError(refusal(given, name, options.surface))
    plan = adapter(name).make_plan(settings, options)
    jobs = merge(options.jobs, settings.jobs, None)
    return dataclasses.replace(plan, jobs=jobs if jobs is not None else default_jobs(), reuse=options.reuse)


def subject(plan: CheckPlan) -> dict[str, Any]:
    """What the plan checks, as every report says it: ``{"engine": "bundled"}``, the
    targets' names (``{"targets": ["tests/t.py:targets"]}``), ``{"script": "train.py"}``."""
    if plan.engine == TARGET:
        return adapter(TARGET).subject(plan)  # type: ignore[attr-defined, no-any-return]
    if plan.engine == SCRIPT:
        return {"script": str(plan.target)}
    own = getattr(adapter(plan.engine), "subject", None)  # an engine that says more (vLLM: its --model)
    return own(plan) if own is not None else {"engine": plan.engine}


def table(report: Report) -> tuple[tuple[str, ...], list[tuple[str, ...]]] | None:
    """The table an engine prints under its report (columns, rows), when its adapter has
    one for what the report checked (``table(report_json)``: vLLM's ``--model all``, one
    row per architecture, runner and mode); None otherwise."""
    engine = (report.subject or {}).get("engine")
    if engine is None or engine not in names():
        return None
    own = getattr(adapter(engine), "table", None)
    return own(report.to_json()) if own is not None else None


@hosting
def load(plan: CheckPlan) -> CheckPlan:
    """The plan with what it needs built (a target's engines: its configurations known)."""
    _starting()
    return adapter(plan.engine).load(plan)


def unit(plan: CheckPlan) -> str:
    """What the plan's configurations are called in messages."""
    return adapter(plan.engine).UNIT


@hosting
def run_check(plan: CheckPlan, progress: Progress | None = None, shadow: bool = True, static: bool = False,
              keep_captures: bool = False) -> Report:
    """Check every configuration of the plan (its shard's; ``plan.jobs`` at once);
    ``static`` checks the captures only; ``keep_captures`` keeps the capture streams in
    the reports (they are then run in this process)."""
    _starting()
    return adapter(plan.engine).run_check(plan, progress, shadow, static, keep_captures)


@hosting
def record_regions(plan: CheckPlan, progress: Progress | None = None) -> RegionMap:
    """Every configuration's captures, recorded without the shadow: the region map that
    ``snapshot`` writes and ``diff`` compares."""
    _starting()
    return adapter(plan.engine).record_regions(plan, progress)


@hosting
def suggest_slots(plan: CheckPlan) -> list[Slot]:
    """The plan's configurations for ``capturelint suggest``."""
    _starting()
    return adapter(plan.engine).suggest_slots(plan)


# ----------------------------------------------------------------- in process


def register(name: str, new: Adapter | types.ModuleType, options: Any = None) -> None:
    """Add an engine in this process (a test's toy engine): ``new`` its adapter,
    ``options`` its options module (or an object with the same members); ``unregister``
    takes it out. Its options reach the commands built after it (a command's flags are
    built when its module is first imported); an installed plug-in's reach them all."""
    _read_plugins()
    if name in _FAMILIES:
        raise ValueError(f"an engine named {name!r} is registered already")
    _FAMILIES[name] = Family(name, new, options)
    _options.pop(name, None)


def unregister(name: str) -> None:
    if name in _BUILT_IN or name not in _FAMILIES:
        raise ValueError(f"engine {name!r} is not a registered plug-in")
    del _FAMILIES[name]
    _options.pop(name, None)


__all__ = ["Adapter", "CheckPlan", "ENTRY_POINTS", "EngineOptions", "Family", "FamilyOptions", "SCRIPT", "TARGET",
           "adapter", "before_engines_run", "default_texts", "engine_option_names", "engine_options",
           "family_options", "family_specs", "load", "load_settings", "make_plan", "names", "option_specs",
           "record_regions", "refusal", "register", "run_check", "subject", "suggest_slots", "table", "unit",
           "unregister"]
