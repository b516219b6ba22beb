"""``capturelint show``, ``capturelint diff`` and ``capturelint snapshot``: where the
eager breaks sit, drawn, compared and recorded. The logic lives in
``capturelint.graph``, ``capturelint.snapshot``, ``capturelint.region_changes``,
``capturelint.baseline`` and the reporters (``capturelint.reporters``); these functions
adapt options to it."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from capturelint import api
from capturelint.adapters import registry
from capturelint.commands.common import (
    terminal_options,
    OTHER,
    REPORT,
    WHAT,
    GroupedCommand,
    ProgressReporter,
    SpecOption,
    command_options,
    engine_options,
    resolve_plan,
    say,
    settings_for,
    shared_options,
    spec_option,
)
from capturelint.common_options import BY_NAME
from capturelint.errors import EXIT_CLEAN, CapturelintError
from capturelint.options import Runner
from capturelint.output import check_output_path, is_stdout
from capturelint.reporters import Options, emit, formats, reporter

SHOW_FORMATS = formats("show")
DIFF_FORMATS = formats("diff")


# ------------------------------------------------------------------------- show

def _option(*decls: str, group: str = OTHER, **kw: Any) -> Any:
    """A command's own option, listed in ``--help`` under ``group``."""
    return click.option(*decls, cls=SpecOption, group=group, **kw)


@click.command(cls=GroupedCommand)
@shared_options("target")
@engine_options
@_option("--format", "fmt", type=click.Choice(SHOW_FORMATS), default="rich", show_default=True, group=REPORT,
         help="rich: a tree per runner and mode; dot: Graphviz text; svg, png: drawn by Graphviz 'dot'; html: one "
              "self-contained page with the diagrams and findings.")
@_option("-o", "--output", metavar="FILE", group=REPORT, help="Write to FILE instead of stdout (required for png).")
@_option("--ops", is_flag=True, group=REPORT, help="Expand module scopes to their ops, with source lines.")
@_option("--all-graphs", is_flag=True, group=REPORT, help="Show every captured graph, not one per runtime mode.")
@_option("--no-fold", is_flag=True, group=REPORT, help="Draw every layer; by default consecutive layers of the same "
         "structure (scopes, op counts, segments, findings) are drawn once, e.g. 'model.layers.0-3 (×4)'.")
@_option("--no-check", is_flag=True, group=WHAT, help="Record the captures only: faster, but no findings are marked.")
@terminal_options
def show(fmt: str, output: str | None, ops: bool, all_graphs: bool, no_fold: bool, no_check: bool, **kw: Any) -> int:
    """Show the regions of each runner and mode: captured segments and eager breaks in
    execution order, layer by layer, the module scopes in each with their op counts,
    and the findings in red (code, op, source line) where they occur.

    By default one graph per runtime mode stands for the others (they differ only in
    batch size), and consecutive layers of the same structure are drawn once
    (--no-fold draws each). Graphviz output runs top to bottom, one row per layer, with
    one cluster per segment piece (captured: blue, solid; eager: orange, dashed) and
    edges for tensors that cross segment boundaries.

    svg, png and html are drawn by Graphviz's 'dot': without it they are an error, before
    the run (--format dot writes the DOT text). Exit status: 0 shown (findings do not
    change it), 2 usage or engine error, 130 interrupted.
    """
    from capturelint.render.view import report_views

    if fmt == "png" and is_stdout(output):
        raise CapturelintError("PNG output is binary: name a file with -o FILE (or use --format svg or dot for stdout)")
    check_output_path(output)
    rep = reporter("show", fmt)
    rep.preflight()
    report = api.show_with(settings_for(kw), command_options(kw), no_check=no_check)
    views = report_views(report, all_graphs, fold=not no_fold)
    options = Options(ops=ops)
    emit(rep, views, output, options)
    if not rep.summary:
        from capturelint.render.tree import summary_line

        say(summary_line(views) + ("" if is_stdout(output) else f"; wrote {output}"))
    return EXIT_CLEAN


