"""The provider seam: what starts and stops machines (DESIGN.md section 4).

A provider is three calls. ``members()`` lists the machines it runs for
corral (the source of truth for what exists); ``launch(pool, names, join)``
starts one machine per name, whose agent must join as that node name with
``join.server`` and ``join.token``; ``terminate(names)`` stops them (names it
does not run are no error: a terminate may be retried). Real providers run a
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

    async def launch(self, pool: Pool, names: Sequence[str], join: Join) -> None: ...

    async def terminate(self, names: Sequence[str]) -> None: ...


class SimulatedProvider:
    """Machines as a dict: launched at ``now()``, gone when terminated.

    ``fail_pools`` makes launches of those pools fail, as a cloud out of
    capacity does. ``launched`` keeps every launch, in order, for tests.
    """

    def __init__(self, now: Callable[[], float], fail_pools: Sequence[str] = ()) -> None:
        self.now = now
        self.fail_pools = set(fail_pools)
        self.running: dict[str, Member] = {}
        self.launched: list[tuple[str, str, Join]] = []

    async def members(self) -> list[Member]:
        return list(self.running.values())

    async def launch(self, pool: Pool, names: Sequence[str], join: Join) -> None:
        if pool.name in self.fail_pools:
            raise ProviderError(f"launch {pool.name}: no capacity (simulated)")
        for name in names:
            self.running[name] = Member(name, pool.name, self.now())
            self.launched.append((name, pool.name, join))

    async def terminate(self, names: Sequence[str]) -> None:
        for name in names:
            self.running.pop(name, None)
