"""The values of the options that configure an engine, defined once; options as specs
(``OptionSpec``) and the one builder of values from their spellings (``parse_option``);
and what a command asks of an engine (``EngineOptions``).

- ``Runner``: the model runner, ``v1`` or ``v2`` (``--runner v1|v2|all``: ``all`` is
  every runner, ``parse_runners``);
- ``CUDAGraphMode``: the configured capture policy (``--mode``); ``CAPTURE_MODES`` are
  the ones that capture graphs, what a check runs by default;
- ``EagerRegion``: which part of the attention is an eager break (``--eager-region``);
- ``BreakOutputs``: what replay does with an eager break's return values
  (``--break-outputs``);
- ``parse_sizes``: ``--capture-sizes`` / ``--batch-sizes``, comma-separated counts.

**Options as specs.** An option is an ``OptionSpec``: its name (the API's keyword), its
flag, its settings key (the flag's name), its parser, its help, its default and its help
group. The shared ones are ``capturelint.common_options``'; each engine family declares
its own (``capturelint.adapters.registry``). The command line, the settings reader, the
Python API and the pytest plugin all parse a spelled value with ``parse_option``, so
each value is parsed by one function and each error names the option as the place it
came from spells it (``--layers``, ``[tool.capturelint] layers``, ``layers``).

``CUDAGraphMode`` and ``BreakOutputs`` are the runtime's own values (the runtime imports
only torch): they are defined in ``capturelint.runtime.protocol`` and re-exported here.
The command line (click callbacks) and the settings file (``capturelint.settings``) parse
their strings into these values once, with the parsers below; everything downstream (the
plan, the engine's config, the runtime) holds the values. ``str()`` of a value is its
spelling on the command line. Nothing here imports more than the standard library,
``capturelint.errors`` and ``runtime.protocol``: the commands build their options before
anything heavy is loaded.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable, Iterable

from capturelint.errors import CapturelintError
from capturelint.runtime.protocol import BreakOutputs, CUDAGraphMode

DEFAULT_ENGINE = "bundled"
"""The engine ``--engine`` checks when neither it nor the settings name one; its name is
the one a region map leaves unwritten (``capturelint.snapshot``)."""

class Choice(enum.Enum):
    """An option value users type; ``str()`` is its spelling."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, text: Any) -> Any:
        """The member spelled ``text`` (any case), or ``None``."""
        if isinstance(text, cls):
            return text
        try:
            return cls(str(text).lower())
        except ValueError:
            return None

    @classmethod
    def spellings(cls) -> str:
        return ", ".join(m.value for m in cls)


class Runner(Choice):
    """Model runner: V1 (legacy persistent input buffers, metadata-less PIECEWISE
    capture) or V2 (capture always builds real metadata into persistent buffers)."""

    V1 = "v1"
    V2 = "v2"


class EagerRegion(Choice):
    """Which part of the attention is an eager break in a PIECEWISE capture.

    ``narrow``: only the sparse indexer and the attention kernel (after vLLM PR #51430);
    ``wide``: the whole input preparation plus attention (before #51430);
    ``per-runner``: each runner's own (the bundled engine: wide under V1, narrow under
    V2, vLLM PR #52401; vLLM: its attention's choice).
    """

    NARROW = "narrow"
    WIDE = "wide"
    PER_RUNNER = "per-runner"


CAPTURE_MODES = tuple(m for m in CUDAGraphMode if m is not CUDAGraphMode.NONE)
"""The modes that capture graphs, in report order: what a check runs by default."""


# ------------------------------------------------------------------ parsers


def parse_runners(text: str) -> tuple[Runner, ...]:
    """``v1`` -> (V1,), ``all`` -> every runner; a one-line error otherwise."""
    if text.lower() == "all":
        return tuple(Runner)
    runner = Runner.parse(text)
    if runner is None:
        raise CapturelintError(f"unknown runner {text!r}; use v1, v2 or all")
    return (runner,)


def parse_modes(texts: Iterable[str]) -> tuple[CUDAGraphMode, ...]:
    """Mode names (any case) -> modes; a one-line error naming the modes otherwise."""
    try:
        return tuple(CUDAGraphMode.parse(t) for t in texts)
    except ValueError as e:
        raise CapturelintError(str(e)) from None


def parse_region(text: str) -> EagerRegion:
    region = EagerRegion.parse(text)
    if region is None:
        raise CapturelintError(f"unknown eager region {text!r}; use narrow, wide or per-runner")
    return region


def parse_break_outputs(text: str) -> BreakOutputs:
    try:
        return BreakOutputs.parse(text)
    except ValueError as e:
        raise CapturelintError(f"--break-outputs: {e}") from None


