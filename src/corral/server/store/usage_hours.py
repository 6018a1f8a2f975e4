"""Usage per hour, team, user, class and node pool: added to as allocations end, summed by
any of those (``services/usage.py``).

The addition is one ``INSERT ... ON CONFLICT DO UPDATE`` per hour, so
concurrent ends of one team's work add up instead of overwriting each other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.server.store.sql import Query
from corral.server.store.tables import allocations, autoscale_machines, nodes, usage_hours


def _add_statement(insert: Any) -> Any:
    """``INSERT ... ON CONFLICT DO UPDATE`` adding to the row, in one database's dialect."""
    u = usage_hours.c
    figures = ("gpu_milli_s", "cpu_s", "jobs", "cost")
    stmt = insert(usage_hours).values(
        {c.name: sa.bindparam(c.name, type_=c.type) for c in usage_hours.columns}
    )
    return stmt.on_conflict_do_update(
        index_elements=[u.hour, u.team, u.user, u.priority, u.pool],
        set_={f: u[f] + stmt.excluded[f] for f in figures},
    )


# Run on the driver connection (``sql.Query``): it is on the path of every allocation's end.
_ADD = Query(
    {
        "sqlite": _add_statement(sqlite.insert),
        "postgresql": _add_statement(postgresql.insert),
    }
)

GROUPS = {
    "team": usage_hours.c.team,
    "user": usage_hours.c.user,
    "class": usage_hours.c.priority,
    "pool": usage_hours.c.pool,
    "hour": usage_hours.c.hour,
    "day": (usage_hours.c.hour // 24),
}
"""What a report may be grouped by, and the column (or day of the hour) each one is."""


@dataclass(frozen=True, slots=True)
class Spent:
    """What one group used: milli-GPU-seconds, CPU-seconds, jobs ended, cost."""

    gpu_milli_s: float = 0.0
    cpu_s: float = 0.0
    jobs: int = 0
    cost: float = 0.0

    def __add__(self, other: Spent) -> Spent:
        return Spent(
            self.gpu_milli_s + other.gpu_milli_s,
            self.cpu_s + other.cpu_s,
            self.jobs + other.jobs,
            self.cost + other.cost,
        )


async def add(
    conn: AsyncConnection,
    team: str,
    user: str,
    priority: str,
    pool: str,
    by_hour: Sequence[tuple[int, Spent]],
) -> None:
    """Add what one allocation used in each hour to its rows."""
    if not by_hour:
        return
    rows = [
        {
            "hour": hour,
            "team": team,
            "user": user,
            "priority": priority,
            "pool": pool,
            "gpu_milli_s": s.gpu_milli_s,
            "cpu_s": s.cpu_s,
            "jobs": s.jobs,
            "cost": s.cost,
        }
        for hour, s in by_hour
    ]
    await _ADD.run_many(conn, rows)


async def summed(
    conn: AsyncConnection,
    by: Sequence[str],
    first_hour: int,
    end_hour: int,
    team: str | None,
    limit: int,
) -> list[tuple[tuple[object, ...], Spent]]:
    """Sums per group of ``by`` over hours in [first_hour, end_hour), at most ``limit``
    groups (in group order); ``team``: that team's rows alone."""
    cols = [GROUPS[b].label(b) for b in by]
    u = usage_hours.c
    query = sa.select(
        *cols,
        sa.func.sum(u.gpu_milli_s),
        sa.func.sum(u.cpu_s),
        sa.func.sum(u.jobs),
        sa.func.sum(u.cost),
    ).where(u.hour >= first_hour, u.hour < end_hour)
    if team is not None:
        query = query.where(u.team == team)
    if cols:
        query = query.group_by(*(GROUPS[b] for b in by)).order_by(*(GROUPS[b] for b in by))
    out = []
    for row in await conn.execute(query.limit(limit)):
        *keys, gpu, cpu, jobs, cost = row
        if gpu is None:  # no row at all in an ungrouped sum
            continue
        out.append((tuple(keys), Spent(float(gpu), float(cpu), int(jobs), float(cost))))
    return out


async def active(conn: AsyncConnection, team: str | None) -> list[sa.Row[tuple[object, ...]]]:
    """The allocations holding resources now, with what their use is counted from."""
    a = allocations.c
    query = sa.select(
        a.id,
        a.node,
        a.team,
        a.user,
        a.priority,
        a.replica,
        a.job_ids,
        a.gpu_indices,
        a.gpu_milli,
        a.cpus,
        a.on_cpu,
        a.created_at,
    ).where(a.active.is_(True))
    if team is not None:
        query = query.where(a.team == team)
    return list(await conn.execute(query))


async def pools_of(conn: AsyncConnection, names: Sequence[str]) -> Mapping[str, str]:
    """The pool of each node: the autoscaler's ledger's, else its ``pool`` label, else ""."""
    if not names:
        return {}
    wanted = sorted(set(names))
    out = dict.fromkeys(wanted, "")
    for name, inventory in await conn.execute(
        sa.select(nodes.c.name, nodes.c.inventory).where(nodes.c.name.in_(wanted))
    ):
        labels = (inventory or {}).get("labels") or {}
        out[name] = str(labels.get("pool", ""))[:64]
    ledger = autoscale_machines.c
    for name, pool in await conn.execute(
        sa.select(ledger.name, ledger.pool).where(ledger.name.in_(wanted))
    ):
        out[name] = pool
    return out
