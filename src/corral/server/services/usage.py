"""Who used what: GPU-seconds, CPU-seconds, jobs and cost per team, user, class, pool, hour.

An allocation is charged from its placement to its end, the span during which
quota and fair share count its GPUs as held (``scheduler/quota.py``): a
shared card's share in milli-GPUs (1000 for a whole card), nothing for CPU
offload, its CPUs for CPU-seconds. What an allocation used is added to the
hours it spanned when it ends (``record_end``, in the transaction that ends
it); a report adds the allocations still holding resources up to now. Cost
is GPU time at its node pool's price per GPU-hour: the policy's
``pools.<name>.gpu_hour``, else the autoscaler's pool price per machine
divided by its GPUs. A node's pool is the autoscaler's ledger's, else its
``pool`` label, else "" (no pool).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral.core.errors import InvalidSpec
from corral.core.model import Allocation
from corral.core.resources import MILLI
from corral.server.services.unit import Runtime, Tx
from corral.server.store import usage_hours as repo
from corral.server.store.records import AllocRecord
from corral.server.store.usage_hours import GROUPS, Spent

if TYPE_CHECKING:  # auth ends allocations through settling, which records here: a cycle
    from corral.server.services.auth import Principal

HOUR_S = 3600
MAX_RANGE_S = 400 * 86400.0
"""A report covers at most this much time: more than a year, bounded work per request."""

POOL_KEPT_S = 60.0
"""How long a node's pool is taken as read: an allocation's end then costs no extra read,
and a node relabelled is counted in its new pool within a minute."""

POOLS_KEPT = 10_000  # nodes whose pool is kept, at most (a bound on memory, not a limit)

LAST_TIME = 253_402_300_799.0
"""The end of the year 9999: the last time a report may name (its hour fits 32 bits)."""

MAX_GROUPS = 10_000
"""Groups one report returns at most (``truncated`` says when there were more)."""


async def record_end(rt: Runtime, tx: Tx, rec: AllocRecord) -> None:
    """Add what ``rec``'s allocation used, from its placement to now, to its hours."""
    alloc = rec.alloc
    pool = await _pool_of(rt, tx, alloc.node)
    price = gpu_hour_price(rt, pool)
    by_hour = list(spent_by_hour(_use(alloc), rec.created_at, tx.now, price))
    await repo.add(tx.conn, alloc.team, alloc.user, alloc.priority, pool, by_hour)
    total = sum((s for _, s in by_hour), Spent())
    metrics = rt.metrics

    async def count() -> None:  # once committed: a rolled-back end used nothing
        labels = (alloc.team, alloc.priority)
        metrics.usage_gpu_seconds.labels(*labels).inc(total.gpu_milli_s / MILLI)
        metrics.usage_cpu_seconds.labels(*labels).inc(total.cpu_s)
        metrics.usage_cost.labels(*labels).inc(total.cost)

    tx.then(count)


async def _pool_of(rt: Runtime, tx: Tx, node: str) -> str:
    kept = rt.node_pools.get(node)
    if kept is not None and tx.now - kept[1] < POOL_KEPT_S:
        return kept[0]
    pool = (await repo.pools_of(tx.conn, [node])).get(node, "")
    if len(rt.node_pools) >= POOLS_KEPT:
        rt.node_pools.clear()
    rt.node_pools[node] = (pool, tx.now)
    return pool


def gpu_hour_price(rt: Runtime, pool: str) -> float:
    prices = rt.policy.gpu_hour_prices
    return prices[pool] if pool in prices else rt.pool_prices.get(pool, 0.0)


@dataclass(frozen=True, slots=True)
class Use:
    """What an allocation holds each second it is held, and the jobs it counts once."""

    milli: int
    cpus: float  # fractional CPUs count as they were asked (500m: 0.5)
    jobs: int


def _use(alloc: Allocation) -> Use:
    # A gang's replicas share their jobs: the first counts them.
    jobs = len(alloc.job_ids) if alloc.replica == 0 else 0
    return Use(0 if alloc.on_cpu else alloc.milli, alloc.cpus, jobs)


