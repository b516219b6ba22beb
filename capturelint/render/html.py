"""The HTML form of ``check``, ``show`` and ``diff``: one self-contained file.

A file to keep as a CI artifact or to link from a pull request: no network (CSS, the
little JavaScript and the diagrams' SVG are inline; no external ``src``, ``href`` or
``url()``), and the same command gives byte-identical HTML (no timestamps). A check
report holds, in order, so that the first screen answers (the verdict, the problems and
what was compared) and everything else is one click away:

- **the verdict**: a headline that never says "matches" about what was not compared
  (it follows ``Report.summary_line``; with findings, how many problems and where replay
  differs), the verdict line (what was compared) and the summary line itself;
- **the contents**: a link to each part below and to each configuration's diagram
  (those with findings named with their count);
- **the problems**: one entry per problem as the terminal prints them (``path:line:
  CODE``, why, fix), each linking its findings;
- **what was compared**: per runner and mode, the eager region, whether replay was
  compared with eager execution (and why not), what was checked, and the numerical
  evidence (token agreement, largest replay-vs-eager step error, eager-twin error);
- **the regions**: per runner and mode a ``<details>`` (open where it has findings)
  with the Graphviz diagram (``render.dot``, drawn by ``dot -Tsvg``) with zoom
  controls, and each shown graph's segments as ``<details>`` (scopes, op counts, links
  to the findings placed there); a link to a closed one opens it;
- **the findings one by one**: one ``<article id="finding-N">`` per finding
  (``report.html#finding-3`` opens on it) with its code, ``path:line``, message, and the
  source lines around each of its frames (read when the report is written, the frame's
  line highlighted);
- the findings suppressed or accepted, and **region changes** against a baseline
  (``check --baseline``).

The header names the command that made the report (``capturelint run`` for a script).
``show`` gives the regions alone, ``diff`` the region changes and a before/after
diagram per pair of configurations. Everything a reviewer needs works with
JavaScript off: the findings and diagrams are plain HTML and inline SVG, anchors are
plain links, segments are ``<details>``, zoom is radio buttons and CSS; the script only
adds drag-to-pan. Without Graphviz the HTML format is refused before the run
(``require_dot``), as SVG and PNG are.
"""

from __future__ import annotations

import dataclasses
import html
import io
import re
from typing import TYPE_CHECKING, Any

from capturelint import __version__
from capturelint.findings import Finding, FindingGroup, group_findings, group_id, where
from capturelint.runtime.protocol import Frame, SegmentKind
from capturelint.sources import SourceFiles

if TYPE_CHECKING:
    from capturelint.region_changes import RegionChanges, RegionDiff
    from capturelint.render.view import ConfigView
    from capturelint.report import ConfigReport, Report

CONTEXT = 3  # source lines shown on each side of a finding's line


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def require_dot(alternative: str) -> None:
    """Refuse, before a run, an HTML report that cannot draw its diagrams: the one-line
    error of ``--format svg`` (``DotMissing``), naming ``alternative`` as what to use."""
    from capturelint.render import dot

    try:
        dot.require_dot("html")
    except dot.DotMissing:
        raise dot.DotMissing("Graphviz 'dot' was not found on PATH, so the HTML report cannot draw its region diagrams; "
                             f"install Graphviz (e.g. apt install graphviz), or use {alternative}") from None


# ------------------------------------------------------------------- documents


def check_html(report: Report, command: str = "check") -> str:
    """The check report (see the module docstring); ``command`` names what made it in its
    header (``run`` for ``capturelint run``)."""
    from capturelint.render.view import report_views

    findings = report.findings
    ids = {id(f): f"finding-{i}" for i, f in enumerate(findings, 1)}
    headline, tone = _verdict(report)
    views = report_views(report)
    body = [
        _verdict_section(f"capturelint {command}", headline, tone, report.verdict_line(), report.summary_line()),
        _contents(report, views),
        _problems_section(findings, ids),
        _compared_section(report.configs, report.static),
        _regions_section(views, ids),
        _details_section(findings, ids, _Sources()),
        _waived_section(report),
    ]
    if report.region_changes is not None:
        body.append(_changes_section(report.region_changes, "Region changes against the baseline"))
    return _page(f"capturelint {command}", body)