def parse_sizes(option: str, text: str) -> tuple[int, ...]:
    """``2,4`` -> (2, 4): positive integers, comma-separated, for ``option``; a one-line
    error otherwise (the range each size may take is the engine's to check)."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        sizes = tuple(int(p) for p in parts)
    except ValueError:
        sizes = ()
    if not sizes or any(n < 1 for n in sizes):
        raise CapturelintError(f"{option} takes positive integers separated by commas (e.g. 2,4), got {text!r}")
    return sizes


def runners_text(runners: tuple[Runner, ...]) -> str:
    """How ``--runner`` says ``runners``: ``v1``, or ``all`` for every runner."""
    return "all" if set(runners) == set(Runner) and len(runners) > 1 else ",".join(map(str, runners))


# ------------------------------------------------------------ options as specs


class Kind(enum.Enum):
    """How an option takes its value."""

    VALUE = "value"  # one value: --layers 4
    SWITCH = "switch"  # on or off, no value on the command line: --fresh-metadata
    LIST = "list"  # repeatable and comma-separated on the command line: --mode PIECEWISE,FULL


class Surface(enum.Enum):
    """Where a value was spelled; errors name the option as it is spelled there."""

    COMMAND_LINE = "the command line"
    SETTINGS = "[tool.capturelint]"
    API = "the Python API"


class OptionProblem(ValueError):
    """Why a value is not one an option takes, raised by a spec's parser.

    ``text`` follows the option's name (``must be an integer from 1 to 256``; the value
    given is added after it, and in settings ``example``, a value that would do), or
    with ``alone`` is a sentence of its own (``unknown runner 'v3'; use v1, v2 or all``);
    ``got=False`` leaves the value out (``is an empty list; ...``)."""

    def __init__(self, text: str, example: str | None = None, alone: bool = False, got: bool = True):
        super().__init__(text)
        self.text, self.example, self.alone, self.got = text, example, alone, got


def _dashed(name: str) -> str:
    return name.replace("_", "-")


@dataclasses.dataclass(frozen=True)
class OptionSpec:
    """One option, declared once: everything the command line, the settings reader and the
    Python API need of it.

    - ``name``: the Python API's keyword and the value's name (``capture_sizes``);
    - ``parse(value)``: the value from a spelling (a string of the command line, a TOML
      value, an API argument: each parser says what it takes), or ``OptionProblem``;
    - ``help``, ``group``: the help text (its default said by ``default_text``, else
      ``default``) and the help section it is listed in;
    - ``flag``: the command-line flag (``--`` and the dashed name unless said; ``None``:
      none); ``short``: a one-letter flag too (``-j``); ``metavar``; ``number``: ``int``
      or ``float`` for a value the command line converts before ``parse``;
    - ``key``: the settings key (the flag's name unless said; ``None``: not a setting);
      ``aliases``: other keys and keywords read as this option (``runners``);
    - ``kind``: ``Kind.VALUE``, ``SWITCH`` or ``LIST``; a switch's flag gives
      ``switched`` (``--no-reuse``: ``reuse`` is False); ``default``: the value when
      nothing gives one (``None``: the engine decides);
    - ``spell(value)``: the value as the command line spells it (hints, titles);
    - ``owner``: the engine family that declared it (``None``: shared).
    """

    name: str
    parse: Callable[[Any], Any]
    help: str
    group: str
    flag: str | None = ""
    key: str | None = ""
    kind: Kind = Kind.VALUE
    metavar: str | None = None
    default: Any = None
    default_text: str | None = None
    aliases: tuple[str, ...] = ()
    short: str | None = None
    number: type | None = None
    switched: bool = True
    choices: tuple[str, ...] = ()
    spell: Callable[[Any], str] | None = None
    owner: str | None = None

    def __post_init__(self) -> None:
        if self.flag == "":
            object.__setattr__(self, "flag", "--" + _dashed(self.name))
        if self.key == "":
            object.__setattr__(self, "key", self.flag[2:] if self.flag else None)

    def named(self, surface: Surface) -> str:
        """The option as ``surface`` spells it: ``--capture-sizes``, ``capture-sizes``, ``capture_sizes``."""
        if surface is Surface.COMMAND_LINE and self.flag:
            return self.flag
        if surface is Surface.SETTINGS and self.key:
            return self.key
        return self.name

    def spelled(self, value: Any) -> str:
        """``value`` as the command line spells it."""
        return self.spell(value) if self.spell is not None else spelled(value)

    @property
    def help_text(self) -> str:
        """The help with its default, as ``--help`` shows it."""
        default = self.default_text if self.default_text is not None else (
            None if self.default is None or self.kind is Kind.SWITCH else self.spelled(self.default))
        return f"{self.help.rstrip('.')} (default: {default})." if default else self.help


def spelled(value: Any) -> str:
    """A parsed value as the command line spells it: ``all`` for every runner, a tuple
    comma-separated, an enum by its spelling."""
    if isinstance(value, tuple) and value and all(isinstance(v, Runner) for v in value):
        return runners_text(value)
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    return str(value)


def _shown(value: Any, surface: Surface) -> str:
    if surface is Surface.COMMAND_LINE:
        return spelled(value) if isinstance(value, (tuple, list)) else str(value)
    if surface is Surface.SETTINGS:
        return toml_kind(value)
    return repr(value)


def toml_kind(value: Any) -> str:
    """A TOML value as messages describe it: ``a string ('v1')``, ``a number (3)``."""
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


def option_error(spec: OptionSpec, surface: Surface, problem: OptionProblem, value: Any, where: str = "") -> str:
    """The one line of ``problem`` with ``value``, naming ``spec`` as ``surface`` spells it
    (``where``: the settings file, as messages name it)."""
    name = spec.named(surface)
    prefix = f"{where}: [tool.capturelint] " if surface is Surface.SETTINGS else ""
    if problem.alone:
        return f"{prefix}{name}: {problem.text}" if surface is not Surface.COMMAND_LINE else problem.text
    text = f"{prefix}{name} {problem.text}"
    if problem.got:
        text += f", got {_shown(value, surface)}"
    if surface is Surface.SETTINGS and problem.example is not None:
        text += f"; write for example {name} = {problem.example}"
    return text


def parse_option(spec: OptionSpec, value: Any, surface: Surface, where: str = "") -> Any:
    """The one builder of an option's value from its spelling, for every surface: ``value``
    parsed by ``spec``, or a ``CapturelintError`` of one line naming the option as
    ``surface`` spells it (``where``: the settings file)."""
    try:
        return spec.parse(value)
    except OptionProblem as problem:
        raise CapturelintError(option_error(spec, surface, problem, value, where)) from None


# ------------------------------------------------------------ parsers of spellings


def _texts(value: Any, what: str, example: str, names: str = "") -> list[str]:
    """A list option's items: a comma-separated string, or a list or tuple of them."""
    if isinstance(value, str):
        items = [p.strip() for p in value.split(",")]
        if not any(items):
            raise OptionProblem("names nothing; give a value or leave the option out", got=False)
        return [p for p in items if p]
    if isinstance(value, (list, tuple)):
        if not value:
            raise OptionProblem(f"is an empty list; list at least one {what}, or leave it out for the default",
                                got=False)
        out = []
        for item in value:
            if isinstance(item, enum.Enum):
                out.append(str(item.value))
            elif isinstance(item, str):
                out.extend(p.strip() for p in item.split(",") if p.strip())
            else:
                raise OptionProblem(f"must be a list of {what}s", example)
        return out
    if isinstance(value, enum.Enum):
        return [str(value.value)]
    raise OptionProblem(f"must be {names or 'a ' + what} or a list of them", example)


def runner_value(value: Any) -> tuple[Runner, ...]:
    """``--runner``: ``v1``, ``v2`` or ``all`` (comma-separated too), a list of them, or
    ``Runner`` values."""
    out: list[Runner] = []
    for text in _texts(value, "runner", '["v1", "v2"]', "v1, v2 or all"):
        if text.lower() == "all":
            out.extend(Runner)
            continue
        runner = Runner.parse(text)
        if runner is None:
            raise OptionProblem(f"unknown runner {text!r}; use v1, v2 or all", alone=True)
        out.append(runner)
    return tuple(dict.fromkeys(out))


def mode_value(value: Any) -> tuple[CUDAGraphMode, ...]:
    """``--mode``: mode names, any case, comma-separated or listed, or the values."""
    try:
        names = "a CUDA-graph mode (" + ", ".join(m.value for m in CUDAGraphMode) + ")"
        return tuple(dict.fromkeys(CUDAGraphMode.parse(t) for t in _texts(value, "mode", '["PIECEWISE"]', names)))
    except ValueError as e:
        if isinstance(e, OptionProblem):
            raise
        raise OptionProblem(str(e), alone=True) from None


def choice_value(kind: type[enum.Enum], what: str) -> Callable[[Any], Any]:
    """A parser of one ``kind`` (an enum whose values are its spellings), any case: a
    string, or the value itself."""
    values = tuple(str(m.value) for m in kind)

    def parse(value: Any) -> Any:
        if isinstance(value, kind):
            return value
        if isinstance(value, str):
            for member in kind:
                if str(member.value).lower() == value.lower():
                    return member
            raise OptionProblem(f"unknown {what} {value!r}; use {', '.join(values)}", alone=True)
        raise OptionProblem("must be one of " + ", ".join(f'"{v}"' for v in values), f'"{values[0]}"')

    return parse


def text_choice(choices: tuple[str, ...]) -> Callable[[Any], str]:
    """A parser of one of ``choices`` (strings), any case."""

    def parse(value: Any) -> str:
        if not isinstance(value, str) or value.lower() not in choices:
            raise OptionProblem("must be one of " + ", ".join(f'"{c}"' for c in choices), f'"{choices[0]}"')
        return value.lower()

    return parse


def switch_value(value: Any) -> bool:
    if not isinstance(value, bool):
        raise OptionProblem("must be true or false", "true")
    return value


def text_value(what: str, example: str) -> Callable[[Any], str]:
    """A parser of a non-empty string (a path, a name, a spec)."""

    def parse(value: Any) -> str:
        import os

        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str) or not value.strip():
            raise OptionProblem(f"must be {what} (a non-empty string)", example)
        return value

    return parse


