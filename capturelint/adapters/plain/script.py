"""The adapter of a plain program: ``capturelint run SCRIPT.py [ARGS...]``.

The script runs unmodified, as ``python SCRIPT.py ARGS...`` would run it, under the
emulated CUDA device and the tracer, the way ``TORCH_CUDA_SANITIZER=1 python
SCRIPT.py`` runs PyTorch's stream sanitizer: every graph it captures and replays
(``torch.cuda.CUDAGraph``, ``torch.cuda.graph``, ``make_graphed_callables``) is checked,
and the findings are reported when it ends. It is one configuration, runner ``script``
and mode the script's file name, checked through the check pipeline with no roots (the
bare-graph rules find who holds each graph input themselves) and no eager twin.

While it runs, ``sys.argv`` is ``[SCRIPT, *ARGS]``, ``__name__`` is ``"__main__"``,
the script's folder is first on ``sys.path``, and what it prints goes to standard
error (standard output carries the report); all are restored after. Its own exit
status (``sys.exit(3)``) is kept apart from capturelint's: the report's note says it. A
script that ends with ``os._exit(n)`` ends its run there, as with ``sys.exit(n)``: it is
checked up to that call, and the note says so (``capturelint.hosting``).
An exception it does not catch is a one-line error naming the script's line, and a
script that captures no graph is an error too: nothing was compared.
"""

from __future__ import annotations

import contextlib
import dataclasses
import runpy
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from capturelint.adapters.common import (
    CheckPlan,
    region_map_of,
    resolve_codes,
    resolve_invariants,
)
from capturelint.analyzer import RunLabel
from capturelint.errors import CapturelintError
from capturelint.hosting import ProgramExit, called
from capturelint.options import EngineOptions
from capturelint.pipeline import Configuration, Task, check_configuration, run_all
from capturelint.report import ConfigReport, Report
from capturelint.runtime import frames
from capturelint.settings import Settings

if TYPE_CHECKING:
    from capturelint.snapshot import RegionMap
    from capturelint.suggest import Slot

frames.register_runtime_file(__file__)  # findings point at the script's lines, not at its runner here

NAME = "script"
UNIT = "script"
RUNNER = "script"


@dataclasses.dataclass
class Script:
    """The script and its arguments; ``status`` is its own exit status once it ran
    (``None`` until then; 0 when it ended without ``sys.exit``); ``ended_by``: the call
    that ended it (``os._exit(5)``: ``capturelint.hosting``), ``None`` when it ran to its end."""

    path: Path
    args: tuple[str, ...] = ()
    status: int | None = None
    ended_by: str | None = None

    @property
    def name(self) -> str:
        return self.path.name

    def run(self) -> None:
        """Run the script as ``python SCRIPT ARGS...`` would, and keep its exit status."""
        saved_argv, saved_path = sys.argv, list(sys.path)
        sys.argv = [str(self.path), *self.args]
        sys.path.insert(0, str(self.path.resolve().parent))
        self.status = 0
        try:
            with contextlib.redirect_stdout(sys.stderr):
                runpy.run_path(str(self.path), run_name="__main__")
        except SystemExit as e:
            self.status = _exit_status(e)
            self.ended_by = called(e) if isinstance(e, ProgramExit) else None
        except Exception as e:
            # ``from e``: the pipeline finds a host sync that failed a capture as the cause
            limit = frames.limit_of(e)
            if limit is not None:
                raise CapturelintError(f"the script {self.name} met a limit of capturelint, not a bug of the script: "
                                       f"{limit}") from e
            raise CapturelintError(
                f"the script {self.name} raised {type(e).__name__} at {frames.traceback_frame(e)}: {e}; this is a bug "
                "of the script, not a replay hazard: fix it and run again"
            ) from e
        finally:
            sys.argv, sys.path[:] = saved_argv, saved_path

    def note(self) -> str | None:
        if self.ended_by is not None:  # os._exit: its status, even 0, and that what followed the call did not run
            return f"the script ended with {self.ended_by}; it was checked up to that call"
        return None if not self.status else f"the script exited with status {self.status}"


def _exit_status(e: SystemExit) -> int:
    """The status ``python`` ends with on ``sys.exit(code)``: ``None`` is 0, a number is
    itself, anything else is printed (to standard error) and is 1."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def configuration(script: Script, invariants: tuple[Any, ...] = ()) -> Configuration:
    return Configuration(RunLabel(RUNNER, script.name), script.run, require_replays=True, invariants=invariants,
                         subject=f"the script {script.name}")


# ------------------------------------------------------------------ the adapter


def make_plan(settings: Settings, options: EngineOptions) -> CheckPlan:
    """The plan of ``capturelint run SCRIPT [ARGS...]``: the rules selected and the
    invariants in force (settings and ``--invariants FILE``; a script has no defaults)."""
    assert options.script is not None  # the registry chooses this adapter for a script
    path, *args = options.script
    if not path.endswith(".py") or not Path(path).is_file():
        what = "no file" if not Path(path).exists() else "not a .py file:"
        raise CapturelintError(f"capturelint run: {what} {path}; give the path of a Python script, e.g. "
                               "capturelint run train.py --steps 3")
    script = Script(Path(path), tuple(args))
    return CheckPlan(codes=resolve_codes(options, settings), engine=NAME, target=path,
                     invariants=resolve_invariants(settings, options.invariants_file),
                     configured=((RUNNER, script.name),), loaded=script)


def load(plan: CheckPlan) -> CheckPlan:
    """Nothing to build before it runs: the script is its own workload."""
    return plan


def run_check(plan: CheckPlan, progress: Callable[[str], None] | None = None, shadow: bool = True,
              static: bool = False, keep_captures: bool = False) -> Report:
    """Run the script under the tracer, here (its state and its exit status stay in this
    process); its report's note says its exit status when it was not 0."""
    script: Script = plan.loaded

    def check() -> ConfigReport:
        report = check_configuration(configuration(script, plan.invariants), plan.codes, shadow, static)
        notes = [n for n in (report.note, script.note()) if n]
        return dataclasses.replace(report, note="; ".join(notes) or None)

    reports = run_all([Task(f"script {script.name}", check)], 1, progress, keep_captures)
    return Report(reports, invariants=plan.invariants, static=static)


def record_regions(plan: CheckPlan, progress: Callable[[str], None] | None = None) -> RegionMap:
    """The script's captures, recorded without the shadow."""
    return region_map_of(run_check(plan, progress, shadow=False), plan)


def suggest_slots(plan: CheckPlan) -> list[Slot]:
    """None: a script is run once, as it is; ``suggest`` needs a ``--target`` it can
    build again with a function made an eager break."""
    raise CapturelintError("capturelint suggest needs an engine it can build again: wrap the script's graph code in a "
                           "--target FILE.py:FUNCTION (capturelint.target.Target)")


def default_invariants() -> tuple[Any, ...]:
    """None: a script declares its invariants in its settings."""
    return ()


__all__ = ["NAME", "Script", "configuration", "default_invariants", "load", "make_plan", "record_regions",
           "run_check", "suggest_slots"]
