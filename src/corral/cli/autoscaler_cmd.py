"""``corral autoscaler [status]``: each pool's machines, what they cost against the caps, the
recent decisions with their reasons, and the waiting work the last one did not serve."""

from __future__ import annotations

import time

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
from corral.cli.render import POOLS_DROP, age, pool_machines, pools_table
from corral.sdk import AutoscalerStatus

SHOWN = 20  # waiting jobs listed as not served; --json has them all
DECISIONS = 10  # recent decisions shown; --json has the last 20

autoscaler_app = typer.Typer(
    name="autoscaler",
    help="The autoscaler: pools, machines, spend and decisions (admin).",
    invoke_without_command=True,
)


def register(app: typer.Typer) -> None:
    app.add_typer(autoscaler_app)


@autoscaler_app.callback()
def main(
    ctx: typer.Context, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Without a command: the same as ``corral autoscaler status``."""
    if ctx.invoked_subcommand is None:
        status(url, token, as_json)


@autoscaler_app.command("status")
def status(url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Each pool's machines (launching, joined, draining), spend against the caps, the
    recent decisions with their reasons, and the waiting work not served (admin)."""
    with connect(url, token) as client, cli_errors():
        shown = client.autoscaler()
    if as_json:
        print_json(shown)
        return
    if not shown.enabled:
        err().print("the autoscaler is off: see docs/autoscaler.md (autoscale.pools_file)")
        return
    now = time.time()
    print_table(pools_table(shown, now), POOLS_DROP)
    out().print("machines:")
    for line in pool_machines(shown):
        out().print(f"  {line}")
    _spend(shown)
    _decisions(shown, now)
    _last(shown, now)


def _spend(shown: AutoscalerStatus) -> None:
    spend = shown.spend
    if spend is None:
        return
    cap = spend.max_spend_per_hour
    against = "no overall cap" if cap is None else f"cap {cap:g}/h"
    if cap is not None and spend.cost_per_hour_now >= cap:
        against += " [yellow](reached: no launch until it is under)[/]"
    out().print(
        f"spend: {spend.cost_per_hour_now:g}/h now, {against}; "
        f"{spend.spent_last_hour:.2f} in the last hour"
    )


def _decisions(shown: AutoscalerStatus, now: float) -> None:
    if not shown.decisions:
        return
    out().print("recent decisions:")
    for decision in shown.decisions[-DECISIONS:]:
        for line in decision.lines:
            out().print(f"  {age(decision.at, now):>4} ago  {escape(line)}")


def _last(shown: AutoscalerStatus, now: float) -> None:
    last = shown.last
    if last is None:
        out().print("no decision yet (or this replica does not lead)")
        return
    out().print(f"last decision {now - last.at:.0f}s ago:")
    for launch in last.launches:
        out().print(f"  launch {launch['count']} x {escape(launch['pool'])}: {launch['reason']}")
    for name in last.drain:
        out().print(f"  drain {escape(name)}: idle")
    for removal in last.remove:
        out().print(f"  remove {escape(removal['name'])}: {removal['reason']}")
    for unmet in last.unmet[:SHOWN]:
        out().print(f"  [yellow]not served[/] {escape(unmet['job_id'])}: {escape(unmet['reason'])}")
    if len(last.unmet) > SHOWN:
        out().print(f"  ... and {len(last.unmet) - SHOWN} more waiting jobs not served (--json)")
    if not (last.launches or last.drain or last.remove or last.unmet):
        out().print("  nothing to do")
