"""Applying inline suppressions and the accepted-findings file to a check's report.

``apply`` runs once a check's configurations have run (``capturelint.api.check_with``):
it reads the suppression comments of the source the check ran, moves the findings they
or the accepted-findings file accept to their configuration's ``waived`` list, runs the
suppression rules (CL902 unused, CL903 invalid) on the comments, and writes the
accepted-findings file where asked (a new file: the check's findings; ``update``: the
check's findings, keeping every entry a narrowed check cannot judge).
``rejudge`` does the last two steps again for a report joined from shards
(``capturelint merge``), whose comments' uses the shards recorded. The rules of what is
judged, and why, are ``capturelint.waivers``'.
"""

from __future__ import annotations

import dataclasses
import os

from capturelint.errors import CapturelintError
from capturelint.options import EngineOptions
from capturelint.output import check_output_path, write_file
from capturelint.report import Report
from capturelint.rules import BY_CODE, suppression_findings
from capturelint.sources import SourceFiles
from capturelint.waivers import (
    AcceptedEntry,
    SuppressionView,
    Waived,
    WaiverKind,
    Waivers,
    dump_accepted,
    find_suppressions,
    load_accepted,
    waive,
    with_checked,
)


@dataclasses.dataclass(frozen=True)
class Recorded:
    """What ``apply`` wrote to the accepted-findings file: ``path``, the entries it now
    holds, and whether it was new (else updated); ``kept`` counts the entries kept
    because this check cannot tell whether they still occur."""

    path: str
    entries: int
    new: bool
    kept: int = 0

    def message(self) -> str:
        """The line the command says on stderr."""
        if self.new:
            return (f"recorded {self.entries} finding{'s' * (self.entries != 1)} in {self.path}, which did not exist: "
                    f"this check accepts {'it' if self.entries == 1 else 'them'}, and later checks with "
                    f"--accept-findings {self.path} fail only on findings not in it; commit the file")
        kept = (f" ({self.kept} kept: this check cannot tell whether they still occur, as it ran part of the "
                "project's configurations or their rules had nothing to check)" if self.kept else "")
        return f"updated {self.path}: {self.entries} accepted finding{'s' * (self.entries != 1)}{kept}"


def accepted_path(option: str | None, setting: str | os.PathLike[str] | None) -> str | None:
    """The accepted-findings file in effect: ``--accept-findings`` over the setting."""
    if option is not None:
        if not option:
            raise CapturelintError("--accept-findings needs a file name, e.g. capturelint-accepted.json")
        return option
    return None if setting is None else str(setting)


def check_writable(path: str, update: bool, shard: bool) -> None:
    """Refuse, before a run, what would leave the accepted-findings file half-decided."""
    exists = os.path.exists(path)
    if shard and (update or not exists):
        what = "--update-accepted rewrites" if update else f"{path} does not exist, and recording it writes"
        raise CapturelintError(f"{what} one file for the whole check, and --shard runs part of it; record or update "
                               "it with a check without --shard")
    if exists and os.path.isdir(path):
        raise CapturelintError(f"--accept-findings: {path} is a directory; name a file")
    folder = os.path.dirname(os.path.abspath(path))
    if (update or not exists) and not os.path.isdir(folder):
        raise CapturelintError(f"--accept-findings: cannot write {path}: the folder {os.path.dirname(path) or folder} "
                               "does not exist; create it or choose another path")
    if update or not exists:  # it is written after the run: a folder that refuses files is refused now
        check_output_path(path, "--accept-findings")


def whole_check(options: EngineOptions, static: bool) -> bool:
    """Whether a check runs every configuration the project's check runs, so that it
    may call a suppression unused or an accepted finding gone (``capturelint.waivers``):
    no engine option given on the command line or to the API (each may leave out the
    configuration or the step that finds it), no ``--invariants`` file, not static. A
    shard is judged by ``merge``, not here."""
    return not static and not options.given and options.invariants_file is None


def apply(report: Report, codes: frozenset[str], *, whole: bool, accept_file: str | None = None,
          update: bool = False) -> Recorded | None:
    """Waive ``report``'s findings (module docstring), in place; ``codes`` are the
    rules selected, ``whole`` whether the check ran every configuration the project's
    check runs (``capturelint.waivers``). Returns what was written to the
    accepted-findings file, if anything."""
    exists = accept_file is not None and os.path.exists(accept_file)
    entries = load_accepted(accept_file) if accept_file is not None and exists else ()
    record = accept_file is not None and (update or not exists)
    owned = [(c, f) for c in report.configs for f in c.findings]
    frames = [frame for c in report.configs for frame in c.traced] + [fr for _, f in owned for fr in f.lines()]
    suppressions = find_suppressions(frames, frozenset(BY_CODE), SourceFiles())
    kept, waived, used, unmatched = waive([f for _, f in owned], suppressions, entries, accept_file)
    recorded: list[AcceptedEntry] = []
    if record:  # the file holds every finding no comment accepts: all of them accepted from now on
        assert accept_file is not None
        recorded = [AcceptedEntry.of(f) for f in kept] + [AcceptedEntry.of(w.finding) for w in waived
                                                          if w.kind is WaiverKind.ACCEPTED]
        waived += [Waived(f, WaiverKind.ACCEPTED, accept_file) for f in kept]
        kept = []
    owner = {id(f): c for c, f in owned}
    for c in report.configs:
        c.findings, c.waived = [], []
    for f in kept:
        owner[id(f)].findings.append(f)
    for w in sorted(waived, key=lambda w: w.finding.sort_key()):
        owner[id(w.finding)].waived.append(w)
    suppression_rules = {code for code in codes if "check_suppressions" in BY_CODE[code].hooks}
    checked = (report.checked_codes() | suppression_rules) & codes
    report.waivers = Waivers(with_checked(used, checked), accept_file, len(entries), unmatched, whole,
                             tuple(sorted(suppression_rules)))
    rejudge(report)
    if not record:
        return None
    assert accept_file is not None
    # an entry this check cannot tell is gone (a narrowed check, a rule that checked nothing) stays
    gone = {e.fingerprint for e in report.stale_accepted()}
    unjudged = tuple(e for e in unmatched if e.fingerprint not in gone)
    write_file(accept_file, dump_accepted(recorded + list(unjudged)))
    total = len({e.fingerprint for e in recorded + list(unjudged)})
    report.waivers = dataclasses.replace(report.waivers, accepted_entries=total, unmatched=unjudged)
    return Recorded(accept_file, total, not exists, len(unjudged))


def rejudge(report: Report) -> None:
    """The findings of the selected suppression rules on ``report``'s comments (CL902
    where the report judges, CL903), in place of those it had."""
    if report.waivers is None:
        report.suppression_findings = []
        return
    view = SuppressionView(report.waivers.suppressions, report.judged)
    report.suppression_findings = suppression_findings(view, frozenset(report.waivers.rules))


def joined(waivers: list[Waivers | None]) -> Waivers | None:
    """The waivers record of reports joined by ``merge`` (``Waivers.merged``)."""
    present = [w for w in waivers if w is not None]
    if not present:
        return None
    out = present[0]
    for w in present[1:]:
        out = out.merged(w)
    return out


__all__ = ["Recorded", "accepted_path", "apply", "check_writable", "joined", "rejudge", "whole_check"]