def _contents(report: Report, views: list[ConfigView]) -> str:
    """The line under the verdict that puts every part one click away: the problems,
    what was compared, each configuration's diagram (those with findings first named
    with their count), the findings one by one."""
    links = [f'<a href="#findings">problems ({len(report.groups)})</a>' if report.findings else "",
             '<a href="#compared">what was compared</a>']
    diagrams = []
    for n, cv in enumerate(views, 1):
        count = f" ({len(cv.findings)} finding{'s' * (len(cv.findings) != 1)})" if cv.findings else ""
        tone = ' class="fail"' if cv.findings else ""
        diagrams.append(f'<a href="#config-{n}"{tone}>{esc(cv.runner)}/{esc(cv.mode)}{esc(count)}</a>')
    if diagrams:
        links.append("diagrams: " + ", ".join(diagrams))
    if report.findings:
        links.append(f'<a href="#finding-details">findings one by one ({len(report.findings)})</a>')
    if report.waived or report.stale_accepted():
        links.append('<a href="#suppressed">not failed on</a>')
    if report.region_changes is not None:
        links.append('<a href="#region-changes">region changes</a>')
    return '<nav id="contents" class="toc">' + " · ".join(t for t in links if t) + "</nav>"


def show_html(views: list[ConfigView], ops: bool = False) -> str:
    """The regions of ``show``: diagrams (``ops``: a node per op run), segments and the
    findings marked on them."""
    from capturelint.render.tree import summary_line

    findings = sorted((f for v in views for f in v.findings), key=Finding.sort_key)
    ids = {id(f): f"finding-{i}" for i, f in enumerate(findings, 1)}
    body = [
        _verdict_section("capturelint show", "Regions", "info", summary_line(views)),
        _findings_section(findings, ids, _Sources(), "No finding is marked on these regions (show --no-check checks "
                          "nothing)."),
        _regions_section(views, ids, ops, expand=True),
    ]
    return _page("capturelint show", body)


def diff_html(diff: RegionDiff, title: str) -> str:
    """A region diff: what moved, in words, and a before/after diagram per pair."""
    from capturelint.render.dot import changes_dot

    changes = diff.changes
    tone = "fail" if changes.failed else "warn" if changes.changed else "pass"
    headline = "Regions changed" if changes.changed else "No region change"
    diagrams = []
    for n, (pair, change) in enumerate(zip(diff.pairs, changes.configs), 1):
        one = dataclasses.replace(changes, configs=(change,))
        diagrams.append(f'<section class="config"><h3>{esc(change.label)}</h3>'
                        f"{_diagram(changes_dot([pair], one), f'd{n}')}</section>")
    body = [
        _verdict_section("capturelint diff", headline, tone, changes.summary_line()),
        _changes_section(changes, title),
        '<section id="regions"><h2>Regions, before and after</h2>' + "".join(diagrams) + "</section>",
    ]
    return _page("capturelint diff", body)


def _page(title: str, body: list[str]) -> str:
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + f'\n<footer>capturelint {esc(__version__)}</footer>\n<script>{SCRIPT}</script>\n</body>\n</html>\n'
    )


# --------------------------------------------------------------------- verdict


def _verdict(report: Report) -> tuple[str, str]:
    """The headline and its tone (``fail``, ``warn``, ``pass``), as ``summary_line`` says it:
    with findings, how many problems and where replay differs."""
    if report.findings:
        groups, n = report.groups, len(report.findings)
        counted = f"{n} finding{'s' * (n != 1)} in {len(groups)} problem{'s' * (len(groups) != 1)}"
        if report.diverged:
            labels = ", ".join(c.label for c in report.diverged)
            return f"Replay differs from eager execution in {labels}: {counted}", "fail"
        return counted[0].upper() + counted[1:], "fail"
    if report.failed:  # no finding: the baseline gate failed
        return "Regions changed beyond the baseline's budget", "fail"
    if report.diverged:
        return "Replay differs from eager execution", "fail"
    if report.waived:  # nothing fails, yet replay was not shown to match
        return f"No findings that fail the check ({report.waived_text()})", "warn"
    if report.static:
        return "No findings (static check: replay equivalence not checked)", "warn"
    if report.not_compared or any(not c.checked.replayed for c in report.configs):
        return "No findings, but replay was not compared with eager execution everywhere", "warn"
    return "No findings: replay matches eager execution", "pass"


