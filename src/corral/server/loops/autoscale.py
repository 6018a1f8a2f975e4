"""The autoscaler's loop: gather the facts, call ``autoscale``, carry out the reply.

Every ``autoscale.tick_s`` the scheduling leader (one replica, as for
liveness and retention):

1. asks the provider which machines it runs (``members``);
2. reads the nodes and which of them have work, and takes the jobs the last
   scheduling cycle left unplaced, with their reason codes;
3. decides (``corral.autoscaler.autoscale``: pure);
4. drains idle members (``pause_reason`` ``autoscaler``, so a restarted or new
   leader knows which drains are its own), undrains those work came back
   for, terminates members to remove and forgets their nodes (only when
   empty), and launches machines named ``<pool>-<6 hex digits>`` whose
   agents join with ``agent_server`` and ``agent_token``.

What the loop remembers between decisions (when a node became idle, when a
job started waiting, which pools back off) lives in memory: a new leader
starts those clocks again, so it removes later and launches later, never
sooner. A provider call that fails is logged and counted
(``corral_autoscaler_errors_total``); a failed launch backs its pool off for
``backoff_s``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, fields

from corral.autoscaler import (
    Config,
    Join,
    Member,
    Pending,
    Pool,
    Provider,
    ProviderError,
    Reply,
    Request,
    autoscale,
)
from corral.autoscaler.clocks import Clocks
from corral.core.errors import Conflict, InvalidSpec, NotFound
from corral.server.loops.schedule import SchedulingLoop
from corral.server.services.auth import AuthService, TokenKind
from corral.server.services.nodes import DRAINED_BY_AUTOSCALER, NodeService
from corral.server.services.unit import Runtime
from corral.server.settings import AutoscaleSettings
from corral.server.store import allocations as alloc_repo
from corral.server.store import nodes as node_repo
from corral.server.store.records import NodeRecord

log = logging.getLogger("corral.server.autoscale")


@dataclass(frozen=True, slots=True)
class Decision:
    """The last decision, for ``GET /v1/autoscaler``."""

    at: float
    members: tuple[Member, ...]
    reply: Reply


class AutoscaleLoop:
    def __init__(
        self,
        rt: Runtime,
        scheduling: SchedulingLoop,
        provider: Provider,
        pools: tuple[Pool, ...],
        auth: AuthService,
        nodes: NodeService,
        address: Callable[[], str | None],
        leading: Callable[[], bool] | None = None,
    ) -> None:
        self.rt = rt
        self.scheduling = scheduling
        self.provider = provider
        self.pools = pools
        self.auth = auth
        self.nodes = nodes
        self.address = address  # the agent link's address once it listens
        self.leading = leading or (lambda: True)
        self.last: Decision | None = None
        self.clocks = Clocks()  # since when nodes are idle and jobs wait
        self.backoff: dict[str, float] = {}
        self._token: str | None = None
        # The token as launched agents get it: with the certificate's pin when the server's
        # is self-signed (server/tls.py), so they join over grpcs:// with no more setup.
        self.join_token: Callable[[str], str] = lambda token: token

    @property
    def settings(self) -> AutoscaleSettings:
        return self.rt.settings.autoscale

    async def run(self) -> None:
        while True:
            await self.rt.clock.sleep(self.settings.tick_s)
            try:
                await self.tick()
            except Exception:  # keep deciding even if one pass hits a bad row or provider
                log.exception("autoscaler decision failed")

    async def tick(self) -> Reply | None:
        """One decision, carried out; None when this replica does not lead or the provider
        could not list its machines."""
        if not self.leading():
            self.clocks.forget()  # a later leadership starts the clocks again
            return None
        now = self.rt.clock.now()
        try:
            members = tuple(await self.provider.members())
        except ProviderError as e:
            self._failed("list", e)
            return None
        request = await self._request(now, members)
        # Pure and self-contained: on a worker thread, a decision over thousands of waiting
        # jobs (tens to hundreds of ms) lets the event loop keep serving meanwhile.
        reply = await asyncio.to_thread(autoscale, request)
        self.backoff = dict(reply.backoff)
        await self._apply(now, reply)
        self.last = Decision(now, members, reply)
        self._observe(members, request)
        return reply

    async def _request(self, now: float, members: tuple[Member, ...]) -> Request:
        async with self.rt.db.read() as conn:
            records = await node_repo.all_nodes(conn)
            busy = frozenset(a.alloc.node for a in await alloc_repo.active(conn))
        nodes = {r.node.name: r.node for r in records}
        return Request(
            now=now,
            pools=self.pools,
            members=members,
            nodes=nodes,
            busy=busy,
            idle_since=self.clocks.idle(nodes, busy, now),
            draining=frozenset(r.node.name for r in records if _ours(r)),
            pending=self._pending(now),
            backoff=self.backoff,
            config=self._config(),
        )

    def _pending(self, now: float) -> tuple[Pending, ...]:
        known = self.scheduling.kept.records
        unplaced = sorted(self.scheduling.unplaced.values(), key=lambda u: u.position)
        waiting = (
            (known[u.job_id].job, frozenset(r.code for r in u.reasons))
            for u in unplaced
            if u.job_id in known
        )
        return self.clocks.pending(waiting, now)

    def _config(self) -> Config:
        """The decision's knobs: the ``autoscale.*`` settings of the same names."""
        return Config(**{f.name: getattr(self.settings, f.name) for f in fields(Config)})

    async def _apply(self, now: float, reply: Reply) -> None:
        for name in reply.drain:
            await self._mark(name, draining=True, reason=DRAINED_BY_AUTOSCALER)
        for name in reply.undrain:
            await self._mark(name, draining=False, reason=None)
        if reply.remove:
            await self._remove(reply)
        for launch in reply.launches:
            await self._launch(now, launch.pool, launch.count, launch.reason)
        for unmet in reply.unmet:
            log.debug("autoscaler: job %s not served: %s", unmet.job_id, unmet.reason)

    async def _mark(self, name: str, *, draining: bool, reason: str | None) -> None:
        try:
            await self.nodes.mark(name, draining=draining, reason=reason)
        except (NotFound, Conflict) as e:  # gone or changed meanwhile: the next decision sees it
            log.info("autoscaler: %s %s skipped: %s", "drain" if draining else "undrain", name, e)

    async def _remove(self, reply: Reply) -> None:
        names = [r.name for r in reply.remove]
        try:
            await self.provider.terminate(names)
        except ProviderError as e:
            self._failed("terminate", e)
            return
        for removal in reply.remove:
            gone = await self.nodes.forget(removal.name, f"autoscaler: {removal.reason}")
            self.rt.metrics.autoscaler_removed.labels(removal.pool).inc()
            log.info(
                "autoscaler: removed %s (%s)%s",
                removal.name,
                removal.reason,
                "" if gone else "; its node still has work and stays listed",
            )

    async def _launch(self, now: float, pool_name: str, count: int, reason: str) -> None:
        pool = next(p for p in self.pools if p.name == pool_name)
        names = [f"{pool.name}-{secrets.token_hex(3)}" for _ in range(count)]
        try:
            join = await self._join()
            await self.provider.launch(pool, names, join)
        except (ProviderError, InvalidSpec) as e:
            self.backoff[pool.name] = now + self.settings.backoff_s
            self._failed("launch", e)
            return
        self.rt.metrics.autoscaler_launched.labels(pool.name).inc(count)
        await self.nodes.launched(names, pool.name, reason)
        log.info("autoscaler: launched %d x %s (%s): %s", count, pool.name, reason, names)

    async def _join(self) -> Join:
        server = self.settings.agent_server or self.address()
        if not server:
            raise InvalidSpec("autoscale.agent_server", "set it: the agent link is not listening")
        if any(f"//{wild}:" in server for wild in ("0.0.0.0", "[::]")):
            raise InvalidSpec(
                "autoscale.agent_server",
                f"set it: the agent link listens on {server}, which no machine can dial",
            )
        if self._token is None:
            given = self.settings.agent_token
            if given is not None:
                self._token = given.get_secret_value()
            else:
                _, self._token = await self.auth.create(TokenKind.AGENT, "autoscaler", None)
        return Join(server, self.join_token(self._token))

    def _failed(self, call: str, error: Exception) -> None:
        self.rt.metrics.autoscaler_errors.labels(call).inc()
        log.warning("autoscaler: provider %s failed: %s", call, error)

    def _observe(self, members: tuple[Member, ...], request: Request) -> None:
        counts: dict[tuple[str, str], int] = {}
        for m in members:
            node = request.nodes.get(m.name)
            state = "booting" if node is None else "draining" if node.draining else node.state
            counts[(m.pool, str(state))] = counts.get((m.pool, str(state)), 0) + 1
        self.rt.metrics.observe_members(counts)


def _ours(record: NodeRecord) -> bool:
    return record.node.draining and record.pause_reason == DRAINED_BY_AUTOSCALER
