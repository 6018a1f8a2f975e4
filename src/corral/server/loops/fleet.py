"""The autoscaler's ledger in the store, and the provider calls that go with it.

Every machine is written down before its provider is asked for it
(``autoscale_machines``; ``corral.autoscaler.ledger`` says what is made of it),
so what is in flight is known from the store, not from memory: after a
restart, or on a new leader, launches in flight still count against
``max_nodes`` and the spend caps, and a launch whose answer was never heard
(the server stopped in between) is sent again with the same request id, which
the provider deduplicates. Nothing is launched twice.

Several providers at once: each pool names its provider; a provider whose
``list`` fails keeps its machines counted from the ledger and gets no launch
until it answers again.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

from corral.autoscaler import Join, Member, Pool, Provider, ProviderError, Removal
from corral.autoscaler.ledger import Launched, Outcome, vanished
from corral.core.events import EventKind
from corral.server.services.nodes import NodeService
from corral.server.services.unit import Runtime
from corral.server.store import launches as ledger_repo

log = logging.getLogger("corral.server.autoscale")

KEPT_S = 86400.0  # ended entries are kept a day: the back-off and the spend figures read them


class Fleet:
    """The ledger (``entries``, as last loaded) and the calls to the providers."""

    def __init__(
        self,
        rt: Runtime,
        providers: Mapping[str, Provider],
        pools: Sequence[Pool],
        nodes: NodeService,
    ) -> None:
        self.rt = rt
        self.providers = providers
        self.pools = {p.name: p for p in pools}
        self.nodes = nodes
        self.entries: list[Launched] = []
        self.chased: dict[str, float] = {}  # terminated, still listed -> last terminate sent

    async def load(self, now: float) -> list[Launched]:
        async with self.rt.db.read() as conn:
            self.entries = await ledger_repo.recent(conn, now - KEPT_S)
        return self.entries

    async def resend(self, join: Callable[[], Awaitable[Join]], boot_timeout_s: float) -> None:
        """Send again the launches written down whose answer was never heard (the server
        stopped between writing and hearing): the same request id, so the provider starts
        each machine once. One older than ``boot_timeout_s`` is not sent again: the policy
        removes it (a terminate, in case the first call did arrive)."""
        now = self.rt.clock.now()
        unsent: dict[str, list[Launched]] = {}
        for x in self.entries:
            if x.open and not x.sent and now - x.asked_at < boot_timeout_s:
                unsent.setdefault(x.request_id, []).append(x)
        for request_id, group in unsent.items():
            pool = self.pools.get(group[0].pool)
            names = [x.name for x in group]
            if pool is None:
                await self._end(names, Outcome.LAUNCH_FAILED, "its pool is no longer configured")
                continue
            log.info("autoscaler: sending launch %s again: %s", request_id, names)
            await self._send(pool, names, request_id, join)

    async def listed(self) -> tuple[list[Member], set[str]]:
        """What every provider lists, and the providers whose list failed."""
        members: list[Member] = []
        failed: set[str] = set()
        for name, provider in self.providers.items():
            try:
                members += await provider.members()
            except ProviderError as e:
                failed.add(name)
                self.failed("list", e)
        return members, failed

    async def upkeep(self, listed: list[Member], failed: set[str], joined: Iterable[str]) -> None:
        """Note what the providers list and which agents joined; end the entries whose
        machine a provider listed once and lists no more."""
        answered = [x for x in self.entries if x.provider not in failed]
        gone = vanished(listed, answered)
        shown = {m.name for m in listed}
        seen = [x.name for x in self.entries if x.open and not x.listed and x.name in shown]
        nodes = set(joined)
        came = [x.name for x in self.entries if x.open and not x.joined and x.name in nodes]
        if not (gone or seen or came):
            return
        now = self.rt.clock.now()
        why = "its provider no longer lists it"
        async with self.rt.tx() as tx:
            await ledger_repo.mark(tx.conn, seen, listed=True)
            await ledger_repo.mark(tx.conn, came, joined=True)
            await ledger_repo.end(tx.conn, gone, now, Outcome.VANISHED, why)
        for name in gone:
            log.info("autoscaler: %s ended: %s", name, why)
        self._note(seen, listed=True)
        self._note(came, joined=True)
        self._note(gone, ended_at=now, outcome=Outcome.VANISHED, reason=why)

    async def launch(
        self, pool: Pool, count: int, reason: str, join: Callable[[], Awaitable[Join]]
    ) -> list[str]:
        """Write ``count`` machines of ``pool`` down, then ask its provider for them; the
        names asked for (each counts from now until it ends)."""
        now = self.rt.clock.now()
        request_id = uuid.uuid4().hex
        names = [f"{pool.name}-{secrets.token_hex(3)}" for _ in range(count)]
        rows = [
            Launched(n, pool.name, pool.provider, request_id, now, pool.cost_per_hour)
            for n in names
        ]
        async with self.rt.tx() as tx:
            await ledger_repo.insert(tx.conn, rows)
            for name in names:
                tx.emit(
                    EventKind.NODE_LAUNCHED,
                    team=None,
                    node=name,
                    pool=pool.name,
                    provider=pool.provider,
                    request_id=request_id,
                    reason=reason,
                )
        self.entries += rows
        if await self._send(pool, names, request_id, join):
            self.rt.metrics.autoscaler_launched.labels(pool.name).inc(count)
            log.info("autoscaler: launched %d x %s (%s): %s", count, pool.name, reason, names)
        return names

    async def remove(self, removals: Sequence[Removal]) -> None:
        """Terminate each provider's machines, then end their entries and forget their
        nodes; a machine that never joined is said so in an event and a metric."""
        by_provider: dict[str, list[Removal]] = {}
        for r in removals:
            by_provider.setdefault(self._provider_of(r.name, r.pool), []).append(r)
        for provider, group in by_provider.items():
            try:
                await self.providers[provider].terminate([r.name for r in group])
            except (ProviderError, KeyError) as e:
                self.failed("terminate", e)
                continue
            for r in group:
                await self._removed(r)

    async def chase(self, names: frozenset[str], after_s: float) -> None:
        """Terminate again the machines a provider still lists ``after_s`` after they were
        terminated (at most once per ``after_s``): a terminate that was lost must not leave
        a machine costing money for ever."""
        now = self.rt.clock.now()
        ended = {x.name: x for x in self.entries if x.ended_at is not None}
        due: dict[str, list[str]] = {}
        for name in names:
            x = ended.get(name)
            last = self.chased.get(name, x.ended_at if x and x.ended_at is not None else now)
            if x is not None and now - last >= after_s:
                due.setdefault(x.provider, []).append(name)
        self.chased = {n: t for n, t in self.chased.items() if n in names}
        for provider, group in due.items():
            try:
                await self.providers[provider].terminate(group)
            except (ProviderError, KeyError) as e:
                self.failed("terminate", e)
                continue
            log.warning("autoscaler: %s still listed long after its terminate: sent again", group)
            for name in group:
                self.chased[name] = now

    def failed(self, call: str, error: Exception) -> None:
        self.rt.metrics.autoscaler_errors.labels(call).inc()
        log.warning("autoscaler: provider %s failed: %s", call, error)

    async def _send(
        self,
        pool: Pool,
        names: list[str],
        request_id: str,
        join: Callable[[], Awaitable[Join]],
    ) -> bool:
        provider = self.providers.get(pool.provider)
        try:
            if provider is None:
                raise ProviderError(f"pool {pool.name}: no provider named {pool.provider!r}")
            await provider.launch(pool, names, await join(), request_id=request_id)
        except (ProviderError, ValueError) as e:  # InvalidSpec: no address to hand out
            self.failed("launch", e)
            # Its node.launched events are out: the stream says these machines will not come.
            await self._end(names, Outcome.LAUNCH_FAILED, f"launch failed: {e}", events=True)
            return False
        async with self.rt.tx() as tx:
            await ledger_repo.mark(tx.conn, names, sent=True)
        self._note(names, sent=True)
        return True

    async def _removed(self, r: Removal) -> None:
        outcome = Outcome.NOT_JOINED if r.code == "not_joined" else Outcome.REMOVED
        why = f"autoscaler: {r.reason}"
        await self._end([r.name], outcome, r.reason)
        gone = await self.nodes.forget(r.name, why)
        if not gone and r.code == "not_joined":  # no node to forget: the event says it anyway
            async with self.rt.tx() as tx:
                tx.emit(EventKind.NODE_REMOVED, team=None, node=r.name, data={"reason": why})
        if r.code == "not_joined":
            self.rt.metrics.autoscaler_not_joined.labels(r.pool).inc()
        self.rt.metrics.autoscaler_removed.labels(r.pool).inc()
        log.info("autoscaler: removed %s (%s)", r.name, r.reason)

    async def _end(self, names: list[str], outcome: str, why: str, events: bool = False) -> None:
        now = self.rt.clock.now()
        async with self.rt.tx() as tx:
            await ledger_repo.end(tx.conn, names, now, outcome, why)
            for name in names if events else ():
                tx.emit(EventKind.NODE_REMOVED, team=None, node=name, data={"reason": why})
        self._note(names, ended_at=now, outcome=outcome, reason=why[:512])

    def _provider_of(self, name: str, pool: str) -> str:
        for x in self.entries:
            if x.name == name:
                return x.provider
        known = self.pools.get(pool)
        return known.provider if known is not None else ""

    def _note(self, names: Iterable[str], **values: object) -> None:
        """Apply a change just written to the entries held in memory."""
        wanted = set(names)
        self.entries = [
            dataclasses.replace(x, **values) if x.name in wanted and x.open else x  # type: ignore[arg-type]
            for x in self.entries
        ]

    async def sweep(self, now: float) -> None:
        async with self.rt.tx(durable=False) as tx:
            await ledger_repo.sweep(tx.conn, now - KEPT_S)