def _verdict_section(command: str, headline: str, tone: str, *lines: str) -> str:
    summary = "".join(f'<p class="summary">{esc(line)}</p>' for line in lines if line)
    return (f'<header id="verdict" class="verdict {tone}"><p class="command">{esc(command)}</p>'
            f"<h1>{esc(headline)}</h1>{summary}</header>")


def _compared_section(configs: list[ConfigReport], static: bool) -> str:
    rows = []
    for c in configs:
        n = c.numerical
        if static or c.static:
            compared = "no (static: captures only)"
        elif c.checked.with_eager:
            compared = "yes"
        else:
            compared = f"NO ({c.checked.not_compared()})"
        notes = [t for t in (c.unchecked_text(), c.note) if t]
        exercised = (f'<p class="exercised">exercised: {esc(c.checked.exercised_text())}</p>'
                     if c.checked.exercised else "")
        if n is None:
            numbers = ['<td colspan="4" class="none">nothing compared numerically</td>']
        else:
            numbers = [
                f"<td>{_fmt(n.token_agreement, '.2f', 'no token output')}</td>",
                f"<td>{_fmt(n.max_step_error, '.3g')}</td>",
                f"<td>{_fmt(n.max_logit_error, '.3g', 'no eager twin')}</td>",
                f"<td>{n.replay_steps}</td>",
            ]
        bad = c.findings or c.diverged
        tone = "fail" if bad else "warn" if compared != "yes" else "pass"
        rows.append(
            f'<tr class="{tone}"><th scope="row">{esc(c.label)}</th><td>{esc(c.region_title)}</td>'
            f"<td>{esc(compared)}</td>{''.join(numbers)}"
            f"<td>{'<b>differs</b>' if c.diverged else 'no' if n is not None else ''}</td><td>{len(c.findings)}</td>"
            f"<td>{esc(c.checked.describe())}{exercised}"
            + "".join(f'<p class="note">{esc(t)}</p>' for t in notes) + "</td></tr>"
        )
    return (
        '<section id="compared"><h2>What was compared, and the numbers</h2>'
        '<table class="compared"><thead><tr><th>runner/mode</th><th>eager region</th>'
        "<th>replay compared with eager</th><th>token agreement</th><th>max step error</th><th>eager-twin error</th>"
        "<th>replay steps</th><th>diverged</th><th>findings</th><th>checked</th></tr></thead><tbody>"
        + "".join(rows) + "</tbody></table></section>"
    )


def _fmt(x: float | None, spec: str, absent: str = "") -> str:
    return esc(absent) if x is None else esc(format(x, spec))


# -------------------------------------------------------------------- findings


def _findings_section(findings: list[Finding], ids: dict[int, str], sources: _Sources, empty: str = "No findings.") -> str:
    """The problems, then every finding one by one (``show``: both in one place)."""
    return _problems_section(findings, ids, empty) + _details_section(findings, ids, sources)


def _problems_section(findings: list[Finding], ids: dict[int, str], empty: str = "No findings.") -> str:
    """One entry per problem, as the terminal prints it, each linking its findings."""
    if not findings:
        return f'<section id="findings"><h2>Findings</h2><p class="none">{esc(empty)}</p></section>'
    groups = group_findings(findings)
    problems = "".join(_problem(g, ids) for g in groups)
    count = f"{len(findings)} finding{'s' if len(findings) != 1 else ''} in {len(groups)} problem{'s' if len(groups) != 1 else ''}"
    return f'<section id="findings"><h2>Problems ({esc(count)})</h2><ol class="problems">{problems}</ol></section>'


def _details_section(findings: list[Finding], ids: dict[int, str], sources: _Sources) -> str:
    """Every finding one by one, with the source lines around its frames."""
    if not findings:
        return ""
    articles = "".join(_finding(f, ids[id(f)], sources, group_id(f)) for f in findings)
    return f'<section id="finding-details"><h2>Findings, one per location</h2>{articles}</section>'


