"""Pinned reports: the bytes of the reports a user and CI read, kept under tests/data/pins.

``tests/test_report_pins.py`` runs each command below and compares its output file with
the pinned one byte for byte, so a refactoring that claims to keep behaviour (issue 17:
the adapter registry, the capture record, pure rules) proves it. A change that is meant
to alter a report updates the pins on purpose, and the diff shows what changed::

    PYTHONPATH=. python tests/pins.py --update      # rewrite tests/data/pins/*
    PYTHONPATH=. python tests/pins.py               # compare, print what differs

The commands are small versions of the README's (one layer, few steps) so the suite
stays fast; the full-size ones are compared by hand before such a change lands.
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PINS = ROOT / "tests" / "data" / "pins"


@dataclasses.dataclass(frozen=True)
class Pin:
    name: str  # the pinned file under tests/data/pins
    args: tuple[str, ...]  # capturelint's arguments, without -o
    status: int  # the exit status the command must end with
    vllm: bool = False


SMALL = ("--layers", "1", "--steps", "6")
PINNED = (
    Pin("bundled-all.json", ("check", "--runner", "all", *SMALL, "--format", "json"), 0),
    Pin("bundled-v1-narrow.sarif", ("check", "--runner", "v1", "--eager-region", "narrow", *SMALL, "--format", "sarif"), 1),
    Pin("bundled-snapshot.json", ("snapshot", "--runner", "all", *SMALL), 0),
    Pin("example-torch-graph.json", ("check", "--target", "examples/torch_cuda_graph.py:targets_stale", "--format", "json"), 1),
    Pin("example-torch-graph.sarif", ("check", "--target", "examples/torch_cuda_graph.py:targets_stale", "--format", "sarif"), 1),
    Pin("example-torch-graph-fixed.json", ("check", "--target", "examples/torch_cuda_graph.py:targets_fixed", "--format", "json"), 0),
    Pin("vllm.json", ("check", "--engine", "vllm", "--layers", "1", "--steps", "4", "--format", "json"), 0, vllm=True),
    Pin("vllm-v1-narrow.json", ("check", "--engine", "vllm", "--runner", "v1", "--eager-region", "narrow", "--layers", "1",
                                "--steps", "4", "--format", "json"), 1, vllm=True),
)


def produce(pin: Pin, folder: Path) -> tuple[int, bytes]:
    """Run ``pin``'s command in this process (from the repository root) into ``folder``;
    its exit status and the bytes it wrote."""
    import os

    from capturelint.cli import main

    out = folder / pin.name
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        status = main([*pin.args, "-o", str(out)])
    finally:
        os.chdir(here)
    return status, out.read_bytes() if out.exists() else b""


def _main(argv: list[str]) -> int:
    update = "--update" in argv
    differ = 0
    with tempfile.TemporaryDirectory() as tmp:
        for pin in PINNED:
            status, data = produce(pin, Path(tmp))
            if status != pin.status:
                print(f"{pin.name}: exit status {status}, pinned {pin.status}")
                differ += 1
                continue
            path = PINS / pin.name
            if update:
                PINS.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                print(f"wrote {path.relative_to(ROOT)} ({len(data)} bytes)")
            elif not path.exists() or path.read_bytes() != data:
                print(f"{pin.name}: differs from the pin")
                differ += 1
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
