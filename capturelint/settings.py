"""Project settings: the ``[tool.capturelint]`` table of a ``pyproject.toml``.

**Where they come from.** ``--config PATH`` names the file; without it the search starts
in the current directory and walks up to the filesystem root, stopping after the first
directory that holds a ``.git`` (the repository root). The nearest ``pyproject.toml``
with a ``[tool.capturelint]`` table wins; one without the table is passed over. No file
found means every setting is unset. Printed form::

    [tool.capturelint]
    targets = ["tests/capture_targets.py:targets"]  # your engine, checked by default; paths relative to this file
    pythonpath = ["src"]                     # on sys.path (after this file's folder) before a target is imported
    runner = ["v1", "v2"]                    # or "all"; runners, the key of earlier versions, is read too
    mode = ["PIECEWISE", "FULL_DECODE_ONLY"]  # modes is read too
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
    capture-sizes = [2, 4]                   # an engine family's own option (--engine vllm's)

    [tool.capturelint.invariants.moe-captured]   # declared region invariants (capturelint.invariants)
    require = "captured"
    scope = "model.layers.*.ffn*"

**Keys.** A key is an option's flag without its dashes (``capturelint.common_options``,
and each engine family's own, which the adapter registry passes in: ``specs``); one
value is parsed by the same function on the command line, here and in the Python API
(``capturelint.options.parse_option``). An engine family's keys are read whichever
engine runs (one table serves every engine of a project): the family's own adapter
uses them, the others leave them.

**Precedence.** Command-line flags over settings over built-in defaults, one value at a
time: ``merge(cli_value, setting_value, default)``.

**Errors.** An unknown key, a value of the wrong type or outside its choices or bounds
(``capturelint.limits``), an empty list, a rule code that matches no rule, a key given
twice by its two names (``runner`` and ``runners``), a file that is not UTF-8 and
malformed TOML are configuration errors: ``CapturelintError`` with one line naming the
file, the key and what to write instead. (``ignore = []`` is allowed: it says that
nothing is ignored.) Files are read by ``capturelint.inputs``: a settings file
that is not a regular file, is larger than 4 MiB or nests deeper than 64 levels is
refused the same way.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path
from typing import Any, Sequence

from capturelint.common_options import ENGINE, SHARED
from capturelint.errors import CapturelintError
from capturelint.inputs import InputProblem, load_toml
from capturelint.options import CUDAGraphMode, EagerRegion, OptionSpec, Runner, Surface, parse_option
from capturelint.options import toml_kind

PYPROJECT = "pyproject.toml"


@dataclasses.dataclass(frozen=True)
class Settings:
    """The settings of one project; ``None`` for every key the file does not set.

    Values are parsed (``capturelint.options``: lists become tuples, runners, modes and
    the eager region their values); ``baseline`` and ``accept_findings`` are resolved
    against the directory of ``source``; ``source`` is the file read, or ``None``. ``family`` holds the engine
    families' own settings by option name (``(("kernels", "triton"),)``), ``engine_keys``
    the keys that configure an engine, as the file spells them, in its order.
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
    format: str | None = None
    engine: str | None = None
    jobs: int | None = None
    require_oracle: bool | None = None
    invariants: tuple[Any, ...] | None = None  # capturelint.invariants.Invariant, in file order
    family: tuple[tuple[str, Any], ...] = ()
    engine_keys: tuple[str, ...] = ()
    targets: tuple[str, ...] | None = None  # target specs, their file paths resolved against source's folder
    pythonpath: tuple[Path, ...] | None = None  # resolved against source's folder
    source: Path | None = None

    @property
    def root(self) -> Path | None:
        """The project root: the folder of the settings file (``None``: no file)."""
        return self.source.parent if self.source is not None else None

    def value(self, name: str) -> Any:
        """The engine family's setting ``name`` (its option's name), or ``None``."""
        return dict(self.family).get(name)


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


def load_settings(config: str | os.PathLike[str] | None = None, start: str | os.PathLike[str] | None = None,
                  specs: Sequence[OptionSpec] = ()) -> Settings:
    """Settings from ``config`` if given (it must exist and have the table), else from
    the nearest ``pyproject.toml`` with a ``[tool.capturelint]`` table above ``start``
    (default: the current directory), else empty ``Settings()``. ``specs``: the engine
    families' options, whose keys are read too (``capturelint.adapters.registry.
    load_settings`` passes them all)."""
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
        return _settings(path, table, specs)
    found = find_config(Path.cwd() if start is None else Path(start))
    if found is None:
        return Settings()
    path, table = found
    return _settings(path, table, specs)


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


