"""``corral teams``, ``corral team set NAME ...`` and ``corral queue``."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from corral.cli.common import (
    EXIT_BAD_INPUT,
    JsonOpt,
    TokenOpt,
    UrlOpt,
    cli_errors,
    connect,
    err,
    fail,
    print_json,
    print_table,
)
from corral.cli.render import QUEUE_DROP, queue_table, teams_table
from corral.sdk import UNCHANGED
from corral.sdk.calls import Unchanged

team_app = typer.Typer(name="team", help="Change a team's quota.", no_args_is_help=True)
NO_LIMIT = ("none", "any", "unlimited")


def register(app: typer.Typer) -> None:
    app.command("teams")(list_teams)
    app.add_typer(team_app)
    app.command("queue")(queue)


def list_teams(url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Teams with their guaranteed GPUs, borrowing limit and weight."""
    with connect(url, token) as client, cli_errors():
        teams = client.teams()
    if as_json:
        print_json(teams)
    else:
        print_table(teams_table(teams))


@team_app.command("set")
def set_team(
    name: Annotated[str, typer.Argument(help="The team (created if new).")],
    quota: Annotated[
        float | None, typer.Option(help="Guaranteed GPUs (0.5 = half a GPU).", min=0)
    ] = None,
    borrow_limit: Annotated[
        str | None,
        typer.Option(help="At most this many GPUs borrowed beyond the quota; 'none': no limit."),
    ] = None,
    weight: Annotated[
        float | None, typer.Option(help="Share of idle GPUs relative to other teams.")
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a team or change its quota, borrowing limit or weight (admin); others keep theirs."""
    if quota is None and borrow_limit is None and weight is None:
        fail("nothing to set: give --quota, --borrow-limit or --weight", EXIT_BAD_INPUT)
    limit = _borrow_limit(borrow_limit)
    with connect(url, token) as client, cli_errors():
        team = client.set_team(name, quota=quota, borrow_limit=limit, weight=weight)
    if as_json:
        print_json(team)
    else:
        print_table(teams_table([team]))


def _borrow_limit(text: str | None) -> float | Unchanged | None:
    if text is None:
        return UNCHANGED
    if text.strip().lower() in NO_LIMIT:
        return None
    try:
        return float(text)
    except ValueError:
        fail(f"--borrow-limit: a number of GPUs or 'none', not {text!r}", EXIT_BAD_INPUT)


def queue(
    limit: Annotated[int, typer.Option(help="Show at most this many.", min=1, max=1000)] = 100,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Queued jobs in the order the scheduler considers them, and why each one waits."""
    with connect(url, token) as client, cli_errors():
        status = client.queue(limit)
    if as_json:
        print_json(status)
        return
    if not status.entries:
        err().print("the queue is empty")
        return
    print_table(queue_table(status.entries, time.time()), QUEUE_DROP)
    shown = len(status.entries)
    more = f" ({status.total - shown} more not shown)" if status.total > shown else ""
    err().print(f"{status.total} queued{more}")
