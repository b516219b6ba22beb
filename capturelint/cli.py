"""The ``capturelint`` command line.

Exit status is decided here, in one place: 0 clean, 1 findings, 2 usage, configuration
or internal error. Every error that reaches the user is one line on stderr.
"""

from __future__ import annotations

import sys

import click

from capturelint.errors import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS, CapturelintError  # noqa: F401


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="capturelint")
def cli() -> None:
    """Check that CUDA-graph replay computes what eager execution computes."""


def _register() -> None:
    from capturelint.engine.cli import engine_group

    cli.add_command(engine_group)
    try:
        from capturelint.commands import register
    except ImportError:  # the checker's commands are optional while the engine is built alone
        return
    register(cli)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _threads() -> None:
    # The bundled engine's tensors are tiny: one intra-op thread is fastest, and OpenMP
    # threads contending for busy cores make every op ~100x slower. CAPTURELINT_THREADS
    # overrides it for engines with real shapes.
    import os

    import torch

    torch.set_num_threads(int(os.environ.get("CAPTURELINT_THREADS", "1")))


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the command and maps every outcome to an exit status."""
    _register()
    _threads()
    try:
        rv = cli.main(args=argv, prog_name="capturelint", standalone_mode=False)
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.exceptions.Abort:
        click.echo("capturelint: error: aborted", err=True)
        return EXIT_ERROR
    except click.UsageError as e:
        hint = ""
        if e.ctx is not None:
            hint = f"; see '{e.ctx.command_path} --help'"
        click.echo(f"capturelint: error: {_one_line(e.format_message()).rstrip('.')}{hint}", err=True)
        return EXIT_ERROR
    except click.ClickException as e:
        click.echo(f"capturelint: error: {_one_line(e.format_message())}", err=True)
        return EXIT_ERROR
    except CapturelintError as e:
        click.echo(f"capturelint: error: {_one_line(e)}", err=True)
        return EXIT_ERROR
    except KeyboardInterrupt:
        click.echo("capturelint: error: interrupted", err=True)
        return EXIT_ERROR
    return rv if isinstance(rv, int) else EXIT_CLEAN


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
