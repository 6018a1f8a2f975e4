"""``corral server``: run the control plane (HTTP API, scheduling loop, node liveness).

Options override ``CORRAL_*`` environment variables (see docs/server.md,
"Settings"). The server binds its socket first, so the banner shows the
real address even with ``--port 0``.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from corral.cli import loop as event_loop

if TYPE_CHECKING:
    from corral.server.plane import StartReport
    from corral.server.tls import ServerTls


def register(app: typer.Typer) -> None:
    """Add ``corral server`` to the ``corral`` command."""
    app.command("server")(server)


def server(  # noqa: PLR0913 (each option of the command is an argument)
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            help="Where state lives: a SQLite file path or sqlite:///path "
            "(default ~/.corral/corral.db), or postgresql://user@host:5432/db "
            "(add ?schema=name to use a schema).",
            show_default=False,
        ),
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="Address to listen on. [default: 127.0.0.1]")
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            help="Port to listen on; 0 picks a free one. [default: 8470]", min=0, max=65535
        ),
    ] = None,
    agent_port: Annotated[
        int | None,
        typer.Option(
            help="Port agents dial (gRPC); 0 picks a free one. [default: 8471]", min=0, max=65535
        ),
    ] = None,
    home: Annotated[
        Path | None,
        typer.Option(help="Directory for the default database and blobs. [default: ~/.corral]"),
    ] = None,
    blob_dir: Annotated[
        Path | None,
        typer.Option(help="Directory for results and previews. [default: <home>/blobs]"),
    ] = None,
    node_timeout: Annotated[
        float | None,
        typer.Option(
            help="Seconds without a heartbeat before a node is lost. [default: 30]", min=0.1
        ),
    ] = None,
    log_level: Annotated[
        str | None, typer.Option(help="debug, info, warning or error. [default: info]")
    ] = None,
    tls: Annotated[
        str | None,
        typer.Option(
            help="auto: a self-signed certificate when listening beyond this machine "
            "(--host 0.0.0.0), plain http on 127.0.0.1; self-signed: always; off: never "
            "(a reverse proxy terminates TLS). [default: auto]",
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option(help="PEM certificate (chain) to serve on both ports.", show_default=False),
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option(help="PEM private key of --tls-cert.", show_default=False)
    ] = None,
) -> None:
    """Run the corral control plane.

    Clients (SDK, CLI, web apps) use its HTTP API (OpenAPI at /docs); agents
    join with an agent token. The first start prints an admin token once:
    store it, it cannot be shown again. Listening beyond this machine, it
    serves TLS: a self-signed certificate made at first start unless --tls-cert
    is given; agents and clients pin the fingerprint it prints.
    """
    from pydantic import ValidationError

    from corral.core.errors import InvalidSpec
    from corral.server.settings import Settings
    from corral.server.store.sqlite_lock import StoreInUse

    overrides = _overrides(db, host, port, home, blob_dir, node_timeout, log_level)
    if agent_port is not None:
        overrides["agents"] = {"port": agent_port}
    given_tls = {"mode": tls, "cert": tls_cert, "key": tls_key}
    if any(v is not None for v in given_tls.values()):
        overrides["tls"] = {k: v for k, v in given_tls.items() if v is not None}
    try:
        settings = Settings(**overrides)
        _serve(settings)
    except (ValidationError, InvalidSpec) as exc:
        typer.echo(f"corral server: {exc}", err=True)
        raise typer.Exit(2) from None
    except StoreInUse as exc:
        typer.echo(f"corral server: {exc}", err=True)
        raise typer.Exit(1) from None
    except OSError as exc:
        typer.echo(f"corral server: cannot listen: {exc}", err=True)
        raise typer.Exit(1) from None


def _overrides(
    db: str | None,
    host: str | None,
    port: int | None,
    home: Path | None,
    blob_dir: Path | None,
    node_timeout: float | None,
    log_level: str | None,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if db is not None:
        out["store"] = {"db": db}
    api = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    if api:
        out["api"] = api
    if node_timeout is not None:
        out["scheduling"] = {"node_timeout_s": node_timeout}
    for key, value in (("home", home), ("blob_dir", blob_dir), ("log_level", log_level)):
        if value is not None:
            out[key] = value
    return out


def _serve(settings: Any) -> None:
    import uvicorn

    from corral.server.app import create_app, create_plane
    from corral.server.serving import uvicorn_config
    from corral.server.store.db import parse_db

    parse_db(settings.db_url())  # a bad --db fails here, before anything starts
    sock = _bind(settings.api.host, settings.api.port)
    host, port = sock.getsockname()[:2]
    settings.api.port = port  # agents fetch model files from here (issue 10)
    shown = f"[{host}]" if ":" in host else host

    plane = create_plane(settings)
    plane.rt.db.claim()  # a second server on the same SQLite file stops here, with the reason
    scheme = "https" if plane.tls else "http"

    def banner(report: StartReport) -> None:
        lines = [
            f"corral server listening on {scheme}://{shown}:{port}  (API docs: /docs)",
            *_tls_lines(plane.tls),
            *_agents_line(getattr(plane.link, "address", None), plane.tls),
            f"  database: {report.db}",
            f"  blobs:    {report.blobs}",
        ]
        if report.admin_token:
            lines += [
                f"  admin token: {report.admin_token}",
                "  (shown once, only its hash is stored: keep it now)",
            ]
        print("\n".join(lines), flush=True)
        event_loop.settle_heap()  # started: what exists now lives as long as the server

    app = create_app(plane=plane, on_started=banner)
    config = uvicorn_config(
        app,
        settings.api,
        log_level=settings.log_level,
        access_log=settings.log_level == "debug",
        timeout_graceful_shutdown=3,
        loop=event_loop.choice(),
        ssl_certfile=plane.tls.cert if plane.tls else None,
        ssl_keyfile=plane.tls.key if plane.tls else None,
    )
    uvicorn.Server(config).run(sockets=[sock])
    sys.stdout.flush()


def _tls_lines(tls: ServerTls | None) -> list[str]:
    if tls is None:
        return []
    what = "self-signed, made now" if tls.made else "self-signed" if tls.self_signed else "given"
    return [f"  TLS certificate: {tls.cert} ({what})", f"  fingerprint: {tls.fingerprint}"]


def _agents_line(address: str | None, tls: ServerTls | None) -> list[str]:
    if not address:
        return []
    pin = f" --ca-fingerprint {tls.fingerprint}" if tls and tls.self_signed else ""
    return [f"  agents join with: corral agent --server {address}{pin} --token <agent token>"]


BACKLOG = 2048  # uvicorn's own default


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say so (accepted ones
    # inherit it). Without it a response written in two parts waited ~40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)  # the banner says "listening": a client may connect before uvicorn runs
    sock.set_inheritable(True)
    return sock
