"""The options every engine shares, declared once as ``capturelint.options.OptionSpec``\\ s.

The engine families declare their own (``capturelint.adapters.registry``); these are the
rest: which engine and which of its configurations (``ENGINE``: what every engine family
reads, or refuses with the registry's one message), which rules and invariants, what
to report, how fast. The command line builds its options from them
(``capturelint.commands.common``), the settings reader its keys
(``capturelint.settings``), the Python API its keywords (``capturelint.api``), and
``check --help`` lists them under their ``group``:

- ``WHAT`` (what to check), ``REPORT`` (what to report), ``SPEED``; the families' own
  under ``Engine options (NAME)``.

A setting's key is its flag's name (``runner`` for ``--runner``); ``runners`` and
``modes``, the keys of earlier versions, are kept as aliases. Nothing here imports
torch: options and settings are read before an engine loads.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from capturelint.limits import count_problem, jobs_problem, seed_problem
from capturelint.output import COLORS
from capturelint.options import (
    EagerRegion,
    Kind,
    OptionProblem,
    OptionSpec,
    checked_int,
    choice_value,
    mode_value,
    runner_value,
    switch_value,
    text_choice,
    text_value,
)

WHAT = "What to check"
REPORT = "What to report"
SPEED = "Speed"
GROUPS = (WHAT, REPORT, SPEED)  # the help sections, in order; the families' follow

FORMATS = ("rich", "json", "sarif", "github", "html")  # check's --format (capturelint.reporters.formats("check"))
RULE_CODE = re.compile(r"^CL\d{0,3}$")  # a code (CL101) or a code prefix (CL1, CL: every rule)


def codes_value(empty: bool = False):  # noqa: ANN201 - a parser
    """Rule codes or code prefixes (``CL1``), comma-separated or listed, each matching a
    rule; ``empty``: an empty list is allowed (``ignore = []``: nothing is ignored)."""

    def parse(value: Any) -> tuple[str, ...]:
        from capturelint.rules import BY_CODE  # the registry of rules reads without torch

        if isinstance(value, (list, tuple)) and not value and empty:
            return ()
        if isinstance(value, str):
            items = [p.strip() for p in value.split(",")]
            if not any(items):
                raise OptionProblem("names nothing; give a value or leave the option out", got=False)
        elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            if not value:
                raise OptionProblem("is an empty list; list at least one rule code, or leave it out for the default",
                                    got=False)
            items = [p.strip() for v in value for p in v.split(",")]
        else:
            raise OptionProblem("must be a list of rule codes", '["CL101"]')
        out = []
        for item in (i for i in items if i):
            code = item.upper()
            if not RULE_CODE.match(code):
                raise OptionProblem(f"has {item!r}, not a rule code; use codes like \"CL101\" or prefixes like \"CL1\" "
                                    "(capturelint rules lists them)", got=False)
            if not any(c.startswith(code) for c in BY_CODE):
                raise OptionProblem(f"has {item!r}, which matches no rule code; use one of {', '.join(BY_CODE)} or a "
                                    "prefix of them (capturelint rules lists them)", got=False)
            out.append(code)
        return tuple(out)

    return parse


def specs_value(value: Any) -> tuple[str, ...]:
    """Target specs (``FILE.py:FUNCTION`` or ``MODULE:FUNCTION``), a non-empty list of
    them; paths are resolved by the settings reader (relative to its file)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items or not all(isinstance(v, str) for v in items):
        raise OptionProblem("must be a non-empty list of FILE.py:FUNCTION or MODULE:FUNCTION specs",
                            '["tests/capture_targets.py:targets"]')
    for item in items:
        where, sep, name = item.strip().rpartition(":")
        if not sep or not where or not name.isidentifier():
            raise OptionProblem(f"has {item!r}, which is not FILE.py:FUNCTION or MODULE:FUNCTION", got=False)
    return tuple(item.strip() for item in items)


