"""``corral nodes`` and ``corral node pause|resume|drain|delete NAME``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated

import typer
from rich.markup import escape

from corral.cli.common import (
    JsonOpt,
    TokenOpt,
    UrlOpt,
    cli_errors,
    connect,
    err,
    out,
    print_json,
    print_table,
)
from corral.cli.render import NODES_DROP, nodes_table, styled
from corral.sdk import Client, NodeStatus

node_app = typer.Typer(
    name="node",
    help="Change one node: pause, resume, drain or delete it.",
    no_args_is_help=True,
)
NameArg = Annotated[str, typer.Argument(help="The node's name (see corral nodes).")]


def register(app: typer.Typer) -> None:
    app.command("nodes")(list_nodes)
    app.add_typer(node_app)


def list_nodes(url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Nodes: GPUs, VRAM, utilisation, models, jobs, last seen, state."""
    with connect(url, token) as client, cli_errors():
        nodes = client.nodes()
    if as_json:
        print_json(nodes)
    elif not nodes:
        err().print("no nodes yet: start an agent with `corral agent --server URL --token T`")
    else:
        print_table(nodes_table(nodes, time.time()), NODES_DROP)


@node_app.command("pause")
def pause(
    name: NameArg, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """No new work on the node; what runs there keeps running (admin)."""
    _act(name, Client.pause_node, url, token, as_json)


@node_app.command("resume")
def resume(
    name: NameArg, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Let the node take new work again (clears paused and draining) (admin)."""
    _act(name, Client.resume_node, url, token, as_json)


@node_app.command("drain")
def drain(
    name: NameArg, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """No new work; the node can be removed once its running work ends (admin)."""
    _act(name, Client.drain_node, url, token, as_json)


@node_app.command("delete")
def delete(name: NameArg, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Forget a node that is gone: its agent stopped and it was marked lost (admin)."""
    with connect(url, token) as client, cli_errors():
        client.delete_node(name)
    out().print(f"{escape(name)} deleted")


def _act(
    name: str,
    action: Callable[[Client, str], NodeStatus],
    url: str | None,
    token: str | None,
    as_json: bool,
) -> None:
    with connect(url, token) as client, cli_errors():
        node = action(client, name)
    if as_json:
        print_json(node)
    else:
        out().print(f"{node.name} {styled(node.condition)}")
