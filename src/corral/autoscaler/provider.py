"""The provider seam: what starts and stops machines (DESIGN.md section 4).

A provider is three calls. ``members()`` lists the machines it runs for
corral; ``launch(pool, names, join, request_id=...)`` starts one machine per
name, whose agent must join as that node name with ``join.server`` and
``join.token``; ``terminate(names)`` stops them (names it does not run are no
error: a terminate may be retried).

The list may lag behind a launch (cloud APIs do): corral counts what it asked
for from its own ledger until the machine is listed or joins, so a lagging
list never starts a second machine. A launch is sent again with the same
``request_id`` when the server could not tell whether the first one arrived
(it stopped between writing the launch down and hearing the answer): a
provider starts the machines of one request id once. Real providers run a
command or call a webhook (``corral.server.providers``); ``SimulatedProvider``
below is the in-memory stub tests use, and every one passes the same
conformance suite (``corral.autoscaler.testing``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from corral.autoscaler.api import Member, Pool


@dataclass(frozen=True, slots=True)
class Join:
    """How a launched machine's agent reaches the server: ``corral agent --server S --token T``."""

    server: str
    token: str


class ProviderError(Exception):
    """A provider call failed; the message says which call and why."""


@runtime_checkable
class Provider(Protocol):
    async def members(self) -> list[Member]: ...

    async def launch(
        self, pool: Pool, names: Sequence[str], join: Join, *, request_id: str
    ) -> None: ...

    async def terminate(self, names: Sequence[str]) -> None: ...


class SimulatedProvider:
    """Machines as a dict: launched at ``now()``, gone when terminated.

    ``fail_pools`` makes launches of those pools fail, as a cloud out of
    capacity does. ``lag_s`` hides a machine from ``members()`` until it has
    run that long, as a cloud API's list does. A request id seen before starts
    nothing. ``launched`` keeps every machine started, in order, for tests.
    """

    def __init__(
        self, now: Callable[[], float], fail_pools: Sequence[str] = (), lag_s: float = 0.0
    ) -> None:
        self.now = now
        self.fail_pools = set(fail_pools)
        self.lag_s = lag_s
        self.running: dict[str, Member] = {}
        self.launched: list[tuple[str, str, Join]] = []
        self.requests: set[str] = set()

    async def members(self) -> list[Member]:
        shown = self.now() - self.lag_s
        return [m for m in self.running.values() if m.launched_at <= shown]

    async def launch(
        self, pool: Pool, names: Sequence[str], join: Join, *, request_id: str
    ) -> None:
        if pool.name in self.fail_pools:
            raise ProviderError(f"launch {pool.name}: no capacity (simulated)")
        if request_id in self.requests:
            return
        self.requests.add(request_id)
        for name in names:
            self.running[name] = Member(name, pool.name, self.now())
            self.launched.append((name, pool.name, join))

    async def terminate(self, names: Sequence[str]) -> None:
        for name in names:
            self.running.pop(name, None)
