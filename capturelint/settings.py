"""Project settings: the ``[tool.capturelint]`` table of a ``pyproject.toml``.

**Where they come from.** ``--config PATH`` names the file; without it the search starts
in the current directory and walks up to the filesystem root, stopping after the first
directory that holds a ``.git`` (the repository root). The nearest ``pyproject.toml``
with a ``[tool.capturelint]`` table wins; one without the table is passed over. No file
found means every setting is unset. Printed form::

    [tool.capturelint]
    runners = ["v1", "v2"]
    modes = ["PIECEWISE", "FULL_DECODE_ONLY"]
    eager-region = "narrow"
    select = ["CL1"]                          # codes or code prefixes
    ignore = ["CL105"]
    baseline = "capturelint-baseline.json"   # relative to this file's directory
    max-eager-growth = 10                    # percent
    accept-findings = "capturelint-accepted.json"  # findings accepted (check --accept-findings), relative to this file
    layers = 4
    steps = 8
    seed = 0
    kernels = "torch"
    break-outputs = "copy"                   # copy or discard (vLLM 0.33.0)
    format = "sarif"
    require-oracle = true                    # check: replay not compared with eager is an error

    [tool.capturelint.invariants.moe-captured]   # declared region invariants (capturelint.invariants)
    require = "captured"
    scope = "model.layers.*.ffn*"

**Precedence.** Command-line flags over settings over built-in defaults, one value at a
time: ``merge(cli_value, setting_value, default)``.

**Errors.** An unknown key, a value of the wrong type or outside its choices or bounds
(``capturelint.limits``), an empty list, a rule code that matches no rule, a file that
is not UTF-8 and malformed TOML are configuration errors: ``CapturelintError`` with one
line naming the file, the key and what to write instead. (``ignore = []`` is allowed: it
says that nothing is ignored.) Files are read by ``capturelint.inputs``: a settings file
that is not a regular file, is larger than 4 MiB or nests deeper than 64 levels is
refused the same way.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import os
import re
from pathlib import Path
from typing import Any, Callable, TypeVar

from capturelint.errors import CapturelintError
from capturelint.inputs import InputProblem, load_toml
from capturelint.limits import count_problem, jobs_problem, seed_problem
from capturelint.options import BreakOutputs, CUDAGraphMode, EagerRegion, Runner

PYPROJECT = "pyproject.toml"
KERNELS = ("torch", "triton")
FORMATS = ("rich", "json", "sarif", "github", "html")  # check's --format (capturelint.reporters.formats("check"))
ENGINE_KEYS = ("engine", "runners", "modes", "eager-region", "layers", "steps", "seed", "kernels", "break-outputs")
"""The keys that configure capturelint's engines (an engine of ``--target`` says its own)."""
RULE_CODE = re.compile(r"^CL\d{1,3}$")  # a code (CL101) or a code prefix (CL1)

T = TypeVar("T")
E = TypeVar("E", bound=enum.Enum)


@dataclasses.dataclass(frozen=True)
class Settings:
    """The settings of one project; ``None`` for every key the file does not set.

    Lists become tuples; runners, modes, the eager region and the break-output policy
    are parsed into their values (``capturelint.options``); ``baseline`` and
    ``accept_findings`` are resolved against the directory of ``source``; ``source`` is the file read, or ``None``.
    """

    runners: tuple[Runner, ...] | None = None
    modes: tuple[CUDAGraphMode, ...] | None = None
    eager_region: EagerRegion | None = None
    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] | None = None
    baseline: Path | None = None
    max_eager_growth: float | None = None
    accept_findings: Path | None = None
    layers: int | None = None
    steps: int | None = None
    seed: int | None = None
    kernels: str | None = None
    break_outputs: BreakOutputs | None = None
    format: str | None = None
    engine: str | None = None
    jobs: int | None = None
    require_oracle: bool | None = None
    invariants: tuple[Any, ...] | None = None  # capturelint.invariants.Invariant, in file order
    source: Path | None = None


def merge(cli_value: Any, setting_value: Any, default: Any) -> Any:
    """The value in effect: the command-line value if given, else the setting, else the
    default. ``None`` and an empty tuple (what click gives for an unused
    ``multiple=True`` option) mean "not given on the command line"; for a setting only
    ``None`` means unset, so ``ignore = []`` in the file does override a default."""
    if cli_value is not None and cli_value != ():
        return cli_value
    if setting_value is not None:
        return setting_value
    return default