def paths_value(value: Any) -> tuple[str, ...]:
    """Folder paths, a non-empty list of non-empty strings."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items or not all(isinstance(v, str) and v.strip() for v in items):
        raise OptionProblem("must be a non-empty list of folder paths", '["src"]')
    return tuple(items)


def percent_value(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or math.isinf(value):
        raise OptionProblem("must be a percentage (a number >= 0)", "10")
    return float(value)


def name_value(value: Any) -> str:
    """A name another part checks (``engine``: the adapter registry knows the engines)."""
    if not isinstance(value, str) or not value.strip():
        raise OptionProblem("must be a name (a non-empty string)", '"bundled"')
    return value.strip().lower()


def shard_value(value: Any) -> str:
    """``K/N``: parsed by ``capturelint.shard`` (its message names ``--shard``)."""
    if not isinstance(value, str) or not value.strip():
        raise OptionProblem("must be K/N (a string such as \"1/4\")", '"1/4"')
    return value


def table_value(value: Any) -> Any:
    """The invariants table: read by ``capturelint.invariants`` (the settings reader)."""
    if not isinstance(value, dict):
        raise OptionProblem("must be a table of invariants ([tool.capturelint.invariants.ID])", "{}")
    return value


def _spec(name: str, parse: Any, help: str, group: str, **kw: Any) -> OptionSpec:
    return OptionSpec(name, parse, help, group, **kw)


ENGINE: tuple[OptionSpec, ...] = (
    _spec("engine", name_value, "Engine to check: the bundled DeepSeek V4 model of vLLM, or vLLM's own DeepSeek V4 "
          "attention as Python imports it (vLLM 0.33.0), or an engine a plug-in adds.", WHAT,
          metavar="NAME", default="bundled"),
    _spec("runner", runner_value, "Model runner, or all of them.", WHAT, metavar="v1|v2|all", aliases=("runners",)),
    _spec("mode", mode_value, "CUDA-graph modes, repeatable or comma-separated.", WHAT, kind=Kind.LIST,
          metavar="MODE", aliases=("modes",)),
    _spec("eager_region", choice_value(EagerRegion, "eager region"), "Eager region of the attention.", WHAT,
          metavar="|".join(m.value for m in EagerRegion), default=EagerRegion.PER_RUNNER),
    _spec("layers", checked_int(lambda v: count_problem("layers", v), "4"), "Decoder layers.", WHAT, metavar="N",
          number=int),
    _spec("steps", checked_int(lambda v: count_problem("steps", v), "8"), "Engine steps of the workload, one forward "
          "each.", WHAT, metavar="N", number=int),
    _spec("seed", checked_int(seed_problem, "0"), "Seed of weights and workload.", WHAT, metavar="N", number=int,
          default=0),
    _spec("reuse", switch_value, "Share no work between configurations (each runs its own eager twin); the report "
          "is the same.", SPEED, flag="--no-reuse", key=None, kind=Kind.SWITCH, switched=False, default=True),
)
"""The options that configure capturelint's engines: an engine family says which of them
it reads (``READS``), and one given that it does not read is refused."""

CHECK: tuple[OptionSpec, ...] = (
    _spec("target", text_value("an engine spec, FILE.py:FUNCTION or MODULE:FUNCTION", '"tests/engine.py:targets"'),
          "Check your own engine instead of capturelint's: FILE.py:FUNCTION (the file is executed, as pytest imports "
          "test files) or MODULE:FUNCTION, returning capturelint.target.Target objects (engine options such as "
          "--runner or --layers do not apply: an error).", WHAT, key=None, metavar="SPEC"),
    _spec("targets", specs_value, "The project's own engine: the targets to check when no --engine or --target is "
          "given (FILE.py:FUNCTION, the path relative to this settings file, or MODULE:FUNCTION).", WHAT, flag=None, key="targets",
          kind=Kind.LIST),
    _spec("pythonpath", paths_value, "Folders put on sys.path, after the project root (the folder of this settings "
          "file), before a target is imported (e.g. [\"src\"] for a src/ layout); relative to this settings file.",
          WHAT, flag=None, key="pythonpath", kind=Kind.LIST),
    _spec("select", codes_value(), "Only these rule codes (prefixes allowed, e.g. CL1).", WHAT, kind=Kind.LIST,
          metavar="CODES"),
    _spec("ignore", codes_value(empty=True), "Skip these rule codes.", WHAT, kind=Kind.LIST, metavar="CODES"),
    _spec("invariants", text_value("a path", '"invariants.toml"'), "Also hold the invariants of this TOML file "
          "([invariants.ID] tables); they replace defaults and settings with the same id.", WHAT, key=None,
          metavar="FILE"),
    _spec("invariant_table", table_value, "Declared region invariants ([tool.capturelint.invariants.ID]).", WHAT,
          flag=None, key="invariants"),
    _spec("default_invariants", switch_value, "The engine's own declared invariants are in force (the Python API; "
          "False leaves them out).", WHAT, flag=None, key=None, kind=Kind.SWITCH, default=True),
    _spec("static", switch_value, "Capture the graphs only (no replay shadow, no eager twin) and check the declared "
          "invariants and host syncs at capture: the fast pre-commit hook. Replay equivalence is NOT checked.", WHAT,
          key=None, kind=Kind.SWITCH, default=False),
    _spec("baseline", text_value("a path", '"capturelint-baseline.json"'), "Also report region changes against this "
          "snapshot.", WHAT, metavar="FILE"),
    _spec("max_eager_growth", percent_value, "With --baseline: fail when eager ops per step grow by more than PCT "
          "percent.", WHAT, metavar="PCT", number=float, default=0),
    _spec("accept_findings", text_value("a path", '"capturelint-accepted.json"'), "Accept the findings this file "
          "lists (keyed by fingerprint, no line numbers): they are counted, not failed on. A FILE that does not exist "
          "is written with this check's findings.", WHAT, metavar="FILE"),
    _spec("update_accepted", switch_value, "Rewrite the --accept-findings file with this check's findings: new ones "
          "added, those that no longer occur dropped.", WHAT, key=None, kind=Kind.SWITCH, default=False),
    _spec("config", text_value("a path", '"pyproject.toml"'), "Read [tool.capturelint] from this file instead of the "
          "nearest pyproject.toml.", WHAT, key=None, metavar="PYPROJECT"),
    _spec("format", text_choice(FORMATS), "Report format.", REPORT, choices=FORMATS, default="rich"),
    _spec("output", text_value("a path", '"report.json"'), "Write the report to FILE (atomically, after the run) "
          "instead of stdout; - is stdout.", REPORT, key=None, short="-o", metavar="FILE"),
    _spec("verbose", switch_value, "Rich report: the default report, then the evidence (a panel per runner and "
          "mode with every graph's segments, then per problem every finding with its ops, source lines and replay "
          "steps).",
          REPORT, key=None, short="-v", kind=Kind.SWITCH, default=False),
    _spec("exit_zero", switch_value, "Exit 0 even when there are findings.", REPORT, key=None, kind=Kind.SWITCH,
          default=False),
    _spec("strict", switch_value, "An invariant that selects no op is an error (exit 2), not a warning.", REPORT,
          key=None, kind=Kind.SWITCH, default=False),
    _spec("require_oracle", switch_value, "A configuration that replays graphs without comparing them with eager "
          "execution (a bare CUDA graph whose Target gives no eager twin) is an error (exit 2), for CI that wants "
          "numbers.", REPORT, kind=Kind.SWITCH, default=False),
    _spec("jobs", checked_int(jobs_problem, "2"), "Configurations checked at once, in worker processes; the report is "
          "the same for every N.", SPEED, short="-j", metavar="N", number=int, default_text="the usable cores"),
    _spec("shard", shard_value, "Run shard K of N: every N-th configuration (or target) in report order, starting at "
          "the K-th; the N shards partition the check and capturelint merge joins their reports (JSON or SARIF) "
          "into the unsharded report.", SPEED, key=None, metavar="K/N"),
)
"""The options of a check that are not an engine's: rules, invariants, the report, speed."""

