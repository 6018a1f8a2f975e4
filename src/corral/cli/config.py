"""``corral login URL --token T``: remember the server and token in ~/.corral/config.toml."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from corral.cli.common import CLI_RETRY, cli_errors, out
from corral.sdk import Client
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
    ca_fingerprint: Annotated[
        str | None,
        typer.Option(
            help="Pin an https server's self-signed certificate: the sha256:<hex> "
            "`corral server` prints. [default: $CORRAL_CA_FINGERPRINT]",
            show_default=False,
        ),
    ] = None,
    ca_cert: Annotated[
        Path | None,
        typer.Option(
            help="Trust this CA (PEM) for an https server. [default: $CORRAL_CA_CERT]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Save the server URL and token so other commands need no --url/--token.

    The file is ~/.corral/config.toml (or $CORRAL_CONFIG); CORRAL_URL,
    CORRAL_TOKEN and flags still win over it. For an https server with a
    self-signed certificate, --ca-fingerprint pins it (saved too).
    """
    url = normalize_url(url)
    ca_file = str(ca_cert.expanduser().resolve()) if ca_cert else None
    if verify:
        with cli_errors():
            client = Client(
                url, token, retry=CLI_RETRY, ca_fingerprint=ca_fingerprint, ca_cert=ca_file
            )
        with client, cli_errors():
            token = client.token
            client.queue(limit=1)  # any client token may read the queue
    path = save(url, token, config_path(), ca_fingerprint=ca_fingerprint, ca_cert=ca_file)
    out().print(f"logged in to {url}; saved to {path}", highlight=False)