# ------------------------------------------------------------------------- diff

AGAINST = {  # diff's --against-* options: a shared option's spec, for the other side
    name: dataclasses.replace(BY_NAME[name], name=f"against_{name}", flag=f"--against-{BY_NAME[name].flag[2:]}",
                              key=None, group=WHAT, default=None, default_text=None, help=text)
    for name, text in (("runner", "Compare with this runner (other options equal)."),
                       ("mode", "Compare with these CUDA-graph modes, paired in order with --mode."),
                       ("eager_region", "Compare with this eager region."))
}


@click.command(cls=GroupedCommand)
@click.argument("snapshots", nargs=-1, metavar="[OLD.json [NEW.json]]", type=click.Path(dir_okay=False))
@shared_options("target")
@engine_options
@spec_option(AGAINST["runner"])
@spec_option(AGAINST["mode"])
@spec_option(AGAINST["eager_region"])
@_option("--against-fresh-metadata", is_flag=True, group=WHAT,
         help="Compare with V1 metadata builders allocating per step (--engine bundled).")
@_option("--format", "fmt", type=click.Choice(DIFF_FORMATS), default="rich", show_default=True, group=REPORT,
         help="rich: the changes in words; dot: Graphviz text, before and after side by side; svg, png: drawn by "
              "Graphviz 'dot'; json; html: one self-contained page.")
@_option("-o", "--output", metavar="FILE", group=REPORT, help="Write the report to FILE instead of stdout (required "
         "for png).")
@terminal_options
def diff(snapshots: tuple[str, ...], against_runner: tuple[Runner, ...] | None, against_mode: Any,
         against_eager_region: Any, against_fresh_metadata: bool, fmt: str, output: str | None, **kw: Any) -> int:
    """Compare two region recordings: ops that moved between captured and eager
    segments (by scope and op, with counts), segments added or removed, and the change
    in eager ops per step.

    The two sides are either two snapshot files (OLD.json NEW.json), a snapshot file
    and the current engine (OLD.json and engine options), or two configurations of the
    current engine: the engine options, and the same with the --against-* options
    (e.g. --eager-region narrow --against-eager-region wide). Configurations pair up by
    runner and mode, or in order when --against-* changes one of them. Captures are
    recorded without the shadow (fast).

    Exit status: 0 compared (changes do not change it), 2 usage, snapshot or engine error,
    130 interrupted.
    """
    from capturelint.region_changes import diff_by_key, diff_by_position
    from capturelint.snapshot import load_snapshot

    against = {
        "runner": against_runner,
        "mode": against_mode,
        "eager_region": against_eager_region,
        "fresh_metadata": against_fresh_metadata or None,
    }
    against = {k: v for k, v in against.items() if v}
    if len(snapshots) > 2:
        raise click.UsageError("diff takes at most two snapshot files (OLD.json NEW.json)")
    if snapshots and against:
        raise click.UsageError("--against-* options compare two engine configurations; they do not apply to snapshot files")
    if not snapshots and not against:
        raise click.UsageError("nothing to compare: give OLD.json NEW.json, OLD.json alone (against the engine), "
                               "or an --against-* option such as --against-eager-region wide")
    if fmt == "png" and is_stdout(output):
        raise CapturelintError("PNG output is binary: name a file with -o FILE (or use --format svg or dot for stdout)")
    check_output_path(output)
    rep = reporter("diff", fmt)
    rep.preflight()
    if len(snapshots) == 2:
        result = diff_by_key(load_snapshot(snapshots[0]), load_snapshot(snapshots[1]), snapshots[0], snapshots[1])
    else:
        settings = settings_for(kw)
        left = resolve_plan(settings, kw)
        if snapshots:
            before = load_snapshot(snapshots[0])  # fail on a bad file before running anything
            with ProgressReporter(len(left.configurations)) as progress:
                now = "the current targets" if left.sources else "the current engine"
                result = diff_by_key(before, registry.record_regions(left, progress), snapshots[0], now)
        else:
            right = resolve_plan(settings, {**kw, **against}, also_given=tuple(against))
            with ProgressReporter(len(left.configurations) + len(right.configurations)) as progress:
                if len(left.configurations) != len(right.configurations):
                    raise CapturelintError(
                        f"the two sides have {len(left.configurations)} and {len(right.configurations)} configurations, "
                        "so they cannot be paired; change one option at a time (e.g. --runner v1 --against-runner v2)"
                    )
                a, b = registry.record_regions(left, progress), registry.record_regions(right, progress)
                result = diff_by_position(a, b, _describe_side(kw), _describe_side({**kw, **against}))
    emit(rep, result, output, Options(title=_title(result.before, result.after)))
    if fmt != "rich":
        say(result.changes.summary_line())
    return EXIT_CLEAN


