"""The values of the options that configure an engine, defined once, and what the
command line asks of an engine (``EngineOptions``).

- ``Runner``: the model runner, ``v1`` or ``v2`` (``--runner v1|v2|all``: ``all`` is
  every runner, ``parse_runners``);
- ``CUDAGraphMode``: the configured capture policy (``--mode``); ``CAPTURE_MODES`` are
  the ones that capture graphs, what a check runs by default;
- ``EagerRegion``: which part of the attention is an eager break (``--eager-region``);
- ``BreakOutputs``: what replay does with an eager break's return values
  (``--break-outputs``);
- ``parse_sizes``: ``--capture-sizes`` / ``--batch-sizes``, comma-separated counts.

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
from typing import Any, Iterable

from capturelint.errors import CapturelintError
from capturelint.runtime.protocol import BreakOutputs, CUDAGraphMode

DEFAULT_ENGINE = "bundled"
"""The engine ``--engine`` checks when neither it nor the settings name one; its name is
the one a region map leaves unwritten (``capturelint.snapshot``)."""

ENGINE_OPTIONS = ("--engine", "--runner", "--mode", "--eager-region", "--fresh-metadata", "--layers", "--steps", "--seed",
                  "--kernels", "--break-outputs", "--platform", "--no-reuse", "--spec", "--capture-sizes",
                  "--batch-sizes")
"""The options that configure capturelint's engines (``--jobs`` and ``--config`` apply to
every check). An adapter says which of them it reads (``Adapter.OPTIONS``); one given on
the command line that it does not read is an error, not ignored."""


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


# ------------------------------------------------------------ the request


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """The engine options of one command line, parsed; ``None`` (or ``()``) where not given.

    ``target`` is ``--target SPEC`` (the adapter for a user's engine); ``script`` is
    ``capturelint run SCRIPT.py [ARGS...]``'s script and its arguments (the script
    adapter); ``select`` and
    ``ignore`` the rule codes; ``invariants_file`` is ``--invariants FILE``;
    ``default_invariants=False`` leaves out the engine's own invariants; ``reuse`` is
    false with ``--no-reuse``; ``spec`` is ``--spec``'s speculative-decoding method
    (``mtp``, ``dspark``; None: none); ``given`` holds the engine options (``ENGINE_OPTIONS``)
    given on the command line, defaults left out, in the command's order.
    """

    engine: str | None = None
    target: str | None = None
    script: tuple[str, ...] | None = None
    runners: tuple[Runner, ...] = ()
    modes: tuple[CUDAGraphMode, ...] = ()
    eager_region: EagerRegion | None = None
    fresh_metadata: bool = False
    layers: int | None = None
    steps: int | None = None
    seed: int | None = None
    kernels: str | None = None
    break_outputs: BreakOutputs | None = None
    platform: str = "cuda"
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    invariants_file: str | None = None
    default_invariants: bool = True
    jobs: int | None = None
    reuse: bool = True
    spec: str | None = None
    given: tuple[str, ...] = ()
    capture_sizes: tuple[int, ...] = ()
    batch_sizes: tuple[int, ...] = ()

    @classmethod
    def of(cls, runner: str | None = None, modes: Iterable[str] = (), eager_region: str | None = None,
           break_outputs: str | None = None, **fields: Any) -> "EngineOptions":
        """Options from their spellings, as scripts write them (``runner="v1"``,
        ``modes=("PIECEWISE",)``), parsed as the command line parses them."""
        return cls(runners=parse_runners(runner) if runner is not None else (), modes=parse_modes(modes),
                   eager_region=parse_region(eager_region) if eager_region is not None else None,
                   break_outputs=parse_break_outputs(break_outputs) if break_outputs is not None else None, **fields)


__all__ = [
    "BreakOutputs", "CAPTURE_MODES", "CUDAGraphMode", "Choice", "DEFAULT_ENGINE", "ENGINE_OPTIONS", "EagerRegion",
    "EngineOptions", "Runner", "parse_break_outputs", "parse_modes", "parse_region", "parse_runners", "parse_sizes",
    "runners_text",
]
