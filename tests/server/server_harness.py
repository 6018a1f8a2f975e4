"""A test world for the server: control plane + virtual clock + in-process link + stub agents.

Tests drive it by hand: ``submit`` jobs, ``agent("n1")`` to connect a stub
agent, ``cycle()`` to run one scheduling cycle, ``tick(after=...)`` to move
the clock and run the liveness checks. Nothing sleeps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from corral.core.clock import VirtualClock
from corral.core.events import Event
from corral.server.agentlink.base import StopOrder
from corral.server.agentlink.inprocess import InProcessLink, StubAgent, inventory
from corral.server.api.schemas import JobIn
from corral.server.app import create_plane
from corral.server.loops.liveness import TickReport
from corral.server.plane import ControlPlane
from corral.server.services.auth import Principal, TokenKind
from corral.server.services.jobs import Draft, new_job_id
from corral.server.services.placement import Applied
from corral.server.settings import Settings
from corral.server.store import events as event_repo
from corral.server.store.records import JobRecord

ADMIN = Principal("tok_admin", TokenKind.ADMIN, "admin")
START = 1_000_000.0


def settings_for(db_url: str, home: Path, **scheduling: Any) -> Settings:
    return Settings(
        home=home,
        store={"db": db_url},  # type: ignore[arg-type]
        scheduling={"node_timeout_s": 30.0, "stop_slack_s": 30.0, **scheduling},  # type: ignore[arg-type]
    )


class World:
    def __init__(self, plane: ControlPlane, clock: VirtualClock, link: InProcessLink) -> None:
        self.plane = plane
        self.clock = clock
        self.link = link

    @classmethod
    async def open(cls, db_url: str, home: Path, **scheduling: Any) -> World:
        clock = VirtualClock(START)
        link = InProcessLink()
        plane = create_plane(
            settings_for(db_url, home, **scheduling), link=link, clock=clock, run_loops=False
        )
        await plane.start()
        return cls(plane, clock, link)

    async def close(self) -> None:
        await self.plane.stop()

    async def submit(
        self, who: Principal = ADMIN, key: str | None = None, **spec: Any
    ) -> JobRecord:
        records = await self.submit_many([spec], who=who, key=key)
        return records[0]

    async def submit_many(
        self, specs: list[dict[str, Any]], who: Principal = ADMIN, key: str | None = None
    ) -> list[JobRecord]:
        drafts = []
        for s in specs:
            body = JobIn.model_validate(s)
            team = body.team or who.team or "default"
            drafts.append(
                Draft(
                    body.to_job(new_job_id(), team=team, idempotency_key=key),
                    body.request_hash(team),
                )
            )
        records, _ = await self.plane.jobs.submit(who, drafts)
        return records

    async def agent(self, name: str, gpus: int = 1, **kw: Any) -> StubAgent:
        agent = StubAgent(self.plane.agents, self.link, inventory(name, gpus, **kw))
        await agent.connect()
        return agent

    async def cycle(self) -> Applied:
        return await self.plane.schedule.cycle()

    async def tick(self, after: float = 0.0) -> TickReport:
        self.clock.advance(after)
        return await self.plane.liveness.tick()

    async def job(self, job_id: str) -> JobRecord:
        return await self.plane.jobs.get(ADMIN, job_id)

    async def events(self, job_id: str | None = None) -> list[Event]:
        async with self.plane.rt.db.read() as conn:
            return [e for e, _ in await event_repo.after(conn, 0, job_id=job_id, limit=10_000)]

    async def kinds(self, job_id: str) -> list[str]:
        return [e.kind.value for e in await self.events(job_id)]


async def obey(agents: list[StubAgent]) -> None:
    """Each agent starts what it was given and stops what it was told to stop."""
    for agent in agents:
        for item in agent.pending():
            if isinstance(item, StopOrder):
                await agent.stopped(agent.running[item.allocation_id])
            else:
                agent.running[item.allocation_id] = item
                await agent.start(item)
