"""The control plane without HTTP: runtime, services and loops, started and stopped together.

``app.py`` wraps it in a FastAPI app; tests may drive it directly (call
``schedule.cycle()`` and ``liveness.tick()`` instead of running the loops).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from corral.autoscaler import Pool, Provider
from corral.server.agentlink.base import AgentLink
from corral.server.agentlink.relay import RelayLink
from corral.server.loops.autoscale import AutoscaleLoop
from corral.server.loops.dependencies import ReleaseLoop
from corral.server.loops.leader import LEADER_LOCK, AdvisoryLockLeader, AlwaysLeader, Leadership
from corral.server.loops.liveness import LivenessLoop
from corral.server.loops.prefetch import PrefetchLoop
from corral.server.loops.retention import RetentionLoop
from corral.server.loops.schedule import SchedulingLoop
from corral.server.loops.waits import WaitBoard
from corral.server.loops.webhooks import WebhookLoop
from corral.server.services.agents import AgentService
from corral.server.services.audit import AuditService
from corral.server.services.auth import AuthService
from corral.server.services.delivery import Delivery
from corral.server.services.feed import EventFeed, QueueService
from corral.server.services.group import GroupCommitter
from corral.server.services.inputs import InputService
from corral.server.services.jobs import JobService
from corral.server.services.model_status import ModelStatusService
from corral.server.services.models import ModelService
from corral.server.services.nodes import NodeService
from corral.server.services.pipelines import PipelineService
from corral.server.services.policy import PolicyService
from corral.server.services.quotas import TeamQuotas
from corral.server.services.rates import RateLimits
from corral.server.services.streams import StreamGate
from corral.server.services.unit import Runtime
from corral.server.services.webhooks import WebhookService
from corral.server.store.db import lock_key
from corral.server.store.notify import Note, Notifier, PgNotifier
from corral.server.tls import ServerTls

log = logging.getLogger("corral.server")


@dataclass(frozen=True, slots=True)
class StartReport:
    """What the banner prints: where state lives and, on first start, the admin token."""

    db: str
    blobs: str
    admin_token: str | None


class ControlPlane:
    def __init__(
        self,
        rt: Runtime,
        *,
        run_loops: bool = True,
        scaling: tuple[Mapping[str, Provider], tuple[Pool, ...]] | None = None,
    ) -> None:
        self.rt = rt
        self.run_loops = run_loops
        self.auth = AuthService(rt)
        self.audit = AuditService(rt)  # who did what (docs/security/audit.md)
        # One writer queue for submissions and agents' updates: under load a group of both
        # is one transaction and one fsync instead of two (docs/performance.md, "End to end").
        writes = GroupCommitter(rt)
        self.rates = RateLimits(rt.settings.limits, rt.clock)  # per team token
        self.inputs = InputService(rt)  # files uploaded for jobs to read
        self.policy = PolicyService(rt)  # classes, entitlements, caps (docs/server.md)
        self.jobs = JobService(rt, writes, self.rates, TeamQuotas(rt), self.inputs, self.policy)
        self.nodes = NodeService(rt)
        self.agents = AgentService(rt, self.auth, writes)
        self.feed = EventFeed(rt)
        self.streams = StreamGate(rt.settings.limits)  # open event streams, capped
        self.models = ModelService(rt)  # the registry (issue 10)
        self.model_status = ModelStatusService(rt)  # where models are, from agents' reports
        leader: Leadership = AlwaysLeader()
        if rt.db.is_postgres:
            leader = AdvisoryLockLeader(rt.db.engine, lock_key(LEADER_LOCK, rt.db.target.schema))
        self.schedule = SchedulingLoop(rt, leader, self.policy)
        # With the loops running, only the scheduling leader watches liveness and sweeps old
        # work away; a test driving the plane by hand (run_loops=False) ticks them directly.
        self.liveness = LivenessLoop(rt, (lambda: self.schedule.leading) if run_loops else None)
        self.retention = RetentionLoop(rt, (lambda: self.schedule.leading) if run_loops else None)
        # The queue's order, reasons and ETAs as the leader decided them, on every replica; a
        # plane driven by hand (run_loops=False) answers from its own cycles.
        leading = (lambda: self.schedule.leading) if run_loops else (lambda: True)
        self.waits = WaitBoard(rt, leading, lambda: self.schedule.unplaced, self.schedule.eta)
        self.queue = QueueService(rt, self.waits.reasons)
        # Webhooks: made and sent by the leader, beside scheduling (loops/webhooks.py).
        self.webhooks = WebhookService(rt)
        self.webhook_loop = WebhookLoop(rt, (lambda: self.schedule.leading) if run_loops else None)
        self.release = ReleaseLoop(rt)  # waiting jobs into the queue as what they need ends
        self.pipelines = PipelineService(rt, self.jobs)  # pipelines and job arrays
        self.schedule.model_sizes = self.models.sizes
        self.prefetch = PrefetchLoop(rt, self.models, self.model_status, lambda: self.link)
        self.schedule.after_cycle.append(self.prefetch.after_cycle)
        self.transport = rt.link  # this replica's own agent streams
        self.notifier: Notifier | None = None
        if rt.db.is_postgres:  # replicas: reach agents held elsewhere, kick the leader
            notifier = self.notifier = PgNotifier(rt.db.target)
            rt.link = RelayLink(self.transport, notifier)
            self.auth.publish = notifier.publish  # a revocation ends streams held elsewhere
            self.schedule.on_follow = lambda: notifier.publish(Note("kick"))
        self.delivery = Delivery(rt, self.transport, lambda: self.schedule.leading)
        self.autoscale: AutoscaleLoop | None = None
        if scaling is not None:  # docs/autoscaler.md
            providers, pools = scaling
            rt.pool_prices.update((p.name, p.cost_per_hour / p.gpus) for p in pools if p.gpus)
            self.autoscale = AutoscaleLoop(
                rt,
                self.schedule,
                providers,
                pools,
                self.auth,
                self.nodes,
                lambda: getattr(self.transport, "address", None),
                (lambda: self.schedule.leading) if run_loops else None,
            )
        self._tasks: list[asyncio.Task[None]] = []
        self.report: StartReport | None = None
        self.tls: ServerTls | None = None  # what both ports serve (server/tls.py); None: plain

    @property
    def link(self) -> AgentLink:
        """This replica's transport (what agents dial); ``rt.link`` may relay through others."""
        return self.transport

    async def start(self) -> StartReport:
        """Migrate the store, make sure an admin token exists, start the loops."""
        if self.report is not None:
            return self.report
        await self.rt.db.prepare()
        token = await self.auth.bootstrap_admin()
        await self.models.load()
        self.liveness.watch_from(self.rt.clock.now())  # grace after a (re)start
        if self.notifier is not None:
            await self.notifier.start(self._hear)
        if self.run_loops:
            self._tasks = [
                asyncio.create_task(self.schedule.run(), name="corral-schedule"),
                asyncio.create_task(self.liveness.run(), name="corral-liveness"),
                asyncio.create_task(self.retention.run(), name="corral-retention"),
                asyncio.create_task(self._resync_forever(), name="corral-resync"),
                asyncio.create_task(self.auth.watch(), name="corral-revocations"),
                asyncio.create_task(self.webhook_loop.run(), name="corral-webhooks"),
                asyncio.create_task(self.release.run(), name="corral-release"),
                asyncio.create_task(self.waits.run(), name="corral-waits"),
            ]
            if self.autoscale is not None:
                self._tasks.append(
                    asyncio.create_task(self.autoscale.run(), name="corral-autoscale")
                )
            self.rt.schedule_needed.fire()  # work may be waiting from before a restart
        self.report = StartReport(
            self.rt.db.target.display(), str(self.rt.settings.blob_path()), token
        )
        return self.report

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)  # a cancel of stop propagates
        self._tasks = []
        await self.webhook_loop.close()
        await self.schedule.close()
        for provider in self.autoscale.providers.values() if self.autoscale else ():
            closing = getattr(provider, "aclose", None)
            if closing is not None:  # a webhook provider's HTTP client
                await closing()
        if self.notifier is not None:
            await self.notifier.close()
        await self.schedule.leader.release()
        await self.rt.db.close()

    async def _hear(self, notes: Sequence[Note]) -> None:
        """Other replicas' notes: revocations for auth, the rest for delivery."""
        await self.auth.on_notes(notes)
        await self.delivery.on_notes([n for n in notes if n.kind != "revoke"])

    async def _resync_forever(self) -> None:
        """The safety net under notes and streams: resend what waits too long (``Delivery``)."""
        every = self.rt.settings.scheduling.resync_s
        while True:
            await self.rt.clock.sleep(every)
            try:
                await self.delivery.resync(older_than_s=every)
            except Exception:  # keep the net up even if one pass fails
                log.exception("resync failed")
