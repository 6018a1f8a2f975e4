"""The last hour of the cluster, sampled: what the dashboard's plots draw.

Every ``api.history_sample_s`` the server notes, per priority class, how many jobs
wait and how long the longest-waiting of them has (the wait people feel; a mean would
hide a starved job among fresh ones); per team, its quota and the GPUs its work holds
within it and borrowed beyond it; the GPUs nobody holds; how many jobs ended since the
last sample; and per node and card, utilisation, temperature and VRAM in use (as the
agents' heartbeats report them) and VRAM reserved (from the allocations). Samples live
in memory, one hour of them at most (``WINDOW_S``): the plots show how the last hour
went, not an archive (Prometheus at ``/metrics`` keeps that), and a restart starts them
afresh. Each replica samples the shared store, so any answers.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from corral.core.events import TERMINAL_JOB_EVENTS
from corral.core.model import Allocation, Gpu
from corral.core.states import JobState
from corral.server.services.unit import Runtime
from corral.server.store import allocations as alloc_repo
from corral.server.store import nodes as node_repo
from corral.server.store.tables import events, jobs

WINDOW_S = 3600.0
log = logging.getLogger(__name__)

_QUEUED = (
    sa.select(jobs.c.priority, sa.func.count(), sa.func.min(jobs.c.submitted_at))
    .where(jobs.c.state == JobState.QUEUED.value)
    .group_by(jobs.c.priority)
)
_ENDED = sa.select(sa.func.count(), sa.func.max(events.c.seq)).where(
    events.c.seq > sa.bindparam("after"),
    events.c.kind.in_([k.value for k in TERMINAL_JOB_EVENTS]),
)
_HEAD = sa.select(sa.func.max(events.c.seq))


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    queued: dict[str, int]  # priority class -> jobs waiting
    waited: dict[str, float]  # priority class -> seconds its longest-waiting job has waited
    quota: dict[str, float]  # team -> GPUs guaranteed (teams with none left out)
    held: dict[str, float]  # team -> GPUs held within its quota
    borrowed: dict[str, float]  # team -> GPUs held beyond it
    idle_gpus: float
    ended: int  # jobs that ended since the sample before
    cards: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # node -> per GPU


class History:
    """A bounded ring of samples, taken by ``run``."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.period = rt.settings.api.history_sample_s
        self.samples: deque[Sample] = deque(maxlen=max(2, int(WINDOW_S / self.period)))
        self._after: int | None = None  # the last event seq counted

    async def run(self) -> None:
        """Sample until cancelled; a failed sample (a store hiccup) is skipped, not fatal."""
        while True:
            try:
                self.samples.append(await self.sample())
            except Exception:  # the plots miss a point; the server goes on
                log.warning("history: a sample failed", exc_info=True)
            await self.rt.clock.sleep(self.period)

    def since(self, start: float) -> Iterator[Sample]:
        return (s for s in self.samples if s.at >= start)

    async def sample(self) -> Sample:
        async with self.rt.db.read() as conn:
            waiting = list(await conn.execute(_QUEUED))
            teams = await node_repo.all_teams(conn)
            nodes = await node_repo.all_nodes(conn)
            active = await alloc_repo.active(conn)
            if self._after is None:  # the first sample counts from now
                self._after = int((await conn.execute(_HEAD)).scalar() or 0)
            ended, head = (await conn.execute(_ENDED, {"after": self._after})).one()
        self._after = int(head or self._after)
        vram = {(n.node.name, g.index): g.vram_bytes for n in nodes for g in n.node.gpus}
        held, borrowed, reserved = _holdings([r.alloc for r in active], vram)
        cards = {
            n.node.name: [_card(g, reserved.get((n.node.name, g.index), 0)) for g in n.node.gpus]
            for n in nodes
        }
        idle = max(0.0, len(vram) - sum(held.values()) - sum(borrowed.values()))
        now = self.rt.clock.now()
        return Sample(
            at=now,
            queued={p: int(n) for p, n, _ in waiting},
            waited={p: max(0.0, now - float(first)) for p, _, first in waiting},
            quota={t.name: t.quota_gpus for t in teams if t.quota_gpus > 0},
            held=held,
            borrowed=borrowed,
            idle_gpus=idle,
            ended=int(ended),
            cards=cards,
        )


def _holdings(
    allocs: list[Allocation], vram: dict[tuple[str, int], int]
) -> tuple[dict[str, float], dict[str, float], dict[tuple[str, int], int]]:
    """GPUs held per team within quota and borrowed, and VRAM reserved per (node, card):
    a whole card reserves all of its VRAM, a share what it asked."""
    held: dict[str, float] = {}
    borrowed: dict[str, float] = {}
    reserved: dict[tuple[str, int], int] = {}
    for a in allocs:
        if a.on_cpu:
            continue
        into = borrowed if a.borrowed else held
        into[a.team] = into.get(a.team, 0.0) + a.gpu_milli * len(a.gpu_indices) / 1000
        for i in a.gpu_indices:
            card = (a.node, i)
            share = vram.get(card, 0) if a.gpu_milli >= 1000 else a.vram_bytes
            reserved[card] = reserved.get(card, 0) + share
    return held, borrowed, reserved


def _card(g: Gpu, reserved: int) -> dict[str, Any]:
    used = None if g.vram_free_bytes is None else g.vram_bytes - g.vram_free_bytes
    return {
        "index": g.index,
        "utilization": g.utilization,
        "temperature_c": g.temperature_c,
        "vram_used": used,
        "vram_reserved": reserved,
        "vram_bytes": g.vram_bytes,
    }
