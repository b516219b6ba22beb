"""The adapter for a user's engine: ``capturelint check --target SPEC``.

``SPEC`` is ``path/to/file.py:function`` or ``package.module:function``. The named file
is **executed** (imported, like pytest imports test files), then the function is called
with no arguments and returns one ``Target`` or a list of them (one per configuration
you want checked, e.g. per runner and CUDA-graph mode). A target is a callable that
captures and replays (a generation loop of an engine built with capturelint's runtime,
or a program using ``torch.cuda.CUDAGraph`` directly) and the objects that hold its
tensors, so findings can name them::

    from capturelint.target import Target

    def targets():
        return [Target(run=make_engine(mode).generate, roots={"model": ..., "runner": ...},
                       runner="mine", mode=mode) for mode in ("PIECEWISE", "FULL")]

Both the factory and every ``run()`` execute under ``emulate_cuda()`` where no CUDA
device is usable, so code written for a GPU's ``torch.cuda`` graph API runs as it is.

**Exits are errors.** Code of the target that calls ``sys.exit`` (at import, in the
factory, in ``run()`` or ``eager()``) ends the check with a one-line error naming the
target (exit status 2): a check that did not finish has no verdict. So does an
exception from ``eager()`` and, with ``eager()`` given, an output of ``run()`` or
``eager()`` that holds no tensors (``None``, a string): there is nothing to compare.

Each target is traced like a configuration of the bundled engine: every replay step of a
breakable graph, and every call of a graphed callable (``make_graphed_callables``), is
shadowed and checked; a bare ``torch.cuda.CUDAGraph`` has no shadow (no Python re-runs
on replay) and is checked for inputs the program freed. The numerical
oracle is the replay-versus-shadow error per step, plus ``eager()`` when the target
gives one: an eager run of the same workload whose output is compared with ``run()``'s.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from capturelint.adapters.common import (
    CheckPlan,
    forward_context_probe,
    layer_scope_group,
    region_map_of,
    resolve_codes,
    resolve_invariants,
    runtime_break,
)
from capturelint.analyzer import RunLabel
from capturelint.errors import CapturelintError
from capturelint.hosting import called, exit_call
from capturelint.harness import TwinResult
from capturelint.options import EngineOptions, Surface
from capturelint.pipeline import Configuration, check_all, check_configuration
from capturelint.records import ContextProbe, ScopeGroup
from capturelint.report import Report
from capturelint.runtime import frames
from capturelint.runtime.emulated import emulate_cuda
from capturelint.runtime.protocol import flatten_tensors
from capturelint.settings import Settings, shown
from capturelint.shard import select

if TYPE_CHECKING:
    from capturelint.snapshot import RegionMap
    from capturelint.suggest import Slot

frames.register_runtime_file(__file__)  # findings point at the target's code, not at its wrappers here

NAME = "target"
UNIT = "target"


@dataclasses.dataclass(frozen=True)
class Target:
    """One configuration of a user's engine.

    - ``run()`` captures and replays, and returns the output to compare;
    - ``roots`` name its tensors (modules, objects with tensor attributes,
      ``(name, tensor)`` lists); walked again at each step, so a tensor re-allocated
      later is named by the attribute that holds it;
    - ``eager()``, optional, runs the same workload without graphs and returns the
      output ``run()`` must equal (tensors are compared, flattened, max abs error;
      both must return tensors, or lists, tuples or dicts of them);
    - ``probe`` reads the forward context (default: capturelint's own forward context,
      ``attn_metadata`` dict-or-None); ``scope_group`` maps a module scope to the name
      prefix of its tensors (default: ``layers.N``).
    """

    run: Callable[[], Any]
    roots: dict[str, Any] = dataclasses.field(default_factory=dict)
    runner: str = "custom"
    mode: str = "custom"
    eager_region: str = "-"
    eager: Callable[[], Any] | None = None
    probe: ContextProbe | None = forward_context_probe
    scope_group: ScopeGroup | None = layer_scope_group


@dataclasses.dataclass(frozen=True)
class Source:
    """Where some of a check's targets come from: a spec (``FILE.py:FUNCTION`` or
    ``MODULE:FUNCTION``) or objects the Python API was given.

    ``name`` is how reports say it and how region maps key its configurations: the spec
    with its file relative to the project root (the folder of the settings file), so it
    reads the same from every working directory; ``spec`` is what is imported (the file's
    path absolute); ``paths`` go on ``sys.path`` first (the project root, then the
    ``pythonpath`` setting), as pytest puts the root of a project there; ``asked`` names
    it in errors (``--target 'x.py:f'``, ``pyproject.toml: targets 'x.py:f'``); ``made``
    holds the API's ``Target`` objects or their callable."""

    name: str
    spec: str = dataclasses.field(default="", compare=False)
    paths: tuple[str, ...] = dataclasses.field(default=(), compare=False)
    asked: str = dataclasses.field(default="", compare=False)
    made: Any = dataclasses.field(default=None, compare=False, repr=False)
    root: str | None = dataclasses.field(default=None, compare=False)  # the project root (frames.set_display_root)


