"""``corral login URL --token T``: remember the server and token in ~/.corral/config.toml."""

from __future__ import annotations

from typing import Annotated

import typer

from corral.cli.common import cli_errors, connect, out
from corral.sdk.config import config_path, normalize_url, save


def register(app: typer.Typer) -> None:
    app.command("login")(login)


def login(
    url: Annotated[str, typer.Argument(help="The server, e.g. http://gpu-box:8470.")],
    token: Annotated[
        str | None,
        typer.Option(help="An admin or team token. [default: $CORRAL_TOKEN]", show_default=False),
    ] = None,
    verify: Annotated[bool, typer.Option(help="Check the URL and token work first.")] = True,
) -> None:
    """Save the server URL and token so other commands need no --url/--token.

    The file is ~/.corral/config.toml (or $CORRAL_CONFIG); CORRAL_URL,
    CORRAL_TOKEN and flags still win over it.
    """
    url = normalize_url(url)
    if verify:
        with connect(url, token) as client, cli_errors():
            token = client.token
            client.queue(limit=1)  # any client token may read the queue
    path = save(url, token, config_path())
    out().print(f"logged in to {url}; saved to {path}", highlight=False)
