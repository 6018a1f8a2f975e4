"""The autoscaler's loop: gather the facts, call ``autoscale``, carry out the reply.

Every ``autoscale.tick_s`` the scheduling leader (one replica, as for
liveness and retention):

1. loads the ledger of machines it asked for (``loops/fleet.py``) and sends
   again any launch whose answer it never heard (same request id);
2. asks every provider which machines it runs, and notes in the ledger
   which ones are listed and which agents joined;
3. reads the nodes and which of them have work, and takes the jobs the last
   scheduling cycle left unplaced, with their reason codes;
4. decides (``corral.autoscaler.autoscale``: pure) on the fleet the providers
   list plus the launches in flight they do not list yet
   (``ledger.fleet``), with the back-off the ledger's failures imply;
5. drains idle members (``pause_reason`` ``autoscaler``, so a restarted or new
   leader knows which drains are its own), undrains those work came back
   for, terminates members to remove and forgets their nodes (only when
   empty), and launches machines named ``<pool>-<6 hex digits>`` whose
   agents join with ``agent_server`` and ``agent_token``, each written to the
   ledger before its provider is asked.

What is in flight, the back-off and the spend come from the ledger in the
store, so a restart or a new leader launches nothing twice. The clocks (when
a node became idle, when a job started waiting) live in memory: a new leader
starts them again, so it removes later and launches later, never sooner.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

from corral.autoscaler import (
    Config,
    Join,
    Member,
    Pending,
    Pool,
    Provider,
    Reply,
    Request,
    autoscale,
)
from corral.autoscaler.clocks import Clocks
from corral.autoscaler.ledger import HOUR_S, backoff, fleet, leaving, rate, spent
from corral.core.errors import Conflict, InvalidSpec, NotFound
from corral.server.autoscale_settings import AutoscaleSettings
from corral.server.loops.fleet import Fleet
from corral.server.loops.schedule import SchedulingLoop
from corral.server.services.auth import AuthService, TokenKind
from corral.server.services.nodes import DRAINED_BY_AUTOSCALER, NodeService
from corral.server.services.unit import Runtime
from corral.server.store import allocations as alloc_repo
from corral.server.store import nodes as node_repo
from corral.server.store.records import NodeRecord

log = logging.getLogger("corral.server.autoscale")

HISTORY = 20  # decisions that did something, kept for ``corral autoscaler status``
SWEEP_EVERY = 240  # decisions between two sweeps of ended ledger entries


@dataclass(frozen=True, slots=True)
class Decision:
    """One decision, for ``GET /v1/autoscaler``: what it saw, what it did, and why."""

    at: float
    members: tuple[Member, ...]
    reply: Reply
    states: Mapping[str, str]  # member -> launching | joined | draining | lost | terminating
    lines: tuple[str, ...]  # "launch 1 x g4090: 3 jobs waited 30 s"


@dataclass(frozen=True, slots=True)
class Spend:
    """What the fleet costs: per hour now (running and launching), and spent in the last
    hour, per pool; with the caps they are held to."""

    rate: Mapping[str, float]
    last_hour: Mapping[str, float]
    cap: float | None


class AutoscaleLoop:
    def __init__(
        self,
        rt: Runtime,
        scheduling: SchedulingLoop,
        providers: Provider | Mapping[str, Provider],
        pools: tuple[Pool, ...],
        auth: AuthService,
        nodes: NodeService,
        address: Callable[[], str | None],
        leading: Callable[[], bool] | None = None,
    ) -> None:
        self.rt = rt
        self.scheduling = scheduling
        # One provider alone serves the pools that name none ("").
        self.providers = dict(providers) if isinstance(providers, Mapping) else {"": providers}
        self.pools = pools
        self.auth = auth
        self.nodes = nodes
        self.address = address  # the agent link's address once it listens
        self.leading = leading or (lambda: True)
        self.fleet = Fleet(rt, self.providers, pools, nodes)
        self.last: Decision | None = None
        self.history: deque[Decision] = deque(maxlen=HISTORY)
        self.spend = Spend({}, {}, None)
        self.clocks = Clocks()  # since when nodes are idle and jobs wait
        self.backoff: dict[str, float] = {}
        self.ticks = 0
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
        """One decision, carried out; None when this replica does not lead."""
        if not self.leading():
            self.clocks.forget()  # a later leadership starts the clocks again
            return None
        now = self.rt.clock.now()
        await self.fleet.load(now)
        await self.fleet.resend(self._join, self.settings.boot_timeout_s)
        listed, failed = await self.fleet.listed()
        request = await self._request(now, listed, failed)
        # Pure and self-contained: on a worker thread, a decision over thousands of waiting
        # jobs (tens to hundreds of ms) lets the event loop keep serving meanwhile.
        reply = await asyncio.to_thread(autoscale, request)
        await self._apply(reply)
        self._account(now, listed, request, reply)
        self.ticks += 1
        if self.ticks % SWEEP_EVERY == 0:
            await self.fleet.sweep(now)
        return reply

    async def _request(self, now: float, listed: list[Member], failed: set[str]) -> Request:
        async with self.rt.db.read() as conn:
            records = await node_repo.all_nodes(conn)
            busy = frozenset(a.alloc.node for a in await alloc_repo.active(conn))
        nodes = {r.node.name: r.node for r in records}
        await self.fleet.upkeep(listed, failed, nodes)
        cfg = self._config()
        going = leaving(listed, self.fleet.entries)
        await self.fleet.chase(going, cfg.boot_timeout_s)
        held = backoff(self.fleet.entries, self.pools, now, cfg.backoff_s)
        for pool in self.pools:  # a provider that cannot list gets no launch until it can
            if pool.provider in failed:
                held[pool.name] = max(held.get(pool.name, 0.0), now + self.settings.tick_s)
        return Request(
            now=now,
            pools=self.pools,
            members=fleet(listed, self.fleet.entries),
            nodes=nodes,
            busy=busy,
            idle_since=self.clocks.idle(nodes, busy, now),
            draining=frozenset(r.node.name for r in records if _ours(r)),
            pending=self._pending(now),
            backoff=held,
            config=cfg,
            leaving=going,
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

    async def _apply(self, reply: Reply) -> None:
        for name in reply.drain:
            await self._mark(name, draining=True, reason=DRAINED_BY_AUTOSCALER)
        for name in reply.undrain:
            await self._mark(name, draining=False, reason=None)
        if reply.remove:
            await self.fleet.remove(reply.remove)
        pools = {p.name: p for p in self.pools}
        for launch in reply.launches:
            await self.fleet.launch(pools[launch.pool], launch.count, launch.reason, self._join)
        for unmet in reply.unmet:
            log.debug("autoscaler: job %s not served: %s", unmet.job_id, unmet.reason)

    async def _mark(self, name: str, *, draining: bool, reason: str | None) -> None:
        try:
            await self.nodes.mark(name, draining=draining, reason=reason)
        except (NotFound, Conflict) as e:  # gone or changed meanwhile: the next decision sees it
            log.info("autoscaler: %s %s skipped: %s", "drain" if draining else "undrain", name, e)

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

    def _account(self, now: float, listed: list[Member], request: Request, reply: Reply) -> None:
        """Keep the fleet as the decision left it, the back-off and the spend, for the
        status and the metrics."""
        entries = self.fleet.entries
        self.backoff = backoff(entries, self.pools, now, request.config.backoff_s)
        removed = {r.name for r in reply.remove}
        members = fleet([m for m in listed if m.name not in removed], entries)
        pools = {p.name: p for p in self.pools}
        self.spend = Spend(
            rate(members, pools),
            spent(entries, now - HOUR_S, now),
            request.config.max_spend_per_hour,
        )
        states = {m.name: _state(request, m.name) for m in members}
        decision = Decision(now, members, reply, states, tuple(explain(request, reply)))
        self.last = decision
        if not reply.idle:  # what was done, and why; waiting alone is in ``last``
            self.history.append(decision)
        counts: dict[tuple[str, str], int] = {}
        for m in members:
            counts[(m.pool, states[m.name])] = counts.get((m.pool, states[m.name]), 0) + 1
        self.rt.metrics.observe_members(counts)
        for pool in self.pools:
            self.rt.metrics.autoscaler_cost.labels(pool.name).set(self.spend.rate.get(pool.name, 0))


def explain(request: Request, reply: Reply) -> list[str]:
    """The decision as lines a person reads: what was done to which machines, and why."""
    lines = [f"launch {x.count} x {x.pool}: {x.reason}" for x in reply.launches]
    for name in reply.drain:
        idle = request.now - request.idle_since.get(name, request.now)
        lines.append(f"drain {name}: idle {idle:.0f} s")
    lines += [f"undrain {name}: work came back for it" for name in reply.undrain]
    lines += [f"remove {x.name} ({x.pool}): {x.reason}" for x in reply.remove]
    if reply.unmet:
        first = reply.unmet[0]
        lines.append(
            f"{len(reply.unmet)} waiting job(s) not served, e.g. {first.job_id}: {first.reason}"
        )
    return lines


def _state(request: Request, name: str) -> str:
    if name in request.leaving:
        return "terminating"
    node = request.nodes.get(name)
    if node is None:
        return "launching"
    if node.draining:
        return "draining"
    return "joined" if node.state.value == "ready" else node.state.value


def _ours(record: NodeRecord) -> bool:
    return record.node.draining and record.pause_reason == DRAINED_BY_AUTOSCALER
