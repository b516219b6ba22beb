"""``--format html`` of check, show and diff: one self-contained page, read without a browser.

The page is parsed with ``html.parser``: it must reference nothing outside itself, carry
the verdict, what each configuration compared and its numbers, every finding (code,
message, ``path:line``, its source lines with the line marked, an anchor the table of
contents links to), an inline SVG diagram per configuration, and escape what it shows.
The bundled engine runs with 2 layers and 4 steps in PIECEWISE mode (runs shared through
the session memo); ``examples/plain/stale_holder.py`` is the bare-graph target.
"""

from __future__ import annotations

import dataclasses
import json
import re
from html import escape
from html.parser import HTMLParser
from pathlib import Path

import pytest

from capturelint import api
from capturelint.cli import main
from capturelint.options import BreakOutputs
from capturelint.report import finding_entries
from capturelint.reporters import Options, reporter
from capturelint.runtime.breakable import SegmentKind
from capturelint.snapshot import ConfigMap, EngineParams, GraphMap, RegionMap, SegmentMap

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ["--runner", "v1", "--mode", "PIECEWISE", "--layers", "2", "--steps", "4"]
STALE = str(ROOT / "examples" / "plain" / "stale_holder.py")


def run(args, capsys) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


class Page(HTMLParser):
    """Every start tag with its attributes, the text of ``<style>`` and the page's text."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.styles: list[str] = []
        self.text: list[str] = []
        self.doctype: list[str] = []
        self._in: list[str] = []
        self.feed(text)
        self.close()

    def handle_decl(self, decl):
        self.doctype.append(decl)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag in ("style", "script"):
            self._in.append(tag)

    def handle_endtag(self, tag):
        if self._in and self._in[-1] == tag:
            self._in.pop()

    def handle_data(self, data):
        if self._in and self._in[-1] == "style":
            self.styles.append(data)
        elif not self._in:
            self.text.append(data)

    def count(self, tag: str, **attrs: str) -> int:
        return sum(1 for t, a in self.tags if t == tag and all(a.get(k) == v for k, v in attrs.items()))


OUTSIDE = re.compile(r"^\s*(https?:|file:|//|ftp:|data:text/html)", re.I)


def assert_self_contained(text: str) -> Page:
    page = Page(text)
    assert page.doctype == ["DOCTYPE html"] and page.count("html") == page.count("body") == page.count("head") == 1
    for tag, attrs in page.tags:
        for name in ("src", "href", "xlink:href", "action", "data", "poster", "srcset"):
            value = attrs.get(name)
            assert value is None or not OUTSIDE.match(value), (tag, name, value)
        assert tag not in ("link", "iframe", "img", "object", "embed", "base"), tag
        assert not (tag == "script" and "src" in attrs)
        assert "url(" not in (attrs.get("style") or "")
    css = "".join(page.styles)
    assert "url(" not in css and "@import" not in css
    return page


def article(text: str, fid: str) -> str:
    start = text.index(f'<article class="finding" id="{fid}">')
    return text[start:text.index("</article>", start)]


def check_html(tmp_path, capsys, *args: str) -> tuple[int, str, str]:
    out = tmp_path / "report.html"
    rc, _, err = run(["check", *args, "--format", "html", "-o", str(out)], capsys)
    return rc, out.read_text(encoding="utf-8"), err


# ------------------------------------------------------------------------ check


def test_a_failing_check_is_one_page_with_every_finding_its_source_and_a_diagram(memo_runs, tmp_path, capsys):
    snap = tmp_path / "wide.json"
    assert run(["snapshot", *ENGINE, "--eager-region", "wide", "-o", str(snap)], capsys)[0] == 0
    narrow = [*ENGINE, "--eager-region", "narrow"]
    rc, _, _ = run(["check", *narrow, "--format", "json", "-o", str(tmp_path / "r.json")], capsys)
    doc = json.loads((tmp_path / "r.json").read_text())
    rc_html, text, err = check_html(tmp_path, capsys, *narrow, "--baseline", str(snap))
    assert rc == rc_html == 1
    page = assert_self_contained(text)
    # the verdict: the headline and the run's summary line
    summary = err.strip().splitlines()[-1]
    assert summary.startswith("4 findings") and escape(summary) in text
    assert '<header id="verdict" class="verdict fail">' in text
    assert "<h1>Replay differs from eager execution in v1/PIECEWISE: 4 findings in 2 problems</h1>" in text
    # the answer first: the verdict, the contents, the problems, what was compared; then diagrams and details
    order = [text.index(mark) for mark in ('<header id="verdict"', '<nav id="contents"', '<section id="findings">',
                                           '<section id="compared">', '<section id="regions">',
                                           '<section id="finding-details">')]
    assert order == sorted(order)
    nav = text[text.index('<nav id="contents"'):text.index("</nav>")]
    assert '<a href="#config-1" class="fail">v1/PIECEWISE (4 findings)</a>' in nav and 'href="#compared"' in nav
    assert '<details class="config" id="config-1" open>' in text  # the configuration with findings: its diagram shown
    # what was compared, with the JSON report's numbers
    [num] = doc["numerical"]
    row = text[text.index('<table class="compared">'):text.index("</table>")]
    assert "<th scope=\"row\">v1/PIECEWISE</th>" in row and "<td>yes</td>" in row
    assert f"<td>{num['token_agreement']:.2f}</td>" in row and f"<td>{num['max_step_error']:.3g}</td>" in row
    assert f"<td>{num['replay_steps']}</td>" in row and "<b>differs</b>" in row
    exercised = doc["configurations"][0]["checked"]["exercised"]
    assert exercised and f'<p class="exercised">exercised: {escape("; ".join(exercised))}</p>' in row
    # every finding, in the JSON's order: an anchor the table of contents links to
    assert len(finding_entries(doc)) == 4
    for i, f in enumerate(finding_entries(doc), 1):
        fid = f"finding-{i}"
        assert page.count("a", href=f"#{fid}") >= 2  # the table of contents and the finding's own anchor
        body = article(text, fid)
        frame = f["capture_frame"]
        where = f"{frame['file']}:{frame['line']}"
        assert f['code'] in body and escape(f["message"]) in body and f"<code>{escape(where)}</code>" in body
        # the source line, read from the file, marked among its neighbours
        line = (ROOT / frame["file"]).read_text().splitlines()[frame["line"] - 1]
        assert f'<mark class="line" data-n="{frame["line"]}">{escape(line)}\n</mark>' in body
        assert f'data-n="{frame["line"] - 1}"' in body and f'data-n="{frame["line"] + 1}"' in body
    # the problems first, as the terminal prints them: one per group, with its why and fix, linking its findings
    groups = sorted({f["group"] for f in finding_entries(doc)})
    assert len(groups) == 2 and page.count("li", **{"class": "problem"}) == len(groups)
    for gid in groups:
        start = text.index(f'<li class="problem" id="problem-{gid}">')
        li = text[start:text.index("</li>", start)]
        members = [i for i, f in enumerate(finding_entries(doc), 1) if f["group"] == gid]
        assert re.findall(r'href="(#finding-\d+)"', li) == [f"#finding-{i}" for i in members]
        assert "<b>why:</b>" in li and "<b>fix:</b>" in li
    # the verdict line says what was compared
    verdict = text[text.index('<header id="verdict"'):text.index("</header>")]
    assert "compared:" in verdict
    # one inline SVG diagram for the one configuration, its segments collapsible
    assert page.count("svg") == 1 and text.count("<svg") == 1
    assert page.count("details", **{"class": "segment captured"}) >= 2
    assert page.count("details", **{"class": "segment eager"}) >= 1
    # the region changes against the baseline
    changes = text[text.index('<section id="region-changes">'):]
    assert "eager ops per step" in changes and "moved to captured" in changes


def test_a_clean_compared_check_says_what_was_compared_and_lists_no_finding(memo_runs, tmp_path, capsys):
    rc, text, err = check_html(tmp_path, capsys, *ENGINE, "--eager-region", "wide")
    assert rc == 0, err
    page = assert_self_contained(text)
    assert "<h1>No findings: replay matches eager execution</h1>" in text
    assert '<details class="config" id="config-1">' in text  # no finding: the diagram is a click away, not open
    assert escape(err.strip().splitlines()[-1]) in text
    assert '<p class="none">No findings.</p>' in text and '<article class="finding"' not in text
    assert "<td>yes</td>" in text and "replay step" in text and "eager twin compared" in text
    assert page.count("svg") == 1


def test_a_clean_bare_graph_never_says_matches(tmp_path, capsys):
    rc, text, err = check_html(tmp_path, capsys, "--target", f"{STALE}:targets_fixed")
    assert rc == 0, err
    page = assert_self_contained(text)
    assert "matches" not in "".join(page.text)
    assert '<header id="verdict" class="verdict warn">' in text
    assert "NO (bare graph, no eager twin given)" in text and "replay NOT compared with eager" in text
    assert '<article class="finding"' not in text and page.count("svg") == 1


def test_same_command_same_bytes_to_a_file_and_to_stdout(tmp_path, capsys):
    args = ["--target", f"{STALE}:targets_bug"]
    rc1, first, _ = check_html(tmp_path, capsys, *args)
    rc2, second, _ = check_html(tmp_path, capsys, *args)
    rc3, out, _ = run(["check", *args, "--format", "html"], capsys)
    assert rc1 == rc2 == rc3 == 1
    assert first == second == out
    assert '<article class="finding" id="finding-1">' in first and "CL108" in first


def test_every_text_is_escaped():
    report = api.check(target=f"{STALE}:targets_bug")
    [f] = report.configs[0].findings
    hostile = dataclasses.replace(f, message='a <tag onload="x"> & \'this\'', scope="<top>", tensor="</pre><b>")
    report.configs[0].findings[0] = hostile
    text = reporter("check", "html").text(report, Options())
    page = assert_self_contained(text)
    assert escape('a <tag onload="x"> & \'this\'') in text and "&lt;top&gt;" in text and "&lt;/pre&gt;&lt;b&gt;" in text
    assert "<tag" not in text and "</pre><b>" not in text and page.count("tag") == 0
    # a report without capture streams (the API drops them) says why it has no diagram
    assert page.count("svg") == 0 and "no diagram: the report holds no capture stream to draw" in text


def test_run_html_draws_the_scripts_graph_and_shows_its_source(tmp_path, capsys):
    script = ROOT / "examples" / "plain" / "graphed_callable_baked_value.py"
    out = tmp_path / "run.html"
    rc, _, err = run(["run", "--format", "html", "-o", str(out), str(script)], capsys)
    assert rc == 1, err
    text = out.read_text()
    page = assert_self_contained(text)
    assert page.count("svg") == 1 and re.search(r"<h1>[^<]*\b\d+ findings? in \d+ problems?</h1>", text)
    assert '<p class="command">capturelint run</p>' in text and "<title>capturelint run</title>" in text
    body = article(text, "finding-1")
    number = int(re.search(r'<mark class="line" data-n="(\d+)">', body).group(1))
    line = script.read_text().splitlines()[number - 1]
    assert f'<mark class="line" data-n="{number}">{escape(line)}\n</mark>' in body
    assert f"graphed_callable_baked_value.py:{number}</code>" in body


# ------------------------------------------------------------------ show, diff


def test_show_html_draws_each_configuration_and_links_its_findings(memo_runs, tmp_path, capsys):
    out = tmp_path / "show.html"
    rc, _, err = run(["show", *ENGINE, "--eager-region", "narrow", "--format", "html", "-o", str(out)], capsys)
    assert rc == 0, err
    text = out.read_text()
    page = assert_self_contained(text)
    assert page.count("svg") == 1 and text.count('<article class="finding"') == 4
    assert all(page.count("a", href=f"#finding-{i}") >= 2 for i in range(1, 5))
    assert escape(err.strip().split("; wrote")[0]) in text  # the summary line of show


def SEG(kind: str, name: str | None, ops: dict[str, dict[str, int]]) -> SegmentMap:
    return SegmentMap(SegmentKind(kind), name, tuple((s, tuple(sorted(by.items()))) for s, by in ops.items()))


def test_diff_html_has_the_changes_and_a_diagram_per_pair(tmp_path, capsys):
    params = EngineParams(2, 4, 0, "torch", False, BreakOutputs.COPY)
    before = GraphMap("decode/4", "PIECEWISE", (SEG("captured", None, {"<lambda>": {"aten.mm.default": 2}}),
                                                 SEG("eager", "Attn.sparse", {"attn": {"aten.zero_.default": 1}})))
    after = GraphMap("decode/4", "PIECEWISE", (SEG("captured", None, {"<lambda>": {"aten.mm.default": 1}}),
                                                SEG("eager", "Attn.prepare", {"attn": {"aten.mm.default": 1,
                                                                                       "aten.zero_.default": 1}})))
    paths = []
    for name, graph in (("old.json", before), ("new.json", after)):
        path = tmp_path / name
        path.write_text(RegionMap(params, (ConfigMap("v1", "PIECEWISE", "narrow", (graph,)),
                                           ConfigMap("v2", "PIECEWISE", "narrow", (graph,)))).dumps())
        paths.append(str(path))
    out = tmp_path / "diff.html"
    rc, _, err = run(["diff", *paths, "--format", "html", "-o", str(out)], capsys)
    assert rc == 0, err
    text = out.read_text()
    page = assert_self_contained(text)
    assert page.count("svg") == 2  # one per pair of configurations
    assert escape(err.strip()) in text and "moved to eager" in text
    assert "&lt;lambda&gt;" in text and "<lambda>" not in text


# ------------------------------------------------------------- without Graphviz


@pytest.mark.parametrize("command", [
    ["check", *ENGINE],
    ["show", *ENGINE],
    ["diff", *ENGINE, "--against-eager-region", "wide"],
])
def test_without_dot_html_is_refused_before_the_run(command, tmp_path, capsys, monkeypatch):
    from capturelint.adapters import registry

    def ran(*a, **k):
        raise AssertionError("the engine ran")

    monkeypatch.setattr(registry, "run_check", ran)
    monkeypatch.setattr(registry, "record_regions", ran)
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    rc, out, err = run([*command, "--format", "html", "-o", str(tmp_path / "r.html")], capsys)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("capturelint: error: Graphviz 'dot' was not found on PATH")
    assert "install Graphviz" in err
    assert ("--format dot" if command[0] == "show" else "--format json") in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]