def load_targets(spec: str) -> list[Target]:
    """Import ``SPEC`` and call it; every way this can fail is a one-line error."""
    return target_factory(spec)()


def target_factory(spec: str | Source) -> Callable[[], list[Target]]:
    """Import ``SPEC``'s file or module once, and return what calls its function and
    checks the result: each call builds the targets anew (``capturelint suggest`` builds
    fresh engines with some functions made eager breaks)."""
    source = spec if isinstance(spec, Source) else Source(spec, spec, asked=f"--target {spec!r}")
    asked = source.asked
    if source.made is not None:
        factory, name = _objects(source.made), "targets"
    else:
        where, sep, name = source.spec.rpartition(":")
        if not sep or not where or not name:
            raise CapturelintError(f"{asked} is not MODULE:FUNCTION or FILE.py:FUNCTION; e.g. myengine.check:targets")
        module = _import(where, asked, source.paths)
        factory = getattr(module, name, None)
        if not callable(factory):
            shown_where = source.name.rpartition(":")[0]
            raise CapturelintError(f"{asked}: {shown_where} has no function {name!r}; define it to return Target "
                                   "objects")

    def make() -> list[Target]:
        try:
            with emulate_cuda():
                made = factory()
        except SystemExit as e:
            raise _exited(asked, f"{name}()", e) from None
        except CapturelintError:
            raise
        except Exception as e:
            raise CapturelintError(f"{asked}: {name}() raised {type(e).__name__}: {e}; fix it, then run again") from e
        targets = list(made) if isinstance(made, (list, tuple)) else [made]
        if not targets or not all(isinstance(t, Target) for t in targets):
            raise CapturelintError(f"{asked}: {name}() must return a Target or a non-empty list of Targets "
                                   "(capturelint.target.Target)")
        return [_guarded_target(asked, t) for t in targets]

    return make


def _objects(made: Any) -> Callable[[], Any]:
    """The factory of the API's ``targets=``: a callable is called for each build; a list
    of ``Target`` objects is the same objects each time (``suggest`` then needs a callable,
    to build fresh engines)."""
    if callable(made) and not isinstance(made, Target):
        return made  # type: ignore[no-any-return]
    return lambda: list(made) if isinstance(made, (list, tuple)) else made


