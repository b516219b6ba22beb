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
from capturelint.options import EngineOptions
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


def load_targets(spec: str) -> list[Target]:
    """Import ``SPEC`` and call it; every way this can fail is a one-line error."""
    return target_factory(spec)()


def target_factory(spec: str) -> Callable[[], list[Target]]:
    """Import ``SPEC``'s file or module once, and return what calls its function and
    checks the result: each call builds the targets anew (``capturelint suggest`` builds
    fresh engines with some functions made eager breaks)."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise CapturelintError(f"--target {spec!r} is not MODULE:FUNCTION or FILE.py:FUNCTION; e.g. myengine.check:targets")
    module = _import(where, spec)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise CapturelintError(f"--target {spec!r}: {where} has no function {name!r}; define it to return Target objects")

    def make() -> list[Target]:
        try:
            with emulate_cuda():
                made = factory()
        except SystemExit as e:
            raise _exited(spec, f"{name}()", e) from None
        except Exception as e:
            raise CapturelintError(f"--target {spec!r}: {name}() raised {type(e).__name__}: {e}; fix it, then run again") from e
        targets = list(made) if isinstance(made, (list, tuple)) else [made]
        if not targets or not all(isinstance(t, Target) for t in targets):
            raise CapturelintError(f"--target {spec!r}: {name}() must return a Target or a non-empty list of Targets (capturelint.target.Target)")
        return [_guarded_target(spec, t) for t in targets]

    return make


def _exited(spec: str, where: str, e: SystemExit) -> CapturelintError:
    return CapturelintError(
        f"--target {spec!r}: {where} called {called(e)}, so the check could not finish and has no verdict; "
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
                f"--target {spec!r}: {where} raised {type(e).__name__}: {e}; fix it, then run again") from e
        if compared and next(iter(flatten_tensors(output)), None) is None:
            got = "None" if output is None else f"a {type(output).__name__} with no tensors"
            raise CapturelintError(
                f"--target {spec!r}: {where} returned {got}, so there is nothing to compare; with eager() given, run() "
                "and eager() must each return the output to compare: tensors, or lists, tuples or dicts of them"
            )
        return output

    return call


def _import(where: str, spec: str) -> Any:
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise CapturelintError(f"--target {spec!r}: no file {where}; give a path to a .py file or a module name")
        # The file's folder goes on sys.path so that it can import its neighbours.
        sys.path.insert(0, str(path.resolve().parent))
        module_name = f"capturelint_target_{path.stem}"
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader_spec)  # type: ignore[arg-type]
        sys.modules[module_name] = module
        try:
            with emulate_cuda():  # module-level code may use the device (Net().cuda(), torch.device("cuda"))
                loader_spec.loader.exec_module(module)  # type: ignore[union-attr]
        except SystemExit as e:
            raise _exited(spec, f"importing {where}", e) from None
        except Exception as e:
            raise CapturelintError(f"--target {spec!r}: importing {where} raised {type(e).__name__}: {e}") from e
        return module
    try:
        with emulate_cuda():
            return importlib.import_module(where)
    except SystemExit as e:
        raise _exited(spec, f"importing {where}", e) from None
    except Exception as e:
        raise CapturelintError(f"--target {spec!r}: cannot import module {where}: {type(e).__name__}: {e}") from e


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
    """The plan of ``--target SPEC``: the rules selected and the invariants in force
    (settings and ``--invariants FILE``; a target has no defaults). Engine keys of the
    settings are project-wide (the same table serves ``check`` of capturelint's engines
    and ``--target``): a warning names them."""
    warnings: tuple[str, ...] = ()
    keys = list(settings.engine_keys)
    if keys and settings.source is not None:
        warnings = (f"{shown(settings.source)}: [tool.capturelint] {', '.join(keys)} configure{'s' * (len(keys) == 1)} "
                    "capturelint's engines and do not apply to --target (its Target objects say their runner, mode and "
                    "workload)",)
    return CheckPlan(codes=resolve_codes(options, settings), engine=NAME,
                     invariants=resolve_invariants(settings, options.invariants_file), target=options.target,
                     warnings=warnings)


def load(plan: CheckPlan) -> CheckPlan:
    """Import the target's file or module and build its targets, once: the plan's
    configurations are theirs (``runner``, ``mode``)."""
    if plan.loaded is not None:
        return plan
    make = target_factory(str(plan.target))
    targets = tuple(make())
    return dataclasses.replace(plan, configured=tuple((t.runner, t.mode) for t in targets), loaded=(make, targets))


def run_check(plan: CheckPlan, progress: Callable[[str], None] | None = None, shadow: bool = True,
              static: bool = False, keep_captures: bool = False) -> Report:
    """Check the plan's targets (its shard's), ``plan.jobs`` at once."""
    plan = load(plan)
    targets = select(plan.loaded[1], plan.shard)
    return run_targets(targets, plan.codes, progress, invariants=plan.invariants, static=static, jobs=plan.jobs,
                       shadow=shadow, keep_captures=keep_captures)


def record_regions(plan: CheckPlan, progress: Callable[[str], None] | None = None) -> RegionMap:
    """The targets' captures, recorded without the shadow."""
    return region_map_of(run_check(plan, progress, shadow=False), plan)


def suggest_slots(plan: CheckPlan) -> list[Slot]:
    """``capturelint suggest --target SPEC``: one slot per target; each check calls the
    factory again, so the engine it checks is built with the region in place (breaks
    are capturelint's runtime's)."""
    from capturelint.suggest import Slot

    plan = load(plan)
    make, targets = plan.loaded
    labels = [f"{t.runner}/{t.mode}" for t in targets]
    decorator = runtime_break()
    out = []
    for i, t in enumerate(targets):
        label = labels[i] if labels.count(labels[i]) == 1 else f"{labels[i]}#{i}"

        def check(i: int = i) -> Any:
            return check_configuration(configuration(make()[i]), plan.codes)

        out.append(Slot(label, t.runner, t.mode, check, decorator))
    return out


def default_invariants() -> tuple[Any, ...]:
    """None: a user's engine declares its invariants in its settings."""
    return ()


__all__ = ["NAME", "Target", "default_invariants", "load", "load_targets", "make_plan", "record_regions",
           "run_check", "run_targets", "suggest_slots", "target_factory"]
