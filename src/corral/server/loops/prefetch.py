"""After a scheduling cycle: suggest popular models to idle agents (the prefetch policy).

The decision is the pure ``corral.scheduler.prefetch.plan_prefetch``; this is
its shell. It runs after scheduling cycles (at most every
``models.prefetch_interval_s``), on what the cycle left queued, with each
node's cache budget and downloads as its agent reported them, and sends each
chosen node a ``Prefetch`` message with the models' registry entries. Agents
download them in the background, behind any job's own download.

A suggestion is not repeated for ``RESEND_S`` (the agent's next report shows
the download, or the model on disk, and the policy counts it as a copy).
Only agents connected to this replica (the scheduling leader) get hints.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from operator import attrgetter

from corral.core.errors import LinkError
from corral.scheduler.api import Plan, Snapshot
from corral.scheduler.prefetch import CacheState, Prefetch, plan_prefetch
from corral.server.agentlink.base import AgentLink
from corral.server.agentlink.model_wire import ModelRef
from corral.server.services.model_status import ModelStatusService
from corral.server.services.models import ModelService
from corral.server.services.unit import Runtime

log = logging.getLogger("corral.server.prefetch")

RESEND_S = 120.0
"""A hint for a (node, model) is sent again at most this often."""

POPULARITY_HALF_S = 300.0
"""Recent demand per model (jobs seen queued) halves every five minutes."""

_MODEL = attrgetter("model")
_ID = attrgetter("id")


class PrefetchLoop:
    def __init__(
        self,
        rt: Runtime,
        models: ModelService,
        status: ModelStatusService,
        transport: Callable[[], AgentLink],
    ) -> None:
        self.rt = rt
        self.models = models
        self.status = status
        self.transport = transport
        self.sent: dict[tuple[str, str], float] = {}  # (node, model) -> when hinted
        self.popularity: dict[str, float] = {}  # model -> decayed count of jobs asking for it
        self._seen: set[str] = set()  # queued job ids already counted
        self._counted_at = 0.0
        self._last = float("-inf")

    async def after_cycle(self, snapshot: Snapshot, plan: Plan) -> list[Prefetch]:
        """Run the policy on what the cycle left, and tell the chosen agents."""
        settings = self.rt.settings.models
        now = self.rt.clock.now()
        self._count(snapshot, now)
        if not settings.prefetch or now - self._last < settings.prefetch_interval_s:
            return []
        self._last = now
        left, caches = await self._inputs(snapshot, plan)
        hints = plan_prefetch(left, caches, popularity=self.popularity)
        chosen = [p for p in hints if self._new(p)]
        if chosen:
            await self._send(chosen, now)
        return chosen

    async def _inputs(
        self, snapshot: Snapshot, plan: Plan
    ) -> tuple[Snapshot, dict[str, CacheState]]:
        """What the cycle left queued, on the nodes it left idle, and their caches."""
        placed = {j for p in plan.placements for j in p.job_ids}
        busy = {p.node for p in plan.placements}
        left = replace(
            snapshot,
            nodes=tuple(n for n in snapshot.nodes if n.name not in busy),
            queued=tuple(j for j in snapshot.queued if j.id not in placed),
            model_sizes=self.models.catalog.sizes(),
        )
        async with self.rt.db.read() as conn:
            budgets = await self.status.budgets(conn)
        fetching = self.status.in_flight()
        caches = {
            node: CacheState(b.budget_bytes, b.used_bytes, fetching.get(node, frozenset()))
            for node, b in budgets.items()
        }
        return left, caches

    def _count(self, snapshot: Snapshot, now: float) -> None:
        """Recent demand: every job seen queued counts once for its model, decaying."""
        decay = 0.5 ** (max(0.0, now - self._counted_at) / POPULARITY_HALF_S)
        self._counted_at = now
        self.popularity = {m: v * decay for m, v in self.popularity.items() if v * decay > 0.01}
        modelled = tuple(filter(_MODEL, snapshot.queued))  # C-level: the queue may be deep
        for job in modelled:
            model = job.model
            if model and job.id not in self._seen:
                self.popularity[model] = self.popularity.get(model, 0.0) + 1.0
        self._seen = set(map(_ID, modelled))

    def _new(self, p: Prefetch) -> bool:
        at = self.sent.get((p.node, p.model))
        return at is None or self.rt.clock.now() - at >= RESEND_S

    async def _send(self, chosen: list[Prefetch], now: float) -> None:
        by_node: dict[str, list[ModelRef]] = defaultdict(list)
        for p in chosen:
            ref = self.models.catalog.ref(p.model)
            if ref is not None:
                by_node[p.node].append(ref)
                log.info("prefetch %s on %s: %s", p.model, p.node, p.reason)
        link = self.transport()
        send = getattr(link, "prefetch", None)
        if send is None:
            return  # a link without hints (the in-process stub): nothing to do
        for node, refs in by_node.items():
            try:
                await send(node, refs)
            except LinkError as exc:
                log.info("prefetch hint for %s not sent: %s", node, exc)
                continue
            for ref in refs:
                self.sent[(node, ref.name)] = now