def sources_of(settings: Settings, options: EngineOptions) -> tuple[Source, ...]:
    """The sources of a check's targets: the API's objects (``targets=``), else
    ``--target SPEC`` (a command line's path relative to the working directory; the
    API's, like the settings', relative to the project root when there is a settings
    file), else the ``targets`` setting (relative to the settings file)."""
    root = settings.root
    paths = tuple(str(p) for p in ([root] if root is not None else []) + list(settings.pythonpath or ()))
    found = str(root) if root is not None else None
    if options.targets is not None:
        made = options.targets
        if isinstance(made, (str, os.PathLike)) or (isinstance(made, (list, tuple)) and made
                                                     and all(isinstance(m, (str, os.PathLike)) for m in made)):
            specs = [os.fspath(made)] if isinstance(made, (str, os.PathLike)) else [os.fspath(m) for m in made]
            return tuple(dataclasses.replace(_spec_source(spec, _base(settings, options), root, paths,
                                                          f"targets={spec!r}"), root=found) for spec in specs)
        if callable(made) and not isinstance(made, Target):
            name = f"{getattr(made, '__module__', '?')}:{getattr(made, '__qualname__', repr(made))}"
        elif isinstance(made, Target) or (isinstance(made, (list, tuple)) and made
                                          and all(isinstance(m, Target) for m in made)):
            name = "Target objects"
        else:
            raise CapturelintError("check() got targets= of another kind; give Target objects (capturelint.target."
                                   "Target), a function returning them, or FILE.py:FUNCTION specs")
        return (Source(name, paths=paths, asked=f"targets={name}", made=made, root=found),)
    if options.target is not None:
        asked = f"--target {options.target!r}" if options.surface is Surface.COMMAND_LINE else \
            f"target={options.target!r}"
        return (dataclasses.replace(_spec_source(options.target, _base(settings, options), root, paths, asked),
                                    root=found),)
    where = shown(settings.source) if settings.source is not None else "settings"
    out = []
    for spec in settings.targets or ():
        source = _spec_source(spec, Path.cwd(), root, paths, "")
        out.append(dataclasses.replace(source, asked=f"{where}: targets {source.name!r}", root=found))
    return tuple(out)


def _base(settings: Settings, options: EngineOptions) -> Path:
    """Where a relative target path is read from: the working directory on the command
    line (as users type paths); the project root from the API and the pytest plugin, so
    that a test passes from wherever pytest was started."""
    if options.surface is Surface.COMMAND_LINE or settings.root is None:
        return Path.cwd()
    return settings.root


def _spec_source(spec: str, base: Path, root: Path | None, paths: tuple[str, ...], asked: str) -> Source:
    where, sep, name = spec.rpartition(":")
    if not where.endswith(".py"):
        return Source(spec, spec, paths, asked)
    path = (base / where).resolve()
    shown_as = _shown_path(path, root)
    if root is None:  # no settings file: the nearest folder above with a pyproject.toml is the project's root
        project = next((d for d in path.parents if (d / "pyproject.toml").is_file()), None)
        if project is not None:
            paths = (str(project), *paths)
    return Source(f"{shown_as}:{name}", f"{path}:{name}", paths, asked)


def _shown_path(path: Path, root: Path | None) -> str:
    """``path`` relative to the project root, else to the working directory, else whole."""
    for base in (root, Path.cwd()):
        if base is None:
            continue
        try:
            return path.relative_to(base.resolve()).as_posix()
        except ValueError:
            continue
    return path.as_posix()


def _exited(asked: str, where: str, e: SystemExit) -> CapturelintError:
    return CapturelintError(
        f"{asked}: {where} called {called(e)}, so the check could not finish and has no verdict; "
        f"remove the {exit_call(e)} call (or guard it with if __name__ == '__main__')"
    )


def _guarded_target(spec: str, t: Target) -> Target:
    """``t`` with ``run()`` and ``eager()`` guarded (``_guarded``), each named by its
    runner and mode in errors; with an eager twin, the outputs of both are compared, so
    both must hold tensors."""
    compared = t.eager is not None
    where = f"of runner {t.runner}, mode {t.mode}"
    return dataclasses.replace(
        t, run=_guarded(spec, f"run() {where}", t.run, compared),
        eager=_guarded(spec, f"eager() {where}", t.eager, compared, raises=True) if t.eager is not None else None)


