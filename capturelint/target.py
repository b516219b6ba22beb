"""Checking an engine of your own: ``capturelint check --target SPEC``.

``SPEC`` is ``path/to/file.py:function`` or ``package.module:function``. The function
takes no arguments and returns one ``Target`` or a list of them (one per configuration
you want checked, e.g. per runner and CUDA-graph mode). A target is a callable that
captures and replays (a generation loop of an engine built with
``capturelint.engine.cudagraph``) and the objects that hold its tensors, so findings
can name them::

    from capturelint.target import Target

    def targets():
        return [Target(run=make_engine(mode).generate, roots={"model": ..., "runner": ...},
                       runner="mine", mode=mode) for mode in ("PIECEWISE", "FULL")]

Each target is traced like a configuration of the bundled engine: every replay step is
shadowed and checked. There is no eager twin (capturelint cannot build one for an engine
it does not know), so the numerical oracle is the replay-versus-shadow error per step.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

from capturelint.analyzer import RunLabel
from capturelint.errors import CapturelintError
from capturelint.findings import Numerical
from capturelint.harness import coverage_gap, merge, trace_run
from capturelint.regions import graph_map
from capturelint.report import ConfigReport, Report


@dataclasses.dataclass(frozen=True)
class Target:
    """One configuration of a user's engine: ``run()`` captures and replays; ``roots``
    name its tensors (modules, objects with tensor attributes, ``(name, tensor)`` lists)."""

    run: Callable[[], Any]
    roots: dict[str, Any] = dataclasses.field(default_factory=dict)
    runner: str = "custom"
    mode: str = "custom"
    eager_region: str = "-"


def load_targets(spec: str) -> list[Target]:
    """Import ``SPEC`` and call it; every way this can fail is a one-line error."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise CapturelintError(f"--target {spec!r} is not MODULE:FUNCTION or FILE.py:FUNCTION; e.g. myengine.check:targets")
    module = _import(where, spec)
    factory = getattr(module, name, None)
    if not callable(factory):
        raise CapturelintError(f"--target {spec!r}: {where} has no function {name!r}; define it to return Target objects")
    try:
        made = factory()
    except Exception as e:
        raise CapturelintError(f"--target {spec!r}: {name}() raised {type(e).__name__}: {e}; fix it, then run again") from e
    targets = list(made) if isinstance(made, (list, tuple)) else [made]
    if not targets or not all(isinstance(t, Target) for t in targets):
        raise CapturelintError(f"--target {spec!r}: {name}() must return a Target or a non-empty list of Targets (capturelint.target.Target)")
    return targets


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
            loader_spec.loader.exec_module(module)  # type: ignore[union-attr]
        except Exception as e:
            raise CapturelintError(f"--target {spec!r}: importing {where} raised {type(e).__name__}: {e}") from e
        return module
    try:
        return importlib.import_module(where)
    except Exception as e:
        raise CapturelintError(f"--target {spec!r}: cannot import module {where}: {type(e).__name__}: {e}") from e


def run_targets(targets: list[Target], codes: frozenset[str], progress: Callable[[str], None] | None = None) -> Report:
    configs = []
    for t in targets:
        if progress is not None:
            progress(f"{t.runner} · {t.mode}")
        label = RunLabel(t.runner, t.mode)
        result = trace_run(t.run, t.roots, label, codes)
        findings = list(result.findings)
        numerical = None
        note = None
        if result.capture_failed:
            note = "the capture failed on a host synchronisation; replay did not run"
        elif result.replay_steps == 0:
            raise CapturelintError(
                f"target {t.runner}/{t.mode} captured {len(result.captures)} graph(s) but replayed none, so no step "
                "could be checked; make run() replay its graphs (run more steps)"
            )
        else:
            numerical = Numerical(t.runner, t.mode, None, result.max_step_error, None, result.replay_steps)
            gap = coverage_gap(label, findings, None, result.max_step_error, codes)
            if gap is not None:
                findings.append(gap)
        graphs = [graph_map(c) for c in result.captures]
        configs.append(ConfigReport(t.runner, t.mode, t.eager_region, merge(findings), numerical, graphs,
                                    captures=result.captures, note=note))
    return Report(configs)