def _problem(g: FindingGroup, ids: dict[int, str]) -> str:
    """One problem (a group of findings with one cause), as the terminal prints it:
    ``path:line: CODE what``, its why and fix, then a link to each of its findings."""
    parts = g.parts
    links = " ".join(f'<a href="#{ids[id(f)]}">{esc(f.scope)} · {esc(f.runner)}/{esc(f.mode)}</a>' for f in g.findings)
    return (f'<li class="problem" id="problem-{esc(g.id)}"><p class="line"><code>{esc(g.where)}</code>: '
            f'<b class="code">{esc(g.code)}</b> {esc(parts.what)}</p>'
            + (f'<p class="why"><b>why:</b> {esc(parts.why)}</p>' if parts.why else "")
            + (f'<p class="fix"><b>fix:</b> {esc(parts.fix)}</p>' if parts.fix else "")
            + f'<p class="members">{len(g.findings)} finding{"s" if len(g.findings) != 1 else ""}: {links}</p></li>')


def _finding(f: Finding, fid: str, sources: _Sources, group: str) -> str:
    what = f"{f.scope} · {f.op}" + (f" · {f.tensor}" if f.tensor else "")
    seen = ""
    if f.steps:
        seen = f"seen at replay steps {', '.join(map(str, f.steps))}" + (f" ({f.occurrences} times)" if f.occurrences > 1 else "")
    frames = [(f"line to change ({f.edit.role})", f.edit.frame)] if f.edit is not None else []
    frames += [(label, frame) for label, frame in (("capture", f.capture_frame), ("step", f.shadow_frame),
                                                   ("re-allocated at", f.allocation_frame))
               if f.edit is None or frame != f.edit.frame]
    return (
        f'<article class="finding" id="{fid}"><h3><a class="anchor" href="#{fid}">#</a> '
        f'<span class="code">{esc(f.code)}</span> {esc(f.name)} <span class="cond">[{esc(f.condition)}]</span></h3>'
        f'<p class="where"><code>{esc(where(f))}</code> · runner {esc(f.runner)} · {esc(f.mode)} · '
        f"segment {esc(f.segment)} ({esc(f.runtime_mode)}) · "
        f'problem <a href="#problem-{esc(group)}">{esc(group)}</a></p>'
        f'<p class="what">{esc(what)}</p><p class="message">{esc(f.message)}</p>'
        + (f'<p class="steps">{esc(seen)}</p>' if seen else "")
        + "".join(sources.excerpt(label, frame) for label, frame in frames if frame is not None)
        + "</article>"
    )


def _waived_section(report: Report) -> str:
    """The findings suppressed inline or accepted, each with what accepts it, and the
    accepted findings that no longer occur; empty when there are none."""
    stale = report.stale_accepted()
    if not report.waived and not stale:
        return ""
    items = "".join(f'<li><code>{esc(where(w.finding))}</code>: <b class="code">{esc(w.finding.code)}</b> '
                    f"{esc(w.finding.name)} · {esc(w.finding.scope)} · {esc(w.finding.runner)}/{esc(w.finding.mode)} "
                    f"<i>{esc(w.describe())}</i></li>" for w in report.waived)
    gone = "".join(f"<li>{esc(e.describe())}</li>" for e in stale)
    title = "; ".join(p for p in (report.waived_text(), f"{len(stale)} accepted no longer found" if stale else "") if p)
    return (f'<section id="suppressed"><h2>Not failed on ({esc(title)})</h2>'
            + (f'<ol class="suppressed">{items}</ol>' if items else "")
            + (f'<p>Accepted, no longer found (<code>--update-accepted</code> drops them):</p><ul>{gone}</ul>'
               if gone else "") + "</section>")