def spent_by_hour(use: Use, start: float, end: float, price: float) -> Iterator[tuple[int, Spent]]:
    """``use`` held from ``start`` to ``end``, per hour it spans; the jobs go to the
    hour it ended in."""
    end = max(start, end)
    last = int(end // HOUR_S)
    hour = int(start // HOUR_S)
    while hour <= last:
        lo, hi = max(start, hour * HOUR_S), min(end, (hour + 1) * HOUR_S)
        seconds = hi - lo
        jobs = use.jobs if hour == last else 0
        if seconds > 0 or jobs:
            gpu = use.milli * seconds
            yield hour, Spent(gpu, use.cpus * seconds, jobs, gpu / MILLI / HOUR_S * price)
        hour += 1


@dataclass(frozen=True, slots=True)
class Report:
    by: tuple[str, ...]
    start: float
    end: float
    rows: list[tuple[tuple[object, ...], Spent]]
    truncated: bool


async def report(
    rt: Runtime, who: Principal, by: Sequence[str], start: float | None, end: float | None
) -> Report:
    """Sums per group of ``by`` over whole hours from ``start`` to ``end`` (default: the
    last 30 days to now), ended allocations and running ones up to now; a team token sees
    its team's alone."""
    who.require_client()
    now = rt.clock.now()
    end = now if end is None else end
    start = max(0.0, end - 30 * 86400.0) if start is None else start
    _check(by, start, end)
    first, stop = int(start // HOUR_S), math.ceil(end / HOUR_S)
    team = None if who.is_admin else who.team
    async with rt.db.read() as conn:
        stored = await repo.summed(conn, by, first, stop, team, MAX_GROUPS + 1)
        running = await repo.active(conn, team)
        pools = await repo.pools_of(conn, [str(r.node) for r in running])
    sums: dict[tuple[object, ...], Spent] = dict(stored)
    for row in running:
        pool = pools.get(str(row.node), "")
        keys = {"team": row.team, "user": row.user, "class": row.priority, "pool": pool}
        for hour, spent in spent_by_hour(
            _running_use(row), row.created_at, now, gpu_hour_price(rt, pool)
        ):
            if first <= hour < stop:
                group = tuple(_group_key(b, keys, hour) for b in by)
                sums[group] = sums.get(group, Spent()) + spent
    rows = sorted(sums.items(), key=lambda kv: tuple(map(str, kv[0])))
    return Report(
        tuple(by), first * HOUR_S, stop * HOUR_S, rows[:MAX_GROUPS], len(rows) > MAX_GROUPS
    )


def _running_use(row: Any) -> Use:
    """A running allocation's use; its jobs are counted when it ends."""
    milli = 0 if row.on_cpu else int(row.gpu_milli) * len(row.gpu_indices or ())
    return Use(milli, int(row.cpus), 0)


def _group_key(by: str, keys: Mapping[str, object], hour: int) -> object:
    if by == "hour":
        return hour
    if by == "day":
        return hour // 24
    return keys[by]


def _check(by: Sequence[str], start: float, end: float) -> None:
    unknown = [b for b in by if b not in GROUPS]
    if unknown:
        known = ", ".join(GROUPS)
        raise InvalidSpec("by", f"cannot group by {unknown[0]!r} (known: {known})")
    if len(set(by)) != len(by):
        raise InvalidSpec("by", "names a group twice")
    if "day" in by and "hour" in by:
        raise InvalidSpec("by", "group by day or by hour, not both")
    for name, when in (("to", end), ("from", start)):
        if not 0 <= when <= LAST_TIME:  # NaN too
            raise InvalidSpec(name, "must be a time between 1970 and 9999")
    if end < start:
        raise InvalidSpec("from", "must be a time before `to`")
    if end - start > MAX_RANGE_S:
        raise InvalidSpec("from", f"a report covers at most {MAX_RANGE_S / 86400:.0f} days")
