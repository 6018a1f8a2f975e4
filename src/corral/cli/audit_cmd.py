"""``corral audit``: who did what, when and from where (admin; docs/security/audit.md)."""

from __future__ import annotations

import re
import time
from datetime import datetime
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

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
from corral.cli.render import AUDIT_DROP
from corral.sdk import AuditRecord

_AGO = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
DETAIL_SHOWN = 80  # characters of a record's detail in the table; --json has it all
TIME_HELP = "30m, 12h or 7d ago, or a date/time (2026-01-31 or 2026-01-31T14:00)."


def register(app: typer.Typer) -> None:
    app.command("audit")(audit)


def audit(  # noqa: PLR0913 (each option of the command is an argument)
    actor: Annotated[str | None, typer.Option(help="Only this token (its id or name).")] = None,
    team: Annotated[str | None, typer.Option(help="Only tokens of this team.")] = None,
    action: Annotated[
        list[str] | None,
        typer.Option(help="Only this action (repeat for several; job.* for every job action)."),
    ] = None,
    target: Annotated[
        str | None, typer.Option(help="Only actions on this (a job id, ...).")
    ] = None,
    since: Annotated[str | None, typer.Option(help=f"From then on: {TIME_HELP}")] = None,
    until: Annotated[str | None, typer.Option(help=f"Before then: {TIME_HELP}")] = None,
    limit: Annotated[int, typer.Option(help="Show at most this many.", min=1)] = 50,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The audit log, newest first (admin): tokens made and revoked, team quotas, models,
    nodes paused and drained, jobs cancelled and deleted, refused requests."""
    now = time.time()
    start, end = moment(since, now, "--since"), moment(until, now, "--until")
    with connect(url, token) as client, cli_errors():
        records = client.audit(
            actor=actor, team=team, action=action, target=target, since=start, until=end,
            limit=limit,
        )  # fmt: skip
    if as_json:
        print_json(records)
    elif not records:
        err().print("no audit records match")
    else:
        print_table(audit_table(records), AUDIT_DROP)


def moment(text: str | None, now: float, option: str) -> float | None:
    """Epoch seconds from ``7d`` (that long ago), an ISO date or date/time (local time),
    or epoch seconds; a bad one fails naming ``option``."""
    if text is None:
        return None
    text = text.strip()
    if m := _AGO.match(text):
        return now - float(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        fail(f"{option}: {text!r} is not a time (use {TIME_HELP.rstrip('.')})", EXIT_BAD_INPUT)


def audit_table(records: list[AuditRecord]) -> Table:
    table = Table(box=None, pad_edge=False)
    for name in ("WHEN", "ACTOR", "ACTION", "TARGET", "FROM", "DETAIL"):
        table.add_column(name, no_wrap=name in ("WHEN", "ACTION"))
    for r in records:
        who = r.actor
        actor = f"{who.kind}:{who.name}" + (f" ({who.team})" if who.team else "")
        where = r.address or "-"
        if r.forwarded_for:
            where += f" (fwd {r.forwarded_for})"
        detail = ", ".join(f"{k}={v}" for k, v in r.detail.items())
        if len(detail) > DETAIL_SHOWN:
            detail = detail[: DETAIL_SHOWN - 1] + "…"
        table.add_row(
            datetime.fromtimestamp(r.at).strftime("%Y-%m-%d %H:%M:%S"),
            escape(actor),
            escape(r.action),
            escape(r.target),
            escape(where),
            escape(detail),
        )
    return table