def _title(before: str, after: str) -> str:
    """``region changes: --eager-region narrow -> --eager-region wide (--runner v1)``:
    the options the sides share are said once."""
    a, b = before.split(" --"), after.split(" --")
    if before.startswith("--") and after.startswith("--"):
        common = [o for o in a if o in b]
        left = " --".join(o for o in a if o not in common)
        right = " --".join(o for o in b if o not in common)
        shared = " --".join(common)
        fix = lambda t: t if not t or t.startswith("--") else "--" + t  # noqa: E731
        return f"region changes: {fix(left) or 'defaults'} -> {fix(right) or 'defaults'}" + (f" ({fix(shared)})" if shared else "")
    return f"region changes: {before} -> {after}"


def _describe_side(kw: dict[str, Any]) -> str:
    from capturelint.commands.common import given_flags

    return " ".join(given_flags(kw, ("runner", "eager_region", "mode", "fresh_metadata"))) or "defaults"


# --------------------------------------------------------------------- snapshot

@click.command(cls=GroupedCommand)
@shared_options("target")
@engine_options
@_option("-o", "--output", metavar="FILE", group=REPORT,
         help="Write the snapshot to FILE (atomically, after the run; default: stdout).")
@_option("--update", metavar="FILE", group=REPORT, help="Rewrite the snapshot FILE with the current recording, "
         "accepting every change, and say what changed (a file that is not a snapshot is refused).")
@terminal_options
def snapshot(output: str | None, update: str | None, **kw: Any) -> int:
    """Record the region map of every runner and mode (default: runners v1 and v2, all
    four modes; a project's targets: each target, keyed by its spec, runner and mode) as
    a stable, reviewable JSON file: per graph, its segments in order (captured or eager
    break) and per module scope the count of each op.

    Use it as the baseline of `capturelint check --baseline FILE`; when a region change
    is intended, accept it with `capturelint snapshot --update FILE` and commit the file.
    Captures are recorded without the shadow (fast).

    Exit status: 0 written, 2 usage, snapshot or engine error, 130 interrupted.
    """
    from capturelint.baseline import check_update_target, update_snapshot

    if output and update:
        raise click.UsageError("-o and --update both name the file to write; use one")
    check_output_path(output)
    if update is not None:
        check_output_path(update, "--update")
        check_update_target(update)  # refuse a file that is not a snapshot before running anything
    settings = settings_for(kw)
    if kw.get("runner") is None and not settings.runners:
        kw = {**kw, "runner": tuple(Runner)}
    plan = resolve_plan(settings, kw)
    with ProgressReporter(len(plan.configurations)) as progress:
        rmap = registry.record_regions(plan, progress)
    n_graphs = sum(len(c.graphs) for c in rmap.configs)
    if update:
        result = update_snapshot(update, rmap)
        if result.changes is not None:
            emit(reporter("diff", "rich"), result, None)
        say(result.summary_line(update))
        return EXIT_CLEAN
    emit(reporter("snapshot", "json"), rmap, output)
    if not is_stdout(output):
        say(f"wrote {output}: {len(rmap.configs)} configurations, {n_graphs} graphs")
    return EXIT_CLEAN
