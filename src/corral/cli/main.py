"""The ``corral`` command. Each command group lives in its own module and is added here."""

from __future__ import annotations

import typer

from corral import __version__
from corral.cli import agent_cmd, server_cmd, sim_cmd, up_cmd

app = typer.Typer(
    name="corral",
    help="corral: throw GPU work into a pile; it runs in the right order on the right GPU.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command()
def version() -> None:
    """Print corral's version."""
    typer.echo(__version__)


sim_cmd.register(app)
server_cmd.register(app)
agent_cmd.register(app)
up_cmd.register(app)


def main() -> None:
    """Console-script entry point."""
    app()