def _guarded(spec: str, where: str, fn: Callable[[], Any], compared: bool = False,
             raises: bool = False) -> Callable[[], Any]:
    """``fn`` with ``sys.exit`` turned into an error naming the target; with ``raises``,
    its exceptions too (``eager()`` runs after the traced run, which names ``run()``'s);
    with ``compared``, an output without tensors (``None``, a string) is an error: there
    is nothing to compare, and comparing nothing proves nothing."""

    def call() -> Any:
        try:
            output = fn()
        except SystemExit as e:
            raise _exited(spec, where, e) from None
        except Exception as e:
            if not raises:
                raise
            raise CapturelintError(
                f"{spec}: {where} raised {type(e).__name__}: {e}; fix it, then run again") from e
        if compared and next(iter(flatten_tensors(output)), None) is None:
            got = "None" if output is None else f"a {type(output).__name__} with no tensors"
            raise CapturelintError(
                f"{spec}: {where} returned {got}, so there is nothing to compare; with eager() given, run() "
                "and eager() must each return the output to compare: tensors, or lists, tuples or dicts of them"
            )
        return output

    return call


def _import(where: str, asked: str, paths: tuple[str, ...] = ()) -> Any:
    """Import a target's file or module with its project's folders on ``sys.path``
    (``Source.paths``: the project root and the ``pythonpath`` setting) and, first, the
    file's own folder, as pytest does."""
    for entry in reversed(paths):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise CapturelintError(f"{asked}: no file {_shown_path(path.resolve(), None)}; "
                                   "give a path to a .py file or a module name")
        sys.path.insert(0, str(path.resolve().parent))  # first: the file imports its neighbours
        shown_file = _shown_path(path.resolve(), None)
        module_name = f"capturelint_target_{path.stem}"
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader_spec)  # type: ignore[arg-type]
        sys.modules[module_name] = module
        try:
            with emulate_cuda():  # module-level code may use the device (Net().cuda(), torch.device("cuda"))
                loader_spec.loader.exec_module(module)  # type: ignore[union-attr]
        except SystemExit as e:
            raise _exited(asked, f"importing {shown_file}", e) from None
        except Exception as e:
            raise CapturelintError(f"{asked}: importing {shown_file} raised {type(e).__name__}: {e}") from e
        return module
    try:
        with emulate_cuda():
            return importlib.import_module(where)
    except SystemExit as e:
        raise _exited(asked, f"importing {where}", e) from None
    except Exception as e:
        raise CapturelintError(f"{asked}: cannot import module {where}: {type(e).__name__}: {e}") from e


def _twin(eager: Callable[[], Any]) -> Callable[[Any], TwinResult]:
    def compare(output: Any) -> TwinResult:
        with emulate_cuda():
            expected = eager()
        a, b = list(flatten_tensors(output)), list(flatten_tensors(expected))
        if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
            return TwinResult(None, float("inf"))
        worst = 0.0
        for x, y in zip(a, b):
            if x.numel():
                d = (x.detach().double() - y.detach().double()).abs().max()
                worst = max(worst, float("inf") if d.isnan() else float(d))
        return TwinResult(None, worst)

    return compare


def configuration(t: Target, invariants: tuple[Any, ...] = ()) -> Configuration:
    return Configuration(RunLabel(t.runner, t.mode), t.run, t.roots, t.eager_region, t.probe, t.scope_group,
                         _twin(t.eager) if t.eager is not None else None, require_replays=True, invariants=invariants)


def run_targets(targets: list[Target], codes: frozenset[str], progress: Callable[[str], None] | None = None,
                invariants: tuple[Any, ...] = (), static: bool = False, jobs: int = 1, shadow: bool = True,
                keep_captures: bool = False) -> Report:
    """Check each target; ``invariants`` (settings and command line: a target has no
    defaults) are checked on its captures; ``static`` checks captures only; ``jobs``
    targets at once, in worker processes forked after the targets were built."""
    return check_all((configuration(t, invariants) for t in targets), codes, shadow, progress=progress, static=static,
                     invariants=invariants, jobs=jobs, keep_captures=keep_captures)


# ------------------------------------------------------------------ the adapter