class _Sources(SourceFiles):
    """Source files read when the report is written (``capturelint.sources``): the
    lines around a frame's, with that line marked."""

    def excerpt(self, label: str, frame: Frame) -> str:
        head = f'<figcaption>{esc(label)}: <code>{esc(frame.location)}</code> in {esc(frame.function)}</figcaption>'
        lines = self.lines(frame)
        if isinstance(lines, str):
            return f'<figure class="source">{head}<p class="none">source not shown: {esc(lines)}</p></figure>'
        if not 1 <= frame.line <= len(lines):
            return (f'<figure class="source">{head}<p class="none">source not shown: the file has {len(lines)} lines '
                    "(changed since the run?)</p></figure>")
        first, last = max(1, frame.line - CONTEXT), min(len(lines), frame.line + CONTEXT)
        rows = []
        for n in range(first, last + 1):
            tag = "mark" if n == frame.line else "span"
            rows.append(f'<{tag} class="line" data-n="{n}">{esc(lines[n - 1])}\n</{tag}>')  # a block: its newline adds no line
        return f'<figure class="source">{head}<pre>{"".join(rows)}</pre></figure>'


# --------------------------------------------------------------------- regions


def _regions_section(views: list[ConfigView], ids: dict[int, str], ops: bool = False, expand: bool = False) -> str:
    """Per configuration its diagram and segments, in a ``<details>`` open where it has
    findings (``expand``: every one, as ``show`` draws them), so that a check of many
    configurations is not a page of diagrams; the contents link each."""
    from capturelint.render.dot import report_dot

    parts = []
    for n, cv in enumerate(views, 1):
        if cv.graphs:
            diagram = _diagram(report_dot([cv], ops), f"c{n}")
        elif cv.total_graphs:  # a report read back, or checked without keeping its captures
            diagram = '<p class="none">no diagram: the report holds no capture stream to draw</p>'
        else:
            diagram = '<p class="none">no graph captured: every step ran eagerly</p>'
        graphs = "".join(_graph_segments(cv, g, ids) for g in cv.graphs)
        unplaced = "".join(f'<li><a href="#{ids[id(f)]}">{esc(f.code)} {esc(f.condition)}</a> {esc(f.scope)} · '
                           f"{esc(f.op)} in {esc(f.segment)} (not in the shown graphs)</li>" for f in cv.unplaced)
        parts.append(
            f'<details class="config" id="config-{n}"{" open" if cv.findings or expand else ""}><summary><h3>{esc(cv.title)}</h3>'
            + (f' <span class="tag">{len(cv.findings)} finding{"s" * (len(cv.findings) != 1)}</span>' if cv.findings
               else "") + "</summary>"
            f'<p class="totals">{esc(cv.totals_line())}</p>'
            + (f'<p class="note">{esc(cv.note)}</p>' if cv.note else "")
            + diagram + graphs + (f'<ul class="unplaced">{unplaced}</ul>' if unplaced else "") + "</details>"
        )
    return '<section id="regions"><h2>Regions</h2>' + "".join(parts) + "</section>"


def _graph_segments(cv: ConfigView, view: Any, ids: dict[int, str]) -> str:
    """A shown graph's segments, each a ``<details>`` (open where a finding sits)."""
    from capturelint.render.view import finding_tag, scope_label, segment_title

    stands = f"; stands for {view.stands_for} graphs" if view.stands_for > 1 else ""
    out = [f'<div class="graph"><h4>graph {esc(view.graph)} ({esc(view.runtime_mode)}{esc(stands)}): segments</h4>']
    for ov in view.overview:
        seg = ov.segment
        kind = "eager" if seg.kind is SegmentKind.EAGER else "captured"
        here = [f for f in cv.findings if f.runtime_mode == view.runtime_mode and f.segment_index == seg.index]
        tags = view.marks.segment(seg.index)
        rows = []
        for sc in ov.scopes:
            marks = view.marks.scope(seg.index, sc.scope)
            ops = ", ".join(f"{op} ×{k}" for op, k in sc.by_op)
            marked_row = ' class="marked"' if marks else ""
            rows.append(f'<tr{marked_row}><td>{esc(scope_label(sc.scope))}</td><td>{sc.ops}</td>'
                        f"<td>{esc(ops)}</td><td>{esc(' '.join(marks))}</td></tr>")
        links = "".join(f'<li><a href="#{ids[id(f)]}">{esc(f.code)} {esc(f.name)}</a> {esc(f.scope)} · {esc(f.op)}</li>'
                        for f in here if id(f) in ids)
        summary = f"{segment_title(seg)} · {ov.ops} op{'s' * (ov.ops != 1)}"
        marked = sorted({finding_tag(f) for f in here} | set(tags))
        out.append(
            f'<details class="segment {kind}"><summary>{esc(summary)}'
            + (f' <span class="tag">{esc(", ".join(marked))}</span>' if marked else "") + "</summary>"
            + ("<table><thead><tr><th>scope</th><th>ops</th><th>by op</th><th>findings</th></tr></thead><tbody>"
               + "".join(rows) + "</tbody></table>" if rows else '<p class="none">(no ops)</p>')
            + (f'<ul class="here">{links}</ul>' if links else "") + "</details>"
        )
    return "".join(out) + "</div>"


