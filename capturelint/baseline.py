"""The pre-merge gate: a run against its baseline snapshot, and accepting a change.

``compare_report`` is ``check --baseline``: the run's region map against the
baseline's, with the eager-growth budget. ``update_snapshot`` is ``snapshot --update``:
it rewrites the baseline with the current recording and says what changed.

**The invariant users keep.** A baseline is only as good as its last review: when a
region change is intended, accept it with ``capturelint snapshot --update FILE`` and
commit the file with the change that caused it.

**``--update`` replaces only a snapshot.** A file that does not say it is a capturelint
snapshot (``pyproject.toml``, a truncated file whose format marker is lost) is refused,
untouched, before anything runs; a snapshot of another version, or one whose fields no
longer validate, is replaced (that is how a baseline is upgraded); an empty file or no
file is written.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from capturelint.errors import CapturelintError
from capturelint.inputs import InputProblem, read_bytes
from capturelint.lists import cut
from capturelint.region_changes import RegionChanges, compare_maps
from capturelint.report import Report
from capturelint.snapshot import RegionMap, load_snapshot, looks_like_snapshot, region_map, write_snapshot


def compare_report(snapshot: RegionMap, report: Report, plan: Any, max_growth_pct: float) -> RegionChanges:
    """The gate of ``check --baseline``: the run's regions against the baseline's."""
    return compare_maps(snapshot, region_map(report, plan), max_growth_pct)


def check_update_target(path: str) -> None:
    """Refuse a ``snapshot --update`` target that is not a snapshot (module docstring)."""
    p = Path(path)
    if p.is_dir():
        raise CapturelintError(f"snapshot --update {path}: it is a directory; name the snapshot file")
    if not p.exists():
        return
    if not p.is_file():
        raise CapturelintError(f"snapshot --update {path}: not a regular file; name the snapshot file")
    if _is_empty(p) or looks_like_snapshot(path):
        return
    raise CapturelintError(
        f"refusing to replace {path}: it is not a capturelint snapshot (no \"format\": \"capturelint-snapshot\" "
        f"marker), and --update would destroy it; name your snapshot file, or write a new one with "
        f"`capturelint snapshot -o FILE`"
    )


def _is_empty(p: Path) -> bool:
    """No file, or one that holds nothing but white space: nothing to lose."""
    try:
        return not read_bytes(p, 4096).strip()
    except InputProblem as e:
        if e.kind in ("missing", "too-large"):
            return e.kind == "missing"
        raise CapturelintError(f"snapshot --update {p} {e.problem}; check the path and its permissions") from None


@dataclasses.dataclass(frozen=True)
class SnapshotUpdate:
    """What ``snapshot --update`` did: the map written, the changes against the old
    file (``None`` when there was no readable old file), the configurations kept from
    the old file because this run did not record them, and why the old file was
    replaced without comparison (``None`` when it was read)."""

    written: RegionMap
    changes: RegionChanges | None
    kept: tuple[str, ...]
    unreadable: str | None
    created: bool

    def summary_line(self, path: str) -> str:
        if self.created:
            line = f"created {path}"
        elif self.unreadable is not None:
            line = f"replaced {path}, which could not be read ({self.unreadable})"
        else:
            line = f"updated {path}: " + (self.changes.summary_line() if self.changes else "regions unchanged")
        if self.kept:
            line += f"; kept from the old file (not run this time): {cut(list(self.kept))}"
        return line


def update_snapshot(path: str | Path, current: RegionMap) -> SnapshotUpdate:
    """Rewrite the snapshot at ``path`` with ``current`` (accepting every change).

    Configurations of the old file that this run did not record are kept when the old
    file was recorded with the same engine parameters, so ``--runner v2`` updates v2
    alone; with other parameters the file is replaced whole.
    """
    path = str(path)
    check_update_target(path)
    old: RegionMap | None = None
    unreadable: str | None = None
    created = _is_empty(Path(path))
    if not created:
        try:
            old = load_snapshot(path)
        except CapturelintError as e:
            unreadable = str(e).split("; ")[0].replace(f"snapshot {path} ", "")
    kept: tuple[str, ...] = ()
    merged = current
    if old is not None and old.engine == current.engine:
        run_keys = {c.key for c in current.configs}
        extra = [c for c in old.configs if c.key not in run_keys]
        if extra:
            kept = tuple(c.label for c in extra)
            configs = sorted(current.configs + tuple(extra), key=lambda c: c.order)
            merged = RegionMap(current.engine, tuple(configs))
    changes = compare_maps(old, merged) if old is not None else None
    write_snapshot(merged, path)
    return SnapshotUpdate(merged, changes, kept, unreadable, created)


__all__ = ["SnapshotUpdate", "check_update_target", "compare_report", "update_snapshot"]
