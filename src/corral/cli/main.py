"""The ``corral`` command. Each command group lives in its own module and is added here."""

from __future__ import annotations

import typer

from corral import __version__
from corral.cli import (
    agent_cmd,
    audit_cmd,
    autoscaler_cmd,
    edit_cmd,
    groups_cmd,
    jobs_cmd,
    models_cmd,
    nodes_cmd,
    policy_cmd,
    server_cmd,
    sim_cmd,
    teams_cmd,
    token_cmd,
    up_cmd,
    watch_cmd,
)
from corral.cli import config as login_cmd

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
# client commands (talk to a server through corral.sdk)
login_cmd.register(app)
jobs_cmd.register(app)
edit_cmd.register(app)
groups_cmd.register(app)
watch_cmd.register(app)
teams_cmd.register(app)
nodes_cmd.register(app)
autoscaler_cmd.register(app)
models_cmd.register(app)
audit_cmd.register(app)
policy_cmd.register(app)
token_cmd.register(app)


def main() -> None:
    """Console-script entry point."""
    app()
