"""``capturelint engine``: run the bundled engine, the laboratory of the DeepSeek V4 case.

The command functions only turn options into an ``EngineConfig`` and hand it to
``capturelint.engine.llm``; everything else lives there. Errors are raised as
``CapturelintError`` or click usage errors, which ``capturelint.cli.main`` prints as one
line with exit status 2.
"""

from __future__ import annotations

import json

import click

from capturelint.engine.config import EngineConfig, Kernels, Platform
from capturelint.errors import CapturelintError
from capturelint.options import BreakOutputs, CUDAGraphMode, EagerRegion, Runner
from capturelint.runtime.breakable import GraphBackend
from capturelint.engine.llm import EQUAL_LOGIT_TOLERANCE, TwinReport, run_with_eager_twin


def _choice(values) -> click.Choice:
    return click.Choice([str(v) for v in values], case_sensitive=False)


def _parse_sizes(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        sizes = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers, e.g. 1,2,4,8") from None
    return sizes


@click.group(name="engine")
def engine_group() -> None:
    """Run the bundled miniature DeepSeek V4 serving engine."""


@engine_group.command(name="run")
@click.option("--runner", type=_choice(Runner), default=None, help="Model runner [default: the platform's].")
@click.option("--mode", type=_choice(CUDAGraphMode), default=str(CUDAGraphMode.FULL_AND_PIECEWISE), show_default=True, help="CUDA-graph mode.")
@click.option("--eager-region", type=_choice(EagerRegion), default=str(EagerRegion.PER_RUNNER), show_default=True, help="Attention eager region of PIECEWISE graphs.")
@click.option("--fresh-metadata", is_flag=True, help="V1 metadata builders allocate new tensors every step.")
@click.option("--layers", type=int, default=EngineConfig.num_layers, show_default=True, help="Decoder layers.")
@click.option("--steps", type=int, default=EngineConfig.steps, show_default=True, help="Engine steps (one token per running request each).")
@click.option("--seed", type=int, default=EngineConfig.seed, show_default=True, help="Seed of weights and workload.")
@click.option("--kernels", type=_choice(Kernels), default=str(Kernels.TORCH), show_default=True, help="Kernel implementation.")
@click.option("--platform", type=_choice(Platform), default=str(Platform.CUDA), show_default=True, help="Platform (selects the default runner).")
@click.option("--capture-sizes", callback=_parse_sizes, default=None, help="Comma-separated padded sizes that get a graph [default: 1,2,4,8,16,32].")
@click.option("--max-num-seqs", type=int, default=EngineConfig.max_num_seqs, show_default=True, help="Requests running at once.")
@click.option("--graph-backend", type=_choice(GraphBackend), default=str(GraphBackend.EMULATED), show_default=True, help="Graph backend (cuda needs a GPU).")
@click.option("--copy-break-outputs/--no-copy-break-outputs", "break_outputs", default=True, show_default=True,
              callback=lambda ctx, param, copy: BreakOutputs.COPY if copy else BreakOutputs.DISCARD,
              help="Copy eager-break return values back on replay.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def run_command(
    runner: str | None,
    mode: str,
    eager_region: str,
    fresh_metadata: bool,
    layers: int,
    steps: int,
    seed: int,
    kernels: str,
    platform: str,
    capture_sizes: tuple[int, ...] | None,
    max_num_seqs: int,
    graph_backend: str,
    break_outputs: BreakOutputs,
    as_json: bool,
) -> None:
    """Run a configuration and its eager twin and compare them.

    The twin is the same configuration with CUDA graphs off (same seed, same workload).
    Reports the fraction of generated tokens that agree, the largest logit difference
    over the steps whose inputs were still identical, and how many graphs and eager
    breaks were captured. Under V1, PIECEWISE with the narrow eager region is the
    DeepSeek V4 failure: try --runner v1 --mode PIECEWISE --eager-region narrow.
    """
    options = dict(
        runner=runner,
        cudagraph_mode=mode,
        eager_region=eager_region,
        fresh_metadata=fresh_metadata,
        num_layers=layers,
        steps=steps,
        seed=seed,
        kernels=kernels,
        platform=platform,
        max_num_seqs=max_num_seqs,
        graph_backend=graph_backend,
        break_outputs=break_outputs,
    )
    if capture_sizes is not None:
        options["capture_sizes"] = capture_sizes
    config = EngineConfig(**options)
    if fresh_metadata and config.resolved_runner is not Runner.V1:
        raise CapturelintError(
            f"--fresh-metadata changes Model Runner V1's metadata builders, and this run uses runner "
            f"{config.resolved_runner}; add --runner v1, or drop --fresh-metadata"
        )
    report = run_with_eager_twin(config)
    if as_json:
        click.echo(json.dumps(report.to_dict(), sort_keys=True))
    else:
        _print_table(report)


def _print_table(report: TwinReport) -> None:
    from rich.console import Console
    from rich.table import Table

    d = report.to_dict()
    cfg = d["config"]
    title = (
        f"{cfg['architecture']} runner {cfg['runner']}, mode {cfg['cudagraph_mode']}, "
        f"eager region {cfg['effective_eager_region']}"
        + (", fresh metadata" if cfg["fresh_metadata"] else "")
    )
    table = Table()
    table.add_column("measure")
    table.add_column("value", justify="right")
    divergent = d["first_divergent_step"]
    rows = (
        ("token agreement", f"{d['token_agreement']:.4f}"),
        ("max logit error", f"{d['max_logit_error']:.3g}"),
        ("first divergent step", "-" if divergent is None else str(divergent)),
        ("graphs captured", str(d["graphs"])),
        ("eager breaks", str(d["eager_breaks"])),
        ("steps (replayed)", f"{d['steps']} ({d['replayed_steps']})"),
        ("tokens compared", str(d["tokens_compared"])),
    )
    for name, value in rows:
        table.add_row(name, value)
    console = Console(highlight=False)
    console.print(title)
    console.print(table)
    verdict = (
        "replay equals eager"
        if d["matches_eager"]
        else f"replay DIFFERS from eager (tolerance {EQUAL_LOGIT_TOLERANCE:g})"
    )
    console.print(verdict)