SHARED: tuple[OptionSpec, ...] = ENGINE + CHECK

TERMINAL: tuple[OptionSpec, ...] = (
    _spec("quiet", switch_value, "No progress on stderr (also: CAPTURELINT_QUIET=1); the report and its summary are "
          "printed as without it.", REPORT, key=None, short="-q", kind=Kind.SWITCH, default=False),
    _spec("color", text_choice(COLORS), "Colour the output: auto (on a terminal; NO_COLOR turns it off, FORCE_COLOR "
          "on, NO_COLOR winning), always or never.", REPORT, key=None, metavar="auto|always|never", choices=COLORS,
          default="auto"),
)
"""How a command talks to the terminal (``capturelint.output.Terminal``): options of the
command line only (no setting, no API keyword), for every command that prints a report."""

BY_NAME = {spec.name: spec for spec in SHARED + TERMINAL}


def shared(*names: str) -> tuple[OptionSpec, ...]:
    """The shared specs named, in that order."""
    return tuple(BY_NAME[n] for n in names)


def with_help(spec: OptionSpec, **changes: Any) -> OptionSpec:
    """``spec`` with another help or default text (a command that says it its own way)."""
    return dataclasses.replace(spec, **changes)


__all__ = ["CHECK", "ENGINE", "FORMATS", "GROUPS", "REPORT", "SHARED", "SPEED", "TERMINAL", "WHAT", "BY_NAME",
           "codes_value", "name_value", "paths_value", "percent_value", "shared", "specs_value", "with_help"]
