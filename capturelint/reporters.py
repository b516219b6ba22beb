"""Every output format of every command, in one registry.

A *reporter* renders one subject of one command: the check ``Report`` (``check``), the
views of the captured regions (``show``), a ``RegionDiff`` (``diff``), a
``RegionMap`` (``snapshot``) or a ``SuggestReport`` (``suggest``). Its ``kind`` says how: ``rich`` draws on a Rich console
(a terminal, or a file at a fixed width), ``text`` returns a string, ``bytes`` returns
binary data (PNG), which only goes to a file. ``summary`` says whether the output ends
with the run's one-line summary; when it does not, the command says the summary on
stderr. ``preflight`` refuses, before the run, a format this machine cannot produce (the
formats drawn by Graphviz without its ``dot``): commands call ``Reporter.preflight``
before they run anything. ``captures`` says that the rendering draws the configurations'
capture streams, which a check otherwise drops as soon as each configuration is done
(they hold the engine's storages): the command keeps them for it.

``REPORTERS`` is the registry, ``formats(command)`` the names a command accepts (its
``--format`` choices), ``reporter(command, name)`` the one to use, and ``emit`` sends a
rendering to standard output or atomically to a file (``capturelint.output``). Commands
only adapt their arguments to these. A new format is one ``Reporter`` added here; its
renderer lives with the others (``capturelint.formats``, ``capturelint.render``).

Renderers are imported when a reporter runs, not when the registry is, so that
commands can list their formats without importing torch.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Any, Callable

from capturelint.errors import CapturelintError
from capturelint.output import file_console, is_stdout, stdout_console, write_file, write_stdout


@dataclasses.dataclass(frozen=True)
class Options:
    """What a command passes to its reporters (each uses what applies to it)."""

    verbose: bool = False  # check, rich: the concise report, then the evidence (every graph structure and finding)
    ops: bool = False  # show: expand scopes to their ops
    title: str | None = None  # diff, rich: the panel's title
    fallback_uri: str | None = None  # check, sarif: where findings without a source line point
    hint: str | None = None  # check, suggest, rich: the last line (the command that finds, or applies, the fix)
    rules: tuple[Any, ...] = ()  # check, sarif: the rule set (findings.RuleInfo) the log documents
    command: str = "check"  # check, html: the command its header names (run, merge)
    table: tuple[tuple[str, ...], list[tuple[str, ...]]] | None = None  # check, rich: an engine's table (columns, rows)


@dataclasses.dataclass(frozen=True)
class Reporter:
    """One output format of one command (see the module docstring)."""

    command: str
    name: str
    kind: str  # "rich", "text" or "bytes"
    render: Callable[..., Any]  # rich: (subject, console, options); text and bytes: (subject, options)
    summary: bool = False
    needs: Callable[[], None] | None = None  # raises a CapturelintError when the format cannot be made here
    captures: bool = False  # check: draws the capture streams

    def preflight(self) -> None:
        """Refuse, before a run, a format that cannot be made on this machine."""
        if self.needs is not None:
            self.needs()

    def text(self, subject: Any, options: Options) -> str | bytes:
        """The rendering as a file holds it (Rich at a fixed width, no colour)."""
        if self.kind == "rich":
            buffer = io.StringIO()
            self.render(subject, file_console(buffer), options)
            return buffer.getvalue()
        return self.render(subject, options)


def _dot(fmt: str) -> Callable[[], None]:
    """The preflight of a format drawn by Graphviz: its ``dot`` must be installed."""
    def needs() -> None:
        from capturelint.render.dot import require_dot

        require_dot(fmt)

    return needs


def _html_dot(alternative: str) -> Callable[[], None]:
    """The preflight of an HTML report (its diagrams are drawn by Graphviz)."""
    def needs() -> None:
        from capturelint.render.html import require_dot

        require_dot(alternative)

    return needs


# ------------------------------------------------------------------------- check


def _check_rich(report: Any, console: Any, options: Options) -> None:
    from capturelint.render.check import render_rich

    render_rich(report, console, options.verbose, options.table)
    if options.hint and report.findings:
        from rich.text import Text

        console.print(Text(options.hint, style="dim"), soft_wrap=True)


def _check_json(report: Any, options: Options) -> str:
    from capturelint.report import render_json

    return render_json(report)


def _check_sarif(report: Any, options: Options) -> str:
    from capturelint import __version__
    from capturelint.formats.sarif import to_sarif
    from capturelint.report import dumps_json

    # what each configuration checked (the JSON report's configurations[].checked), and a shard's identity
    properties: dict[str, Any] = {"checked": [{"runner": c.runner, "mode": c.mode, **c.checked.to_json()}
                                              for c in report.configs]}
    if report.subject is not None:  # what was checked: an engine, a project's targets
        properties["subject"] = report.subject
    if report.shard is not None:
        properties["shard"] = report.shard.to_json()
    if report.waivers is not None and not report.waivers.empty:  # what merge needs to judge the comments again
        properties["waivers"] = report.waivers.to_json()
    inline, accepted = report.waived_counts()
    if inline or accepted:
        properties["suppressed"], properties["accepted"] = inline, accepted
    return dumps_json(to_sarif(report.findings, list(options.rules), __version__, fallback_uri=options.fallback_uri,
                               run_properties=properties, waived=report.waived))


def _check_github(report: Any, options: Options) -> str:
    from capturelint.formats.github import to_github

    # a configuration that compared nothing is a warning, so a clean run does not read as a pass
    notices = [("findings accepted", f"{report.waived_text()}, not failed on: capturelint check --verbose or "
                                     "--format json lists each with the comment or file that accepts it")] if report.waived else []
    return to_github(report.findings, [(f"replay not compared with eager ({c.label})", c.unchecked_text())
                                       for c in report.not_compared], notices)


def _check_html(report: Any, options: Options) -> str:
    from capturelint.render.html import check_html

    return check_html(report, options.command)


# -------------------------------------------------------------------------- show


def _show_rich(views: Any, console: Any, options: Options) -> None:
    from capturelint.render.tree import render_tree

    render_tree(views, console, options.ops)


def _show_dot(views: Any, options: Options) -> str:
    from capturelint.render.dot import report_dot

    return report_dot(views, options.ops)


def _show_image(fmt: str) -> Callable[[Any, Options], bytes]:
    def render(views: Any, options: Options) -> bytes:
        from capturelint.render.dot import render_image

        return render_image(_show_dot(views, options), fmt)

    return render


def _show_svg(views: Any, options: Options) -> str:
    return _show_image("svg")(views, options).decode("utf-8")


def _show_html(views: Any, options: Options) -> str:
    from capturelint.render.html import show_html

    return show_html(views, options.ops)


# -------------------------------------------------------------------------- diff


def _diff_rich(diff: Any, console: Any, options: Options) -> None:
    from capturelint.render.changes import region_changes_panel

    console.print(region_changes_panel(diff.changes, options.title or "region changes"))


def _diff_dot(diff: Any, options: Options) -> str:
    from capturelint.render.dot import changes_dot

    return changes_dot(diff.pairs, diff.changes)


def _diff_image(fmt: str) -> Callable[[Any, Options], bytes]:
    def render(diff: Any, options: Options) -> bytes:
        from capturelint.render.dot import render_image

        return render_image(_diff_dot(diff, options), fmt)

    return render


def _diff_svg(diff: Any, options: Options) -> str:
    return _diff_image("svg")(diff, options).decode("utf-8")


def _diff_json(diff: Any, options: Options) -> str:
    from capturelint.report import dumps_json

    return dumps_json(diff.to_json())


def _diff_html(diff: Any, options: Options) -> str:
    from capturelint.render.html import diff_html

    return diff_html(diff, options.title or "region changes")


# ---------------------------------------------------------------------- snapshot


def _snapshot_json(rmap: Any, options: Options) -> str:
    return rmap.dumps()


# ----------------------------------------------------------------------- suggest


def _suggest_rich(report: Any, console: Any, options: Options) -> None:
    from capturelint.render.suggest import render_suggest

    render_suggest(report, console)
    if options.hint:
        from rich.text import Text

        console.print(Text(options.hint, style="dim"), soft_wrap=True)


def _suggest_json(report: Any, options: Options) -> str:
    from capturelint.report import dumps_json

    return dumps_json(report.to_json())


def _suggest_patch(report: Any, options: Options) -> str:
    return report.patch_text


REPORTERS: tuple[Reporter, ...] = (
    Reporter("check", "rich", "rich", _check_rich, summary=True),
    Reporter("check", "json", "text", _check_json),
    Reporter("check", "sarif", "text", _check_sarif),
    Reporter("check", "github", "text", _check_github),
    Reporter("check", "html", "text", _check_html, needs=_html_dot("--format json or sarif"), captures=True),
    Reporter("show", "rich", "rich", _show_rich, summary=True),
    Reporter("show", "dot", "text", _show_dot),
    Reporter("show", "svg", "text", _show_svg, needs=_dot("svg")),
    Reporter("show", "png", "bytes", _show_image("png"), needs=_dot("png")),
    Reporter("show", "html", "text", _show_html, needs=_html_dot("--format dot for the DOT text")),
    Reporter("diff", "rich", "rich", _diff_rich),
    Reporter("diff", "dot", "text", _diff_dot),
    Reporter("diff", "svg", "text", _diff_svg, needs=_dot("svg")),
    Reporter("diff", "png", "bytes", _diff_image("png"), needs=_dot("png")),
    Reporter("diff", "json", "text", _diff_json),
    Reporter("diff", "html", "text", _diff_html, needs=_html_dot("--format json or dot")),
    Reporter("snapshot", "json", "text", _snapshot_json),
    Reporter("suggest", "rich", "rich", _suggest_rich, summary=True),
    Reporter("suggest", "json", "text", _suggest_json),
    Reporter("suggest", "patch", "text", _suggest_patch),
)


def formats(command: str) -> tuple[str, ...]:
    """The format names of ``command``, in registry order (the first is the default)."""
    return tuple(r.name for r in REPORTERS if r.command == command)


def reporter(command: str, name: str) -> Reporter:
    for r in REPORTERS:
        if r.command == command and r.name == name:
            return r
    raise CapturelintError(f"{command} has no format {name!r}; use one of {', '.join(formats(command))}")


def emit(rep: Reporter, subject: Any, output: str | None, options: Options = Options()) -> None:
    """Render ``subject`` with ``rep`` to standard output (``output`` None or ``-``) or
    atomically to the file ``output``."""
    if not is_stdout(output):
        write_file(output, rep.text(subject, options))  # type: ignore[arg-type]
    elif rep.kind == "rich":
        rep.render(subject, stdout_console(), options)
    elif rep.kind == "bytes":
        raise CapturelintError(f"{rep.name.upper()} output is binary: name a file with -o FILE")
    else:
        text = rep.render(subject, options)
        write_stdout(text)


__all__ = ["Options", "REPORTERS", "Reporter", "emit", "formats", "reporter"]