_SVG_SIZE = re.compile(r'<svg width="([\d.]+)pt" height="([\d.]+)pt"')
_ZOOMS = (("fit", "fit"), ("1", "100%"), ("2", "200%"), ("4", "400%"))


def _diagram(dot_text: str, key: str) -> str:
    """The diagram drawn by Graphviz, inline: its SVG without the XML prolog and
    comments, ids prefixed with ``key`` (several diagrams share one document), in a
    scrolling canvas with zoom buttons (radio inputs and CSS: they work without
    JavaScript)."""
    from capturelint.render.dot import render_image

    svg = render_image(dot_text, "svg").decode("utf-8")
    svg = re.sub(r"<!--.*?-->\s*", "", svg[svg.index("<svg"):], flags=re.S)
    svg = re.sub(r'\sid="', f' id="{key}-', svg)
    size = _SVG_SIZE.search(svg)
    style = f' style="--w:{size.group(1)}pt;--h:{size.group(2)}pt"' if size else ""
    controls = "".join(
        f'<input type="radio" name="zoom-{key}" id="zoom-{key}-{z}" class="zoom-{z}"{" checked" if z == "fit" else ""}>'
        f'<label for="zoom-{key}-{z}">{label}</label>'
        for z, label in _ZOOMS
    )
    return f'<div class="diagram"{style}><span class="zoom-label">zoom</span>{controls}<div class="canvas">{svg}</div></div>'


# ---------------------------------------------------------------- region changes


def _changes_section(changes: RegionChanges, title: str) -> str:
    """The region changes as the terminal shows them (``render.changes``), in colour,
    without the panel's border (the section has the title)."""
    from rich.console import Console

    from capturelint.output import REPORT_WIDTH
    from capturelint.render.changes import region_changes_panel

    console = Console(record=True, file=io.StringIO(), width=REPORT_WIDTH, force_terminal=True, color_system="truecolor")
    console.print(region_changes_panel(changes, title).renderable)
    text = console.export_html(inline_styles=True, code_format="{code}")
    return f'<section id="region-changes"><h2>{esc(title)}</h2><pre class="rich">{text}</pre></section>'


# ------------------------------------------------------------------ style, script

