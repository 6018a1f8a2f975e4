"""``corral token create agent|team NAME``: the admin makes a join token or a team token.

It replaces the ``curl -X POST /v1/tokens`` a new user had to type: the secret is
printed once (the server keeps only its hash), and for an agent token the command a
GPU machine runs to join, with the server certificate's fingerprint in it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from corral.cli.common import JsonOpt, TokenOpt, UrlOpt, cli_errors, connect, print_json

token_app = typer.Typer(name="token", help="Create tokens (admin).", no_args_is_help=True)


class Kind(StrEnum):
    AGENT = "agent"  # a GPU machine joins with it
    TEAM = "team"  # a client sees and submits only its team's jobs


def register(app: typer.Typer) -> None:
    app.add_typer(token_app)


@token_app.command("create")
def create(
    kind: Annotated[Kind, typer.Argument(help="agent: a machine joins; team: a team's client.")],
    name: Annotated[str, typer.Argument(help="What it is for: the machine or the client.")],
    team: Annotated[
        str | None, typer.Option(help="The team a team token belongs to (default: NAME).")
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a token; its secret is shown this once."""
    if kind is Kind.TEAM:
        team = team or name
    with connect(url, token) as client, cli_errors():
        made = client.create_token(kind.value, name, team)
    if as_json:
        print_json(made)
        return
    typer.echo(made.token)  # alone on the first line: `$(corral token create ... | head -1)`
    who = f"team {made.team}" if made.team else f"agent {made.name}"
    typer.echo(f"  {kind.value} token {made.id} for {who}; the secret is shown only once", err=True)
    if made.join_command:
        typer.echo(f"  on the GPU machine: {made.join_command}", err=True)
