"""``capturelint merge``: join the reports of the shards of one check (``check --shard
K/N``, ``capturelint.shard``) into the report one unsharded check would have written.

**Inputs.** Either JSON reports (``check --format json``) or SARIF logs (``check
--format sarif``), not both. Sharded reports must be the complete set of one check:
every shard 1..N exactly once, all with the same N and the same configuration list, each
holding the configurations its shard runs, all with the same fingerprint of the check
(``capturelint.shard``: options, settings, rules, invariants, engine, version; another
``--seed`` is another check). Unsharded reports (of checks of different runners, say)
may be merged too; then no configuration may be in two of them. Every
input must have been written by this capturelint version: the merged report is this
version's, and a report of another one may mean other rules or another format.

**JSON.** Each report is read back (``Report.from_json``), the configurations are put in
the order of the shards' configuration list (position i comes from shard ``i mod N +
1``; unsharded reports: in the order given), and the merged ``Report`` is rendered by the
check's reporters, so every format works: the JSON of all N shards' JSON reports is
byte-identical to the unsharded check's. Findings are sorted over the whole report, as
the check sorts them; the invariants' selected-op totals are added.

**SARIF.** One run: the rules' union (sorted by code, ``ruleIndex`` recomputed) and the
results in the check's order. The check sorts results by ``Finding.sort_key``, whose
first keys are runner and mode, and one configuration's results all come from one
report, so a stable sort of the inputs' results by runner and mode gives the unsharded
order. A problem found in configurations of several shards is one result of each; they
are joined into the first (counts added, ``members`` joined, the message's "Same cause
in N findings" said again), as the unsharded check writes one result a problem. The shard object leaves the run's properties; the configurations' ``checked``
records are joined in the merged configuration order, as the unsharded check lists them.

**Suppressions.** Each report carries the suppression comments its check read, with the
codes that matched a finding (JSON ``waivers``; SARIF: the run's ``properties``); the
merged report joins them and judges them again (``capturelint.acceptance.rejudge``):
a comment is unused when no shard used it, and only when the shards are of a check that
judges (``capturelint.waivers``), so the merged report is the unsharded check's.

**Exit status**, as ``check``'s: 1 when the merged report has findings, 0 otherwise.
Every problem with an input is one line naming the file (exit 2).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Sequence

from capturelint import __version__
from capturelint.acceptance import joined, rejudge
from capturelint.errors import CapturelintError
from capturelint.inputs import InputProblem, parse_json, read_text
from capturelint.lists import cut
from capturelint.limits import MAX_REPORT_BYTES
from capturelint.findings import Condition, Finding, graphs_text, same_cause_text
from capturelint.report import JSON_VERSION, Checked, ConfigReport, Report, not_compared_clause
from capturelint.shard import ShardInfo
from capturelint.waivers import Waivers

SARIF_VERSION = "2.1.0"


@dataclasses.dataclass(frozen=True)
class Input:
    """One file to merge: its path, its kind (``json`` or ``sarif``), the document, and
    its shard (``None``: an unsharded report)."""

    path: str
    kind: str
    doc: dict[str, Any]
    shard: ShardInfo | None


def read_input(path: str) -> Input:
    """Read and recognise one input; every failure is a one-line error naming the file."""
    try:
        doc = parse_json(read_text(path, MAX_REPORT_BYTES), path)
    except InputProblem as e:
        fix = {
            "missing": "name the reports of check --format json (or sarif)",
            "directory": "name report files",
            "special": "name report files",
            "encoding": "name the reports of check --format json (or sarif)",
            "too-large": "not a capturelint report",
            "nested": "not a capturelint report",
        }.get(e.kind, "check the path and its permissions")
        problem = f"is not JSON ({e.state})" if e.kind == "encoding" else e.problem
        raise CapturelintError(f"merge: {path} {problem}; {fix}") from None
    except ValueError as e:
        raise CapturelintError(f"merge: {path} is not JSON ({_one_line(e)}); name the reports of check --format json "
                               "(or sarif)") from None
    if isinstance(doc, dict) and doc.get("tool") == "capturelint":
        return _json_input(path, doc)
    if isinstance(doc, dict) and "runs" in doc and doc.get("version") == SARIF_VERSION:
        return _sarif_input(path, doc)
    what = "a capturelint snapshot, " if isinstance(doc, dict) and doc.get("format") == "capturelint-snapshot" else ""
    raise CapturelintError(f"merge: {path} is {what}not a capturelint check report; "
                           "name the reports of check --format json (or sarif)")


def _json_input(path: str, doc: dict[str, Any]) -> Input:
    if doc.get("version") != JSON_VERSION or doc.get("capturelint_version") != __version__:
        raise CapturelintError(
            f"merge: {path} is a report of format version {doc.get('version')!r} by capturelint "
            f"{doc.get('capturelint_version')!r}, and this is capturelint {__version__} (format version "
            f"{JSON_VERSION}); merge with the version that wrote the reports, or check again with this one"
        )
    if "region_changes" in doc:
        raise CapturelintError(f"merge: {path} holds a baseline gate's region changes, which merge cannot join; "
                               "merge reports of check without --baseline")
    try:
        shard = ShardInfo.from_json(doc["shard"]) if "shard" in doc else None
    except ValueError as e:
        raise _malformed(path, e) from None
    return Input(path, "json", doc, shard)


def _sarif_input(path: str, doc: dict[str, Any]) -> Input:
    try:
        runs = doc["runs"]
        if not isinstance(runs, list) or len(runs) != 1:
            raise ValueError("a capturelint SARIF log has exactly one run")
        driver = runs[0]["tool"]["driver"]
        if driver.get("name") != "capturelint":
            raise CapturelintError(f"merge: {path} is a SARIF log of {driver.get('name')!r}, not of capturelint; "
                                   "name the reports of check --format sarif")
        if driver.get("version") != __version__:
            raise CapturelintError(f"merge: {path} is a SARIF log of capturelint {driver.get('version')!r}, and this "
                                   f"is capturelint {__version__}; merge with the version that wrote it")
        props = runs[0].get("properties") or {}
        shard = ShardInfo.from_json(props["shard"]) if "shard" in props else None
        if not isinstance(runs[0]["results"], list) or not isinstance(driver["rules"], list):
            raise ValueError("results and rules must be lists")
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise _malformed(path, e) from None
    return Input(path, "sarif", doc, shard)


def _malformed(path: str, e: BaseException) -> CapturelintError:
    detail = f"field {e} is missing" if isinstance(e, KeyError) else _one_line(e)
    return CapturelintError(f"merge: {path} is not a well-formed capturelint report ({detail}); write it again "
                            "with capturelint check")


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


# -------------------------------------------------------------- completeness


def order(inputs: Sequence[Input], labels_of: Any) -> list[tuple[Input, int]]:
    """Check that ``inputs`` can be merged and return, in the merged order, each
    configuration as (input, its position in that input). ``labels_of(input)`` lists an
    input's configuration labels in its order (``None`` where the input does not say:
    unsharded SARIF)."""
    if not inputs:
        raise CapturelintError("merge: no report given; name the reports of the shards (e.g. shard-*.json)")
    kinds = {i.kind for i in inputs}
    if len(kinds) > 1:
        json_in = next(i.path for i in inputs if i.kind == "json")
        sarif_in = next(i.path for i in inputs if i.kind == "sarif")
        raise CapturelintError(f"merge: {json_in} is a JSON report and {sarif_in} a SARIF log; merge reports of "
                               "one format (JSON gives every output format)")
    sharded = [i for i in inputs if i.shard is not None]
    if sharded and len(sharded) != len(inputs):
        whole = next(i.path for i in inputs if i.shard is None)
        raise CapturelintError(f"merge: {sharded[0].path} is a shard (check --shard) and {whole} is not; merge either "
                               "the shards of one check or unsharded reports")
    if sharded:
        return _shard_order(inputs, labels_of)
    placed: list[tuple[Input, int]] = []
    seen: dict[str, str] = {}
    for i in inputs:
        labels = labels_of(i) or []
        for label in dict.fromkeys(labels):
            if label in seen:
                raise CapturelintError(f"merge: configuration {label} is in both {seen[label]} and {i.path}; merge "
                                       "reports of different configurations, or the shards of one check")
            seen[label] = i.path
        placed.extend((i, at) for at in range(len(labels)))
    return placed


def _shard_order(inputs: Sequence[Input], labels_of: Any) -> list[tuple[Input, int]]:
    first = inputs[0]
    assert first.shard is not None
    count, plan = first.shard.count, first.shard.configurations
    by_index: dict[int, Input] = {}
    for i in inputs:
        assert i.shard is not None
        if i.shard.count != count or i.shard.configurations != plan:
            what = (f"shard {i.shard.index}/{i.shard.count}" if i.shard.count != count
                    else "a shard of a check of other configurations")
            raise CapturelintError(f"merge: {i.path} is {what}, and {first.path} is shard {first.shard.index}/{count} "
                                   f"of {len(plan)} configurations; merge the shards of one check")
        if i.shard.check != first.shard.check:
            raise CapturelintError(
                f"merge: {i.path} is shard {i.shard.index}/{count} of another check than {first.path}: the two checks "
                "differ in options, settings, rules, invariants, engine or capturelint version, so their reports do not "
                "join into one check's; merge the shards of one check (the same command, with only --shard changed)"
            )
        if i.shard.index in by_index:
            raise CapturelintError(f"merge: shard {i.shard.index}/{count} is given twice ({by_index[i.shard.index].path}, "
                                   f"{i.path}); give each shard's report once")
        by_index[i.shard.index] = i
        labels = labels_of(i)
        if labels is not None and list(labels) != i.shard.expected:
            raise CapturelintError(f"merge: {i.path} holds configurations {', '.join(labels) or 'none'}, but shard "
                                   f"{i.shard.index}/{count} runs {', '.join(i.shard.expected)}; write it again with "
                                   "capturelint check --shard")
    missing = [k for k in range(1, count + 1) if k not in by_index]
    if missing:
        raise CapturelintError(
            f"merge: shard{'s' * (len(missing) > 1)} {cut([f'{k}/{count}' for k in missing])} missing: the check has {count} shards and {len(by_index)} "
            f"{'is' if len(by_index) == 1 else 'are'} given; merge the reports of all {count}"
        )
    return [(by_index[p % count + 1], p // count) for p in range(len(plan))]


# ---------------------------------------------------------------------- JSON


def _json_labels(i: Input) -> list[str]:
    try:
        return [f"{c['runner']}/{c['mode']}" for c in i.doc["configurations"]]
    except (KeyError, TypeError) as e:
        raise _malformed(i.path, e) from None


def merge_json(inputs: Sequence[Input]) -> Report:
    """The report of the unsharded check (module docstring)."""
    placed = order(inputs, _json_labels)
    reports: dict[str, Report] = {}
    for i in inputs:
        try:
            reports[i.path] = Report.from_json(i.doc)
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise _malformed(i.path, e) from None
    first = reports[inputs[0].path]
    for i in inputs[1:]:
        r = reports[i.path]
        if r.static != first.static:
            raise CapturelintError(f"merge: {i.path} and {inputs[0].path} differ in static mode (check --static); "
                                   "merge reports of one kind of check")
        if r.invariants != first.invariants:
            raise CapturelintError(f"merge: {i.path} and {inputs[0].path} hold different declared invariants; merge "
                                   "reports of checks with the same invariants in force")
        if r.subject != first.subject:
            raise CapturelintError(f"merge: {i.path} and {inputs[0].path} checked different things ({r.subject_text()}; "
                                   f"{first.subject_text()}); merge the reports of one engine or one project's targets")
    configs: list[ConfigReport] = [reports[i.path].configs[at] for i, at in placed]
    merged = Report(configs, invariants=first.invariants, static=first.static,
                    waivers=joined([reports[i.path].waivers for i in inputs]), subject=first.subject)
    rejudge(merged)  # the comments judged over every shard: as the unsharded check judges them
    return merged


# --------------------------------------------------------------------- SARIF


def _sarif_labels(i: Input) -> list[str] | None:
    """The labels of a SARIF input's configurations, where its shard object says them
    (else its ``checked`` records); the results must belong to them."""
    labels = [f"{p['runner']}/{p['mode']}" for p in (r.get("properties") or {} for r in _results(i))]
    if i.shard is None:
        # an unsharded log: the configurations it checked, else those its results name
        return [f"{c['runner']}/{c['mode']}" for c in _checked(i)] or list(dict.fromkeys(labels))
    expected = i.shard.expected
    stray = sorted(set(labels) - set(expected))
    if stray:
        raise CapturelintError(f"merge: {i.path} has results of {', '.join(stray)}, which shard "
                               f"{i.shard.index}/{i.shard.count} does not run; write it again with capturelint check --shard")
    return expected


def _results(i: Input) -> list[dict[str, Any]]:
    return i.doc["runs"][0]["results"]


def _checked(i: Input) -> list[dict[str, Any]]:
    """What each configuration of a SARIF input checked, in its configuration order."""
    return (i.doc["runs"][0].get("properties") or {}).get("checked", [])


def merge_sarif(inputs: Sequence[Input], render_result: Callable[[Finding, int], dict[str, Any]] | None = None
                ) -> dict[str, Any]:
    """One SARIF log of every input's results (module docstring); ``render_result``
    (the SARIF reporter's, handed in by the command: the check pipeline renders nothing)
    writes the results of the suppression comments judged over every input."""
    try:
        placed = order(inputs, _sarif_labels)
        checked = [_checked(i)[at] for i, at in placed] if all(_checked(i) for i in inputs) else []
        _checked_records(checked)  # the summary reads them: a malformed one is an input's fault, said here
        rules: dict[str, dict[str, Any]] = {}
        for i in inputs:
            for rule in i.doc["runs"][0]["tool"]["driver"]["rules"]:
                seen = rules.setdefault(rule["id"], rule)
                if seen != rule:
                    raise CapturelintError(f"merge: rule {rule['id']} differs between {i.path} and another input; "
                                           "merge the logs of one capturelint version")
        index = {code: n for n, code in enumerate(sorted(rules))}
        results = []
        for i in inputs:
            for r in _results(i):
                if r["ruleId"] not in index:
                    raise ValueError(f"result of rule {r['ruleId']} has no rule in the log")
                results.append(dict(r, ruleIndex=index[r["ruleId"]]))
        # the suppression comments' results are judged again over every input (a shard's say nothing of
        # unused comments, and each shard found the invalid ones its source held)
        waivers = joined([Waivers.from_json(p["waivers"]) if "waivers" in p else None
                          for p in ((i.doc["runs"][0].get("properties") or {}) for i in inputs)])
        if render_result is not None:
            results = [r for r in results if r["properties"]["condition"] != str(Condition.SUPPRESSION)]
            judged = Report([], waivers=waivers)
            rejudge(judged)
            for f in judged.suppression_findings:
                if f.code not in index:
                    raise ValueError(f"result of rule {f.code} has no rule in the log")
            results = [render_result(f, index[f.code]) for f in judged.suppression_findings] + results
        results.sort(key=lambda r: (r["properties"]["runner"], r["properties"]["mode"]))
        results = _joined_problems(results)
    except (KeyError, TypeError, AttributeError, IndexError) as e:
        raise CapturelintError(f"merge: a SARIF input is not a well-formed capturelint log ({_one_line(e)}); write "
                               "it again with capturelint check --format sarif") from None
    except ValueError as e:
        raise CapturelintError(f"merge: a SARIF input is not a well-formed capturelint log ({_one_line(e)})") from None
    log = dict(inputs[0].doc)
    run = dict(log["runs"][0])
    run["tool"] = dict(run["tool"], driver=dict(run["tool"]["driver"], rules=[rules[c] for c in sorted(rules)]))
    run["results"] = results
    properties = {k: v for k, v in (run.get("properties") or {}).items()
                  if k not in ("shard", "checked", "waivers", "suppressed", "accepted")}
    if checked:
        properties["checked"] = checked
    counts = [sum((i.doc["runs"][0].get("properties") or {}).get(k, 0) for i in inputs) for k in ("suppressed", "accepted")]
    if any(counts):
        properties["suppressed"], properties["accepted"] = counts
    if waivers is not None and not waivers.empty:
        properties["waivers"] = waivers.to_json()
    if properties:
        run["properties"] = properties
    else:
        run.pop("properties", None)
    log["runs"] = [run]
    return log


def _joined_problems(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One result per problem, as the unsharded check writes it: the results of one
    group (``properties.group``, waived alike) that several shards wrote, joined into
    the first (its configuration is the first in the check's order, so its finding is the
    group's first): ``count`` added up, ``members`` (per configuration; each is one
    shard's) joined, and the message's "Same cause in N findings" said again."""
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        by_key.setdefault((r["properties"]["group"], json.dumps(r.get("suppressions"), sort_keys=True)), []).append(r)
    out = []
    for r in results:
        same = by_key[(r["properties"]["group"], json.dumps(r.get("suppressions"), sort_keys=True))]
        if len(same) == 1:
            out.append(r)
        elif r is same[0]:
            members: dict[str, dict[str, Any]] = {}
            for other in same:
                members.update(_members(other["properties"]))
            labels = sorted(members, key=lambda label: label.rpartition("/")[::2])
            count = sum(o["properties"].get("count", 1) for o in same)
            message = r["message"]["text"].partition("\n\nSame cause in ")[0]
            said = same_cause_text(count, [s for label in labels for s in members[label]["scopes"]],
                                   graphs_text({label: members[label]["graphs"] for label in labels}))
            out.append({**r, "message": {**r["message"], "text": f"{message}\n\n{said}"},
                        "properties": {**r["properties"], "count": count,
                                       "members": {label: members[label] for label in labels}}})
    return out


def _members(p: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A result's ``members`` (``FindingGroup.members``): written for a group of several,
    said by its own properties for a group of one."""
    if "members" in p:
        return p["members"]
    return {f"{p['runner']}/{p['mode']}": {"findings": 1, "graphs": [p["graph"]] if p["graph"] else [],
                                            "scopes": [p["scope"]]}}


def _checked_records(checked: list[dict[str, Any]]) -> list[tuple[str, Checked]]:
    return [(f"{c['runner']}/{c['mode']}", Checked.from_json(c)) for c in checked]


def sarif_summary(log: dict[str, Any], inputs: int) -> tuple[int, str]:
    """The number of results of a merged SARIF log, and its one-line summary (which
    names the configurations whose replay was not compared with eager execution)."""
    by_code: dict[str, int] = {}
    for r in log["runs"][0]["results"]:
        by_code[r["ruleId"]] = by_code.get(r["ruleId"], 0) + 1
    n = sum(by_code.values())
    codes = ", ".join(f"{k} x{v}" for k, v in sorted(by_code.items()))
    head = f"{n} finding{'s' * (n != 1)} ({codes})" if n else "no findings"
    line = f"{head} in {inputs} merged SARIF log{'s' * (inputs != 1)}"
    records = _checked_records((log["runs"][0].get("properties") or {}).get("checked", []))
    uncompared = [(label, c) for label, c in records if c.replayed and not c.with_eager]
    if uncompared:
        line += "; " + not_compared_clause(uncompared, len(records))
    return n, line


__all__ = ["Input", "merge_json", "merge_sarif", "order", "read_input", "sarif_summary"]
