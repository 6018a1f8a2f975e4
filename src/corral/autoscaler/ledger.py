"""What the autoscaler asked providers for, and what it makes of that (pure).

A provider's ``list`` lags behind its ``launch`` (every cloud API does: a
machine asked for a second ago is not listed yet), so what the provider lists
is not enough to count the fleet: counted from the list alone, the same
waiting job starts a machine at every decision until the first one shows up.
The server therefore writes down every machine it asks for, before it asks
(a ``Launched`` row, in the store), and these functions turn that ledger and
the provider's list into the fleet the policy decides on:

* a machine asked for counts (against ``max_nodes``, the spend caps, and as
  room for waiting work) from the moment it is asked for until it ends: it
  is terminated, its launch failed, or the provider stopped listing it after
  having listed it once. One never listed and never joined ends when the
  policy removes it after ``boot_timeout_s``. One terminated that the
  provider still lists keeps counting against the caps (``leaving``);
* a pool backs off for ``backoff_s`` after a machine of it did not join in
  time, and every pool of a provider after that provider failed a launch: the
  next cheapest pool that fits takes the work meanwhile;
* spend is the cost of each machine over the time it ran, from the ledger,
  so it survives restarts and a change of leader like the ledger does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from corral.autoscaler.api import Member, Pool

HOUR_S = 3600.0


class Outcome:
    """Why a machine's ledger entry ended (``""``: it has not)."""

    OPEN = ""
    LAUNCH_FAILED = "launch_failed"  # the provider refused or failed the launch call
    NOT_JOINED = "not_joined"  # removed: its agent did not join within boot_timeout_s
    REMOVED = "removed"  # removed by the policy: idle, or its node was lost
    VANISHED = "vanished"  # the provider listed it once and lists it no more

    FAILURES = frozenset({LAUNCH_FAILED, NOT_JOINED})
    TERMINATED = frozenset({NOT_JOINED, REMOVED})  # the autoscaler asked for it to stop


@dataclass(frozen=True, slots=True)
class Launched:
    """One machine the autoscaler asked a provider for, as the store keeps it."""

    name: str
    pool: str
    provider: str
    request_id: str  # the launch call's: the provider deduplicates a call sent again on it
    asked_at: float
    cost_per_hour: float
    sent: bool = False  # the provider accepted the launch call
    listed: bool = False  # the provider has listed it at least once
    joined: bool = False  # its agent has joined at least once
    ended_at: float | None = None
    outcome: str = Outcome.OPEN
    reason: str = ""

    @property
    def open(self) -> bool:
        return self.ended_at is None


def fleet(listed: Sequence[Member], launched: Iterable[Launched]) -> tuple[Member, ...]:
    """The machines to decide on: every one the provider lists, and every one asked for
    that it does not list yet. A machine's boot is timed from when it was asked for."""
    asked = {x.name: x for x in launched if x.open}
    out = [
        Member(m.name, m.pool, min(m.launched_at, asked[m.name].asked_at)) if m.name in asked else m
        for m in listed
    ]
    shown = {m.name for m in listed}
    out += [Member(x.name, x.pool, x.asked_at) for x in asked.values() if x.name not in shown]
    return tuple(out)


def leaving(listed: Sequence[Member], launched: Iterable[Launched]) -> frozenset[str]:
    """Machines the provider still lists though the autoscaler terminated them (its list
    lags behind terminates too): they cost until they are gone, so they count against
    ``max_nodes`` and the spend caps, but they take no work and are not removed again."""
    by_name: dict[str, Launched] = {}
    for x in launched:  # the latest entry of a name decides
        if x.name not in by_name or x.asked_at >= by_name[x.name].asked_at:
            by_name[x.name] = x
    return frozenset(
        m.name
        for m in listed
        if (last := by_name.get(m.name)) is not None and last.outcome in Outcome.TERMINATED
    )


def vanished(listed: Sequence[Member], launched: Iterable[Launched]) -> list[str]:
    """Open entries the provider listed once and lists no more: their machines are gone
    (a spot reclaim, someone in the cloud console), so they no longer count."""
    shown = {m.name for m in listed}
    return sorted(x.name for x in launched if x.open and x.listed and x.name not in shown)


def backoff(
    launched: Iterable[Launched], pools: Sequence[Pool], now: float, backoff_s: float
) -> dict[str, float]:
    """Until when each pool gets no launch, from the failures in the ledger.

    A machine that did not join backs off its pool (the cloud may be out of that
    machine); a failed launch call backs off every pool of its provider (its API
    is down or refuses). Either way the next cheapest pool that fits is used."""
    until: dict[str, float] = {}
    by_provider: dict[str, list[str]] = {}
    for pool in pools:
        by_provider.setdefault(pool.provider, []).append(pool.name)
    for x in launched:
        if x.ended_at is None or x.outcome not in Outcome.FAILURES:
            continue
        end = x.ended_at + backoff_s
        if end <= now:
            continue
        hit = by_provider.get(x.provider, []) if x.outcome == Outcome.LAUNCH_FAILED else [x.pool]
        for name in hit:
            until[name] = max(until.get(name, 0.0), end)
    return until


def spent(launched: Iterable[Launched], since: float, now: float) -> dict[str, float]:
    """Money spent per pool between ``since`` and ``now``: each machine's cost per hour
    over the part of its life (asked for until ended, or now) in that window. A launch
    that failed cost nothing."""
    out: dict[str, float] = {}
    for x in launched:
        if x.outcome == Outcome.LAUNCH_FAILED:
            continue
        start = max(x.asked_at, since)
        end = min(now if x.ended_at is None else x.ended_at, now)
        if end > start:
            out[x.pool] = out.get(x.pool, 0.0) + x.cost_per_hour * (end - start) / HOUR_S
    return out


def rate(members: Iterable[Member], pools: Mapping[str, Pool]) -> dict[str, float]:
    """What the machines cost per hour now, per pool (members of pools no longer
    configured cost nothing the autoscaler knows of)."""
    out: dict[str, float] = {}
    for m in members:
        pool = pools.get(m.pool)
        if pool is not None:
            out[m.pool] = out.get(m.pool, 0.0) + pool.cost_per_hour
    return out