def load_settings(config: str | os.PathLike[str] | None = None, start: str | os.PathLike[str] | None = None) -> Settings:
    """Settings from ``config`` if given (it must exist and have the table), else from
    the nearest ``pyproject.toml`` with a ``[tool.capturelint]`` table above ``start``
    (default: the current directory), else empty ``Settings()``."""
    if config is not None:
        path = Path(config)
        if not path.exists():
            raise CapturelintError(
                f"{shown(path)}: no such file; --config takes a pyproject.toml with a [tool.capturelint] table"
            )
        table = _table(path, _read_toml(path))
        if table is None:
            raise CapturelintError(
                f"{shown(path)}: no [tool.capturelint] table; add one or pass --config another file"
            )
        return _settings(path, table)
    found = find_config(Path.cwd() if start is None else Path(start))
    if found is None:
        return Settings()
    path, table = found
    return _settings(path, table)


def find_config(start: Path) -> tuple[Path, dict[str, Any]] | None:
    """The nearest ``pyproject.toml`` at or above ``start`` that has a
    ``[tool.capturelint]`` table, and that table; the walk ends after the first
    directory holding ``.git`` or at the filesystem root."""
    directory = start.resolve()
    if not directory.is_dir():
        directory = directory.parent
    while True:
        candidate = directory / PYPROJECT
        if candidate.exists():  # a pyproject.toml that is not a file is an error, not passed over
            table = _table(candidate, _read_toml(candidate))
            if table is not None:
                return candidate, table
        if (directory / ".git").exists() or directory.parent == directory:
            return None
        directory = directory.parent


def read_settings(path: str | os.PathLike[str]) -> Settings:
    """Settings of one file; a file without the table gives ``Settings(source=path)``."""
    path = Path(path)
    table = _table(path, _read_toml(path))
    return _settings(path, table or {})


# ----------------------------------------------------------------------------- parsing


