"""Several replicas on one PostgreSQL: notes between them, one leader, and the resync net.

Two control planes in this process share one database schema, each with its
own in-process agent link (its "streams"). An agent connected to one replica
must get what the other decides for it; a follower poked by a submission
asks the leader for a cycle; the leader dying hands the loop over.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from server_harness import ADMIN, World, settings_for

from corral.core.states import JobState, StopReason
from corral.server.agentlink.base import Assignment, StopOrder
from corral.server.agentlink.inprocess import InProcessLink, StubAgent, inventory
from corral.server.agentlink.relay import RelayLink
from corral.server.app import create_plane
from corral.server.plane import ControlPlane
from corral.server.store.notify import MAX_PAYLOAD, Note, decode, encode

pytestmark = pytest.mark.anyio


class Replica:
    """One ``corral server`` replica: a plane and the agents connected to it."""

    def __init__(self, plane: ControlPlane, link: InProcessLink) -> None:
        self.plane = plane
        self.link = link

    async def agent(self, name: str, gpus: int = 1) -> StubAgent:
        agent = StubAgent(self.plane.agents, self.link, inventory(name, gpus))
        await agent.connect()
        return agent

    @property
    def relay(self) -> RelayLink:
        assert isinstance(self.plane.rt.link, RelayLink)
        return self.plane.rt.link


@pytest.fixture
async def replicas(pg_url: str, tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    opened: list[ControlPlane] = []

    async def open_replica(*, run_loops: bool = False, **scheduling: Any) -> Replica:
        link = InProcessLink()
        settings = settings_for(pg_url, tmp_path, **scheduling)
        plane = create_plane(settings, link=link, run_loops=run_loops)
        await plane.start()
        opened.append(plane)
        return Replica(plane, link)

    try:
        yield open_replica
    finally:
        for plane in reversed(opened):
            await plane.stop()


async def test_an_assignment_reaches_the_agent_held_by_another_replica(replicas: Any) -> None:
    deciding, holding = await replicas(), await replicas()
    agent = await holding.agent("n1")
    job = await deciding.plane.jobs.get(ADMIN, (await _submit(deciding.plane)).job.id)

    applied = await deciding.plane.schedule.cycle()
    assert [a.node for a in applied.placed] == ["n1"]
    a = await agent.next_assignment(timeout=5)
    assert a.jobs[0].job_id == job.job.id
    assert deciding.relay.relayed == 1
    assert deciding.link.sent.assigned == [], "the deciding replica holds no stream for n1"
    assert holding.plane.delivery.delivered == 1


async def test_a_cancel_on_one_replica_stops_the_work_on_the_other(replicas: Any) -> None:
    api, holding = await replicas(), await replicas()
    agent = await holding.agent("n1")
    job = await _submit(api.plane)
    await holding.plane.schedule.cycle()  # the holder places it: sent directly
    a = await agent.next_assignment()
    await agent.start(a)

    await api.plane.jobs.cancel(ADMIN, job.job.id)
    order = await agent.receive(timeout=5)
    assert isinstance(order, StopOrder)
    assert (order.allocation_id, order.reason) == (a.allocation_id, StopReason.CANCEL)


async def test_a_cancel_of_one_job_of_a_batch_reaches_the_agent_on_the_other_replica(
    replicas: Any,
) -> None:
    api, holding = await replicas(), await replicas()
    jobs = await _submit(api.plane, 3, kind="sample", batch_key="sd15")
    agent = await holding.agent("n1")
    await holding.plane.schedule.cycle()
    a = await agent.next_assignment()
    assert len(a.jobs) == 3
    await agent.start(a)

    dropped = a.jobs[1].job_id
    await api.plane.jobs.cancel(ADMIN, dropped)
    order = await agent.receive(timeout=5)
    assert isinstance(order, StopOrder)
    assert (order.allocation_id, order.job_id) == (a.allocation_id, dropped)
    assert {j.job.id for j in jobs} == {w.job_id for w in a.jobs}


async def test_a_lost_note_is_covered_by_the_resync(replicas: Any) -> None:
    deciding, holding = await replicas(), await replicas()
    agent = await holding.agent("n1")
    await _submit(deciding.plane)
    assert deciding.plane.notifier is not None
    await deciding.plane.notifier.close()  # the note goes nowhere
    await deciding.plane.schedule.cycle()
    assert agent.pending() == []

    assert await holding.plane.delivery.resync(older_than_s=-1) == 1
    assert isinstance(agent.pending()[0], Assignment)


async def test_a_follower_poked_by_a_submission_gets_the_leader_to_place_it(
    replicas: Any,
) -> None:
    fast = {"idle_cycle_s": 30.0, "leader_retry_s": 0.2, "resync_s": 30.0}
    leader = await replicas(run_loops=True, **fast)
    await _eventually(lambda: leader.plane.schedule.leading, "the first replica leads")
    follower = await replicas(run_loops=True, **fast)
    agent = await follower.agent("n1")
    agent.autopilot()

    job = await _submit(follower.plane)
    await _eventually(lambda: _succeeded(follower.plane, job.job.id), "done")
    assert not follower.plane.schedule.leading
    assert leader.relay.relayed >= 1, "the leader placed it and relayed the assignment"


async def test_the_follower_takes_over_within_seconds_when_the_leader_goes(
    replicas: Any,
) -> None:
    fast = {"idle_cycle_s": 30.0, "leader_retry_s": 0.2, "resync_s": 30.0}
    first = await replicas(run_loops=True, **fast)
    await _eventually(lambda: first.plane.schedule.leading, "the first replica leads")
    second = await replicas(run_loops=True, **fast)
    agent = await second.agent("n1")
    agent.autopilot()

    await first.plane.stop()  # its lock connection closes, as when the process dies
    gone = time.monotonic()
    await _eventually(lambda: second.plane.schedule.leading, "the second replica leads")
    assert time.monotonic() - gone < 3.0
    job = await _submit(second.plane)
    await _eventually(lambda: _succeeded(second.plane, job.job.id), "done")


async def test_a_follower_answers_the_queue_s_order_reasons_and_etas_as_the_leader_does(
    replicas: Any,
) -> None:
    fast = {"idle_cycle_s": 1.0, "leader_retry_s": 0.2, "resync_s": 30.0}
    leader = await replicas(run_loops=True, **fast)
    await _eventually(lambda: leader.plane.schedule.leading, "the first replica leads")
    follower = await replicas(run_loops=True, **fast)
    agent = await leader.agent("n1")
    running = await _submit(leader.plane, payload={"steps": 100})
    await agent.next_assignment(timeout=5)
    too_big = await _submit(leader.plane, resources={"gpus": 2})  # no node has two
    waiting = await _submit(leader.plane)

    async def queue(replica: Replica) -> list[tuple[str, object, object]]:
        entries, _ = await replica.plane.queue.queue(ADMIN, 10)
        return [
            (e.job.job.id, e.unplaced and e.unplaced.remedy, e.unplaced and e.unplaced.summary())
            for e in entries
        ]

    async def said() -> list[tuple[str, object, object]]:
        said = await queue(leader)
        return said if all(remedy for _, remedy, _ in said) else []

    await _eventually(said, "the leader explains both waiting jobs")
    explained = await queue(leader)
    assert [job_id for job_id, *_ in explained] == [too_big.job.id, waiting.job.id]
    assert explained[0][1] == "none"  # it fits nowhere
    assert "GPU" in str(explained[0][2])
    assert await follower.plane.waits.publish() == 0, "only the leader publishes"

    async def etas(replica: Replica) -> list[object]:
        said = await replica.plane.waits.said()
        return [said.eta(job.job.id) for job in (waiting, running)]

    await _eventually(lambda: _all(etas(leader)), "the leader's ETAs")
    await _eventually(  # the leader publishes every few seconds
        lambda: _same(queue(follower), queue(leader)), "the follower's queue", timeout=15
    )
    await _eventually(lambda: _same(etas(follower), etas(leader)), "its ETAs", timeout=15)


async def _all(answer: Awaitable[list[object]]) -> bool:
    return all(await answer)


async def _same(answer: Awaitable[object], expected: Awaitable[object]) -> bool:
    return await answer == await expected


async def test_resync_resends_pending_work_to_an_agent_whose_message_was_lost(
    world: World,
) -> None:
    """Also on SQLite: a message that died with a stream is sent again, not stranded."""
    await world.submit(resources={"gpus": 1})
    agent = await world.agent("n1")
    world.link.detach("n1")  # the stream is gone for the assignment...
    await world.cycle()
    world.link.attach(agent)  # ...and back without a hello
    assert agent.pending() == []
    assert await world.plane.delivery.resync(older_than_s=5) == 0, "too young to resend"
    world.clock.advance(6)
    assert await world.plane.delivery.resync(older_than_s=5) == 1
    assert isinstance(agent.pending()[0], Assignment)


def test_notes_are_batched_under_the_payload_limit() -> None:
    notes = [Note("assign", f"node-{i}", f"al_{i:016x}") for i in range(500)]
    payloads = encode("r1", notes)
    assert len(payloads) > 1
    assert all(len(p) <= MAX_PAYLOAD for p in payloads)
    decoded = [n for p in payloads for n in decode(p)[1]]
    assert decoded == notes
    assert decode("not json") == ("", [])


async def _submit(plane: ControlPlane, count: int = 1, **spec: Any) -> Any:
    """One job (``count`` 1), or a list of ``count`` jobs submitted together."""
    from corral.server.api.schemas import JobIn
    from corral.server.services.jobs import Draft, new_job_id

    body = JobIn.model_validate({"resources": {"gpus": 1}, **spec})
    drafts = [
        Draft(
            body.to_job(new_job_id(), team="default", idempotency_key=None),
            body.request_hash("default"),
        )
        for _ in range(count)
    ]
    records, _ = await plane.jobs.submit(ADMIN, drafts)
    return records[0] if count == 1 else records


async def _succeeded(plane: ControlPlane, job_id: str) -> bool:
    return (await plane.jobs.get(ADMIN, job_id)).state is JobState.SUCCEEDED


async def _eventually(probe: Callable[[], object], what: str, timeout: float = 10.0) -> None:
    """Poll ``probe`` (plain or returning an awaitable) until it is truthy."""
    deadline = time.monotonic() + timeout
    while not await _value(probe()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        await asyncio.sleep(0.05)


async def _value(result: object) -> object:
    return await result if inspect.isawaitable(result) else result