CSS = """
:root{--fail:#b42318;--warn:#a15c07;--pass:#067647;--info:#3f6fa8;--line:#d0d5dd;--muted:#667085}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:0 auto;max-width:1400px;
 padding:0 1.5em 2em;color:#101828}
code,pre{font-family:ui-monospace,"SFMono-Regular",Menlo,Consolas,monospace;font-size:12.5px}
h2{border-bottom:1px solid var(--line);padding-bottom:.2em;margin-top:1.6em}
.verdict{border-left:8px solid;padding:.6em 1em;margin:1em 0;background:#f9fafb}
.verdict h1{margin:.1em 0;font-size:1.6em}.verdict .command{margin:0;color:var(--muted)}
.verdict.fail{border-color:var(--fail)}.verdict.fail h1{color:var(--fail)}
.verdict.warn{border-color:var(--warn)}.verdict.warn h1{color:var(--warn)}
.verdict.pass{border-color:var(--pass)}.verdict.pass h1{color:var(--pass)}
.verdict.info{border-color:var(--info)}
table{border-collapse:collapse;margin:.4em 0}th,td{border:1px solid var(--line);padding:.25em .5em;text-align:left;
 vertical-align:top}thead th{background:#f2f4f7}
tr.fail th{color:var(--fail)}tr.warn th{color:var(--warn)}tr.pass th{color:var(--pass)}
.note{color:var(--warn);margin:.3em 0 0}.exercised{margin:.3em 0 0}.none{color:var(--muted)}
.toc{margin:.4em 0 1em;color:var(--muted)}.toc a{text-decoration:none}.toc a.fail{color:var(--fail)}
.problems{padding-left:1.5em}.problem{margin:.2em 0 1em}.problem p{margin:.15em 0}.problem .code{color:var(--fail)}
.problem:target{background:#fef3f2}.problem .members a{margin-right:.6em}
.finding{border:1px solid var(--line);border-left:5px solid var(--fail);border-radius:4px;padding:.3em 1em .6em;
 margin:1em 0;scroll-margin-top:1em}
.finding:target{box-shadow:0 0 0 3px #fda29b}
.finding h3{margin:.4em 0}.finding .code{color:var(--fail)}.cond{color:var(--muted);font-weight:normal}
.anchor{color:var(--muted);text-decoration:none}.where,.what{margin:.2em 0}.message{margin:.5em 0}
.steps{color:var(--muted);margin:.2em 0}
figure.source{margin:.5em 0}figure.source pre{background:#f8f9fb;border:1px solid var(--line);padding:.4em 0;
 margin:.2em 0;overflow-x:auto}
.source .line{display:block;padding:0 .8em}.source .line::before{content:attr(data-n);display:inline-block;width:4.5em;
 color:var(--muted);user-select:none}
.source mark.line{background:#fff3c4;font-weight:bold;color:inherit}
details.config{border:1px solid var(--line);border-radius:4px;padding:.2em 1em;margin:1em 0}
details.config>summary h3{display:inline;margin:0}summary{cursor:pointer}
.diagram{margin:.5em 0}.diagram input{margin-left:.8em}.zoom-label{color:var(--muted)}
.canvas{overflow:auto;max-height:80vh;border:1px solid var(--line);margin-top:.3em;background:#fff}.js .canvas{cursor:grab}
.zoom-fit:checked~.canvas svg{width:min(100%,var(--w));height:auto}
.zoom-1:checked~.canvas svg{width:var(--w);height:var(--h)}
.zoom-2:checked~.canvas svg{width:calc(var(--w)*2);height:calc(var(--h)*2)}
.zoom-4:checked~.canvas svg{width:calc(var(--w)*4);height:calc(var(--h)*4)}
.canvas svg{display:block}
details.segment{margin:.2em 0 .2em 1em}details.segment>summary{padding:.1em .3em}
details.segment.captured>summary{background:#e6f0fb}details.segment.eager>summary{background:#fde7c9}
.tag{color:var(--fail);font-weight:bold}tr.marked td:first-child{color:var(--fail)}
pre.rich{white-space:pre-wrap;background:#f8f9fb;border:1px solid var(--line);padding:.5em}
footer{margin-top:2em;color:var(--muted)}
"""

SCRIPT = """
document.documentElement.className = 'js';
function openTarget() {  // a link to a collapsed diagram (or into it) opens it
  var t = location.hash && document.getElementById(decodeURIComponent(location.hash.slice(1)));
  var shown = t;
  for (; t; t = t.parentElement) { if (t.tagName === 'DETAILS' && !t.open) { t.open = true; } }
  if (shown) { shown.scrollIntoView(); }
}
window.addEventListener('hashchange', openTarget);
openTarget();
document.querySelectorAll('.canvas').forEach(function (c) {
  var drag = null;
  c.addEventListener('mousedown', function (e) {
    drag = {x: e.clientX, y: e.clientY, left: c.scrollLeft, top: c.scrollTop}; c.style.cursor = 'grabbing';
    e.preventDefault();
  });
  window.addEventListener('mousemove', function (e) {
    if (drag) { c.scrollLeft = drag.left - (e.clientX - drag.x); c.scrollTop = drag.top - (e.clientY - drag.y); }
  });
  window.addEventListener('mouseup', function () { drag = null; c.style.cursor = ''; });
});
"""


__all__ = ["check_html", "diff_html", "require_dot", "show_html", "where"]