def checked_int(problem_of: Callable[[object], str | None], example: str) -> Callable[[Any], int]:
    """A parser of an integer that ``problem_of`` (``capturelint.limits``) checks."""

    def parse(value: Any) -> int:
        problem = problem_of(value)
        if problem is not None:
            raise OptionProblem(problem, example)
        return value

    return parse


def sizes_value(value: Any) -> tuple[int, ...]:
    """``2,4``, ``[2, 4]``: positive integers (the range each may take is the engine's)."""
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",")]
        try:
            sizes = tuple(int(p) for p in parts)
        except ValueError:
            sizes = ()
    elif isinstance(value, (list, tuple)) and all(isinstance(n, int) and not isinstance(n, bool) for n in value):
        sizes = tuple(value)
    else:
        sizes = ()
    if not sizes or any(n < 1 for n in sizes):
        raise OptionProblem("takes positive integers separated by commas (e.g. 2,4)", "[2, 4]")
    return sizes


# ------------------------------------------------------------ the request


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """What one command asks of an engine, parsed; ``None`` (or ``()``) where not given.

    ``target`` is ``--target SPEC`` (the adapter for a user's engine); ``script`` is
    ``capturelint run SCRIPT.py [ARGS...]``'s script and its arguments (the script
    adapter); ``select`` and ``ignore`` the rule codes; ``invariants_file`` is
    ``--invariants FILE``; ``default_invariants=False`` leaves out the engine's own
    invariants; ``reuse`` is false with ``--no-reuse``. ``family`` holds the values of
    the engine families' own options given (``(("capture_sizes", (2, 4)),)``: each
    family reads its own, ``capturelint.adapters.registry``); ``given`` the names of the
    engine options given (shared ones such as ``runner`` and families' ones), in order,
    defaults left out, and ``surface`` where they were given (errors spell them so).
    """

    engine: str | None = None
    target: str | None = None
    targets: Any = None  # the Python API's targets=: Target objects, a function returning them, or specs
    script: tuple[str, ...] | None = None
    runners: tuple[Runner, ...] = ()
    modes: tuple[CUDAGraphMode, ...] = ()
    eager_region: EagerRegion | None = None
    layers: int | None = None
    steps: int | None = None
    seed: int | None = None
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    invariants_file: str | None = None
    default_invariants: bool = True
    jobs: int | None = None
    reuse: bool = True
    family: tuple[tuple[str, Any], ...] = ()
    given: tuple[str, ...] = ()
    surface: Surface = Surface.COMMAND_LINE

    def value(self, name: str, default: Any = None) -> Any:
        """The value of the family option ``name`` given, or ``default``."""
        return dict(self.family).get(name, default)


__all__ = [
    "BreakOutputs", "CAPTURE_MODES", "CUDAGraphMode", "Choice", "DEFAULT_ENGINE", "EagerRegion", "EngineOptions", "Kind",
    "OptionProblem", "OptionSpec", "Runner", "Surface", "checked_int", "choice_value", "mode_value", "option_error",
    "parse_break_outputs", "parse_modes", "parse_option", "parse_region", "parse_runners", "parse_sizes", "runner_value",
    "runners_text", "sizes_value", "spelled", "switch_value", "text_choice", "text_value", "toml_kind",
]