def shown(path: Path) -> str:
    """A settings file's path as messages name it: relative to the working directory
    when below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


def _read_toml(path: Path) -> dict[str, Any]:
    """The TOML of a settings file, read by the bounded reader (``capturelint.inputs``)."""
    try:
        return load_toml(path)
    except InputProblem as e:
        fix = {
            "encoding": "; TOML files are UTF-8: save it as UTF-8",
            "syntax": "; fix the file",
            "nested": "; a settings table is a few levels deep: fix the file",
        }.get(e.kind, "; pass --config a pyproject.toml file")
        raise CapturelintError(f"{shown(path)}: {e.state}{fix}") from None


def _table(path: Path, document: dict[str, Any]) -> dict[str, Any] | None:
    tool = document.get("tool")
    if tool is None:
        return None
    if not isinstance(tool, dict):
        raise CapturelintError(f"{shown(path)}: 'tool' must be a table; write [tool.capturelint]")
    table = tool.get("capturelint")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise CapturelintError(
            f"{shown(path)}: tool.capturelint must be a table, got {_kind(table)}; write [tool.capturelint] "
            "followed by key = value lines"
        )
    return table


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


class _Reader:
    def __init__(self, path: Path, table: dict[str, Any]):
        self.file = path
        self.table = table

    def fail(self, key: str, what: str, value: Any, example: str) -> CapturelintError:
        return CapturelintError(
            f"{shown(self.file)}: [tool.capturelint] {key} must be {what}, got {_kind(value)}; "
            f"write for example {key} = {example}"
        )

    def choice(self, key: str, choices: tuple[str, ...], normalise: Callable[[str], str] = str) -> str | None:
        value = self.table.get(key)
        if value is None:
            return None
        what = "one of " + ", ".join(f'"{c}"' for c in choices)
        if not isinstance(value, str) or normalise(value) not in choices:
            raise self.fail(key, what, value, f'"{choices[0]}"')
        return normalise(value)

    def value(self, key: str, kind: type[E], normalise: Callable[[str], str] = str.lower) -> E | None:
        """One value of ``kind`` (an enum of ``capturelint.options``), by its spelling."""
        text = self.choice(key, tuple(m.value for m in kind), normalise)  # type: ignore[attr-defined]
        return None if text is None else kind(text)

    def values(self, key: str, kind: type[E], normalise: Callable[[str], str] = str.lower) -> tuple[E, ...] | None:
        texts = self.choices(key, tuple(m.value for m in kind), normalise)  # type: ignore[attr-defined]
        return None if texts is None else tuple(kind(t) for t in texts)

    def name(self, key: str) -> str | None:
        """A name another part checks (``engine``: the adapter registry knows the engines)."""
        value = self.table.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, "a name (a non-empty string)", value, '"bundled"')
        return value.strip().lower()

    def empty(self, key: str, what: str) -> CapturelintError:
        return CapturelintError(
            f"{shown(self.file)}: [tool.capturelint] {key} is an empty list; list at least one {what}, "
            f"or remove the key for the default"
        )

    def choices(self, key: str, choices: tuple[str, ...], normalise: Callable[[str], str] = str) -> tuple[str, ...] | None:
        value = self.table.get(key)
        if value is None:
            return None
        what = "a list of " + ", ".join(f'"{c}"' for c in choices)
        example = f'["{choices[0]}"]'
        if not isinstance(value, list):
            raise self.fail(key, what, value, example)
        if not value:
            raise self.empty(key, key.rstrip("s"))
        for item in value:
            if not isinstance(item, str):
                raise self.fail(key, what, value, example)
            if normalise(item) not in choices:
                raise CapturelintError(
                    f"{shown(self.file)}: [tool.capturelint] {key} has unknown entry {item!r}; "
                    f"use {', '.join(choices)}"
                )
        return tuple(normalise(item) for item in value)

    def codes(self, key: str, allow_empty: bool = False) -> tuple[str, ...] | None:
        from capturelint.rules import BY_CODE  # the registry reads without torch

        value = self.table.get(key)
        if value is None:
            return None
        example = '["CL101"]'
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, "a list of rule codes", value, example)
        if not value and not allow_empty:
            raise self.empty(key, "rule code")
        for item in value:
            if not RULE_CODE.match(item.upper()):
                raise CapturelintError(
                    f"{shown(self.file)}: [tool.capturelint] {key} has {item!r}, not a rule code; "
                    f'use codes like "CL101" or prefixes like "CL1" (capturelint rules lists them)'
                )
            if not any(code.startswith(item.upper()) for code in BY_CODE):
                raise CapturelintError(
                    f"{shown(self.file)}: [tool.capturelint] {key} has {item!r}, which matches no rule code; "
                    f"use one of {', '.join(BY_CODE)} or a prefix of them (capturelint rules lists them)"
                )
        return tuple(item.upper() for item in value)

    def flag(self, key: str) -> bool | None:
        value = self.table.get(key)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise self.fail(key, "true or false", value, "true")
        return value

    def _checked(self, key: str, problem_of: Callable[[object], str | None], example: str) -> int | None:
        """An integer setting checked by ``problem_of`` (``capturelint.limits``)."""
        value = self.table.get(key)
        if value is None:
            return None
        problem = problem_of(value)
        if problem is not None:
            raise self.fail(key, problem.removeprefix("must be "), value, example)
        return value

    def count(self, key: str) -> int | None:
        return self._checked(key, lambda v: count_problem(key, v), "4")

    def jobs(self, key: str) -> int | None:
        return self._checked(key, jobs_problem, "2")

    def seed(self, key: str) -> int | None:
        return self._checked(key, seed_problem, "0")

    def percent(self, key: str) -> float | None:
        value = self.table.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
            raise self.fail(key, "a percentage (a number >= 0)", value, "10")
        return float(value)

    def path(self, key: str) -> Path | None:
        value = self.table.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise self.fail(key, "a path (a non-empty string)", value, '"capturelint-baseline.json"')
        return (self.file.resolve().parent / value).resolve()


_KEYS = (
    "runners",
    "modes",
    "eager-region",
    "select",
    "ignore",
    "baseline",
    "max-eager-growth",
    "accept-findings",
    "layers",
    "steps",
    "seed",
    "kernels",
    "break-outputs",
    "format",
    "engine",
    "jobs",
    "require-oracle",
    "invariants",
)


def _invariants(path: Path, table: dict[str, Any]) -> tuple[Any, ...] | None:
    from capturelint.invariants import parse_invariants  # parses without torch

    if "invariants" not in table:
        return None
    return parse_invariants(shown(path), "tool.capturelint.invariants", table["invariants"], f"settings ({shown(path)})")


def _settings(path: Path, table: dict[str, Any]) -> Settings:
    for key in table:
        if key not in _KEYS:
            close = difflib.get_close_matches(key, _KEYS, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise CapturelintError(
                f"{shown(path)}: [tool.capturelint] unknown key '{key}'; {hint}"
                f"known keys: {', '.join(sorted(_KEYS))}"
            )
    r = _Reader(path, table)
    return Settings(
        runners=r.values("runners", Runner),
        modes=r.values("modes", CUDAGraphMode, str.upper),
        eager_region=r.value("eager-region", EagerRegion),
        select=r.codes("select"),
        ignore=r.codes("ignore", allow_empty=True),
        baseline=r.path("baseline"),
        max_eager_growth=r.percent("max-eager-growth"),
        accept_findings=r.path("accept-findings"),
        layers=r.count("layers"),
        steps=r.count("steps"),
        seed=r.seed("seed"),
        kernels=r.choice("kernels", KERNELS, str.lower),
        break_outputs=r.value("break-outputs", BreakOutputs),
        format=r.choice("format", FORMATS, str.lower),
        engine=r.name("engine"),
        jobs=r.jobs("jobs"),
        require_oracle=r.flag("require-oracle"),
        invariants=_invariants(path, table),
        source=path.resolve(),
    )
