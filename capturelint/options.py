"""What the command line asks of an engine, as values: ``EngineOptions``.

The commands read their engine options (``--engine --runner --mode --eager-region ...``)
into one ``EngineOptions``; the adapter registry (``capturelint.adapters.registry``)
resolves it over the settings into the plan of a check. Nothing here imports more than
the standard library: the commands build it before anything heavy is loaded.
"""

from __future__ import annotations

import dataclasses

DEFAULT_ENGINE = "bundled"
"""The engine ``--engine`` checks when neither it nor the settings name one; its name is
the one a region map leaves unwritten (``capturelint.snapshot``)."""

ENGINE_OPTIONS = ("--engine", "--runner", "--mode", "--eager-region", "--fresh-metadata", "--layers", "--steps", "--seed",
                  "--kernels", "--break-outputs", "--platform", "--no-reuse")
"""The options that configure capturelint's engines (``--jobs`` and ``--config`` apply to
every check). An adapter says which of them it reads (``Adapter.OPTIONS``); one given on
the command line that it does not read is an error, not ignored."""


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """The engine options of one command line; ``None`` (or ``()``) where not given.

    ``target`` is ``--target SPEC`` (the adapter for a user's engine); ``select`` and
    ``ignore`` the rule codes; ``invariants_file`` is ``--invariants FILE``;
    ``default_invariants=False`` leaves out the engine's own invariants; ``reuse`` is
    false with ``--no-reuse``; ``given`` holds the engine options (``ENGINE_OPTIONS``)
    given on the command line, defaults left out, in the command's order.
    """

    engine: str | None = None
    target: str | None = None
    runner: str | None = None
    modes: tuple[str, ...] = ()
    eager_region: str | None = None
    fresh_metadata: bool = False
    layers: int | None = None
    steps: int | None = None
    seed: int | None = None
    kernels: str | None = None
    break_outputs: str | None = None
    platform: str = "cuda"
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    invariants_file: str | None = None
    default_invariants: bool = True
    jobs: int | None = None
    reuse: bool = True
    given: tuple[str, ...] = ()


__all__ = ["DEFAULT_ENGINE", "ENGINE_OPTIONS", "EngineOptions"]