def read_settings(path: str | os.PathLike[str], specs: Sequence[OptionSpec] = ()) -> Settings:
    """Settings of one file; a file without the table gives ``Settings(source=path)``."""
    path = Path(path)
    table = _table(path, _read_toml(path))
    return _settings(path, table or {}, specs)


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
            f"{shown(path)}: tool.capturelint must be a table, got {toml_kind(table)}; write [tool.capturelint] "
            "followed by key = value lines"
        )
    return table


_FIELDS = {"runner": "runners", "mode": "modes", "invariant_table": "invariants"}  # option name -> Settings field
_SETTINGS_FIELDS = {f.name for f in dataclasses.fields(Settings)}


def _settings(path: Path, table: dict[str, Any], specs: Sequence[OptionSpec] = ()) -> Settings:
    """The table's settings: each key's spec (shared or an engine family's), its value
    parsed by the one builder (``capturelint.options.parse_option``)."""
    where = shown(path)
    known = [s for s in (*SHARED, *specs) if s.key is not None]
    by_key = {key: spec for spec in known for key in (spec.key, *spec.aliases)}
    engine_names = {s.name for s in ENGINE} | {s.name for s in specs}
    values: dict[str, Any] = {}
    written: dict[str, str] = {}  # option name -> its key, as written
    for key, value in table.items():
        spec = by_key.get(key)
        if spec is None:
            keys = sorted({s.key for s in known if s.key})
            close = difflib.get_close_matches(key, sorted(by_key), n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise CapturelintError(f"{where}: [tool.capturelint] unknown key '{key}'; {hint}known keys: {', '.join(keys)}")
        if spec.name in written:
            raise CapturelintError(f"{where}: [tool.capturelint] {written[spec.name]} and {key} are one setting; keep "
                                   f"{spec.key}")
        written[spec.name] = key
        values[spec.name] = parse_option(dataclasses.replace(spec, key=key), value, Surface.SETTINGS, where)
    for name in ("baseline", "accept_findings"):  # relative to the file
        if name in values:
            values[name] = (path.resolve().parent / values[name]).resolve()
    if "engine" in values and "targets" in values:
        raise CapturelintError(f"{where}: [tool.capturelint] engine and targets both say what to check; keep targets "
                               "to check your engine, or engine for one of capturelint's (--engine NAME chooses one "
                               "on the command line)")
    directory = path.resolve().parent
    if "targets" in values:
        values["targets"] = tuple(resolve_spec(spec, directory) for spec in values["targets"])
    if "pythonpath" in values:
        values["pythonpath"] = tuple((directory / p).resolve() for p in values["pythonpath"])
        missing = [str(p) for p in values["pythonpath"] if not p.is_dir()]
        if missing:
            raise CapturelintError(f"{where}: [tool.capturelint] pythonpath names {missing[0]}, which is not a folder; "
                                   "list folders relative to this file (e.g. \"src\")")
    if "invariant_table" in values:
        from capturelint.invariants import parse_invariants  # parses without torch

        values["invariant_table"] = parse_invariants(where, "tool.capturelint.invariants", values["invariant_table"],
                                                     f"settings ({where})")
    fields = {_FIELDS.get(name, name): value for name, value in values.items()}
    family = tuple((name, value) for name, value in values.items() if _FIELDS.get(name, name) not in _SETTINGS_FIELDS)
    return Settings(**{k: v for k, v in fields.items() if k in _SETTINGS_FIELDS}, family=family,
                    engine_keys=tuple(key for name, key in written.items() if name in engine_names),
                    source=path.resolve())


def resolve_spec(spec: str, directory: Path) -> str:
    """A target spec with its file's path made absolute against ``directory``
    (``tests/t.py:targets``); a module's spec (``pkg.mod:targets``) is left as it is."""
    where, _, name = spec.rpartition(":")
    if not where.endswith(".py"):
        return spec
    return f"{(directory / where).resolve()}:{name}"


__all__ = ["PYPROJECT", "Settings", "find_config", "load_settings", "merge", "read_settings", "resolve_spec", "shown"]