def make_plan(settings: Settings, options: EngineOptions) -> CheckPlan:
    """The plan of a user's targets (``sources_of``: the API's objects, ``--target
    SPEC`` or the ``targets`` setting): the rules selected and the invariants in force
    (settings and ``--invariants FILE``; a target has no defaults). Engine keys of the
    settings are project-wide (the same table serves ``check`` of capturelint's engines
    and the targets): a warning names them."""
    warnings: tuple[str, ...] = ()
    keys = list(settings.engine_keys)
    if keys and settings.source is not None:
        warnings = (f"{shown(settings.source)}: [tool.capturelint] {', '.join(keys)} configure{'s' * (len(keys) == 1)} "
                    f"capturelint's engines and do not apply to {'--target' if options.target else 'targets'} (its "
                    "Target objects say their runner, mode and workload)",)
    return CheckPlan(codes=resolve_codes(options, settings), engine=NAME,
                     invariants=resolve_invariants(settings, options.invariants_file),
                     sources=sources_of(settings, options), warnings=warnings)


def load(plan: CheckPlan) -> CheckPlan:
    """Import each source's file or module and build its targets, once: the plan's
    configurations are theirs (``runner``, ``mode``). ``plan.loaded``: per source, its
    factory and targets."""
    if plan.loaded is not None:
        return plan
    loaded = []
    roots = {source.root for source in plan.sources}
    frames.set_display_root(roots.pop() if len(roots) == 1 else None)
    for source in plan.sources:
        make = target_factory(source)
        loaded.append((source, make, tuple(make())))
    configured = tuple((t.runner, t.mode) for _, _, targets in loaded for t in targets)
    return dataclasses.replace(plan, configured=configured, loaded=tuple(loaded))


def _named(plan: CheckPlan) -> list[tuple[str, Target]]:
    """Every target of a loaded plan with its source's name, in report order."""
    return [(source.name, t) for source, _, targets in plan.loaded for t in targets]


def run_check(plan: CheckPlan, progress: Callable[[str], None] | None = None, shadow: bool = True,
              static: bool = False, keep_captures: bool = False) -> Report:
    """Check the plan's targets (its shard's), ``plan.jobs`` at once; each configuration
    of the report names its source (``ConfigReport.target``)."""
    plan = load(plan)
    named = select(_named(plan), plan.shard)
    report = run_targets([t for _, t in named], plan.codes, progress, invariants=plan.invariants, static=static,
                         jobs=plan.jobs, shadow=shadow, keep_captures=keep_captures)
    for config, (name, _) in zip(report.configs, named):
        config.target = name
    return report


def record_regions(plan: CheckPlan, progress: Callable[[str], None] | None = None) -> RegionMap:
    """The targets' captures, recorded without the shadow."""
    return region_map_of(run_check(plan, progress, shadow=False), plan)


def suggest_slots(plan: CheckPlan) -> list[Slot]:
    """``capturelint suggest`` of targets: one slot per target; each check calls its
    factory again, so the engine it checks is built with the region in place (breaks
    are capturelint's runtime's)."""
    from capturelint.suggest import Slot

    plan = load(plan)
    decorator = runtime_break()
    entries = [(make, i, t) for _, make, targets in plan.loaded for i, t in enumerate(targets)]
    labels = [f"{t.runner}/{t.mode}" for _, _, t in entries]
    out = []
    for n, (make, i, t) in enumerate(entries):
        label = labels[n] if labels.count(labels[n]) == 1 else f"{labels[n]}#{n}"

        def check(make: Callable[[], list[Target]] = make, i: int = i) -> Any:
            return check_configuration(configuration(make()[i]), plan.codes)

        out.append(Slot(label, t.runner, t.mode, check, decorator))
    return out


def subject(plan: CheckPlan) -> dict[str, Any]:
    """What the plan checks, as reports say it: ``{"targets": [names]}``."""
    return {"targets": [source.name for source in plan.sources]}


def default_invariants() -> tuple[Any, ...]:
    """None: a user's engine declares its invariants in its settings."""
    return ()


__all__ = ["NAME", "Source", "Target", "default_invariants", "load", "load_targets", "make_plan", "record_regions",
           "run_check", "run_targets", "sources_of", "subject", "suggest_slots", "target_factory"]
