"""Restarts: a server that was down does not declare the fleet lost, and SQLite stays one process.

* Liveness counts silence only from when this process started watching (its
  start, or the moment it became the scheduling leader).
* A second server on the same SQLite file is refused with a message that
  names the file, the lock and the way out (PostgreSQL for replicas).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from process_harness import ServerProcess, corral_command
from server_harness import ADMIN, START, World, settings_for

from corral.core.clock import VirtualClock
from corral.server.agentlink.inprocess import InProcessLink
from corral.server.app import create_plane
from corral.server.loops.liveness import LivenessLoop
from corral.server.plane import ControlPlane
from corral.server.store.db import Database, parse_db
from corral.server.store.sqlite_lock import StoreInUse

pytestmark = pytest.mark.anyio


async def reopen(db_url: str, home: Path, at: float) -> tuple[ControlPlane, VirtualClock]:
    """The same store opened by a fresh server process whose clock reads ``at``."""
    clock = VirtualClock(at)
    plane = create_plane(
        settings_for(db_url, home), link=InProcessLink(), clock=clock, run_loops=False
    )
    await plane.start()
    return plane, clock


async def test_a_server_down_for_minutes_gives_agents_a_full_timeout(
    db_url: str, tmp_path: Path
) -> None:
    before = await World.open(db_url, tmp_path)
    await before.agent("home-4090")
    await before.close()

    plane, clock = await reopen(db_url, tmp_path, at=START + 600)  # down for ten minutes
    try:
        clock.advance(1)
        assert (await plane.liveness.tick()).lost_nodes == [], "lost at the first tick"
        clock.advance(29)
        assert (await plane.liveness.tick()).lost_nodes == []
        clock.advance(2)  # a full node_timeout (30 s) of silence since the restart
        assert (await plane.liveness.tick()).lost_nodes == ["home-4090"]
    finally:
        await plane.stop()


async def test_an_agent_that_reconnects_within_the_grace_keeps_its_work(
    db_url: str, tmp_path: Path
) -> None:
    before = await World.open(db_url, tmp_path)
    job = await before.submit(resources={"gpus": 1})
    agent = await before.agent("n1")
    await before.cycle()
    a = await agent.next_assignment()
    await agent.start(a)
    await before.close()

    plane, clock = await reopen(db_url, tmp_path, at=START + 300)
    try:
        clock.advance(10)
        agent.server, agent.link = plane.agents, plane.link  # type: ignore[assignment]
        reply = await agent.connect(running=[a])
        assert reply.assign == ()
        assert reply.stop == ()
        clock.advance(25)
        assert (await plane.liveness.tick()).lost_nodes == []
        rec = await plane.jobs.get(ADMIN, job.job.id)
        assert (rec.state.value, rec.job.attempt) == ("running", 1)
    finally:
        await plane.stop()


async def test_only_the_leader_watches_and_a_new_leader_starts_its_grace(
    db_url: str, tmp_path: Path
) -> None:
    world = await World.open(db_url, tmp_path)
    try:
        await world.agent("n1")
        leading = False
        loop = LivenessLoop(world.plane.rt, lambda: leading)
        world.clock.advance(120)
        assert (await loop.tick()).lost_nodes == [], "a follower never marks nodes lost"
        leading = True
        assert (await loop.tick()).lost_nodes == [], "a new leader waits a full timeout first"
        world.clock.advance(31)
        assert (await loop.tick()).lost_nodes == ["n1"]
    finally:
        await world.close()


async def test_a_second_database_handle_on_one_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "corral.db"
    first, second = Database(parse_db(str(path))), Database(parse_db(str(path)))
    try:
        first.claim()
        with pytest.raises(StoreInUse) as refused:
            second.claim()
        message = str(refused.value)
        assert str(path) in message
        assert "corral.db.lock" in message
        assert "PostgreSQL" in message
        await first.close()  # released: the next server may start
        second.claim()
    finally:
        await first.close()
        await second.close()


@pytest.mark.slow
def test_a_second_server_on_the_same_sqlite_file_exits_with_the_reason(tmp_path: Path) -> None:
    db = str(tmp_path / "corral.db")
    running = ServerProcess(db, tmp_path).start()
    try:
        second = subprocess.run(
            [*corral_command(), "server", "--db", db, "--home", str(tmp_path), "--port", "0"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert second.returncode == 1, second.stdout + second.stderr
        assert "already using the SQLite database" in second.stderr
        assert f"(pid {running.proc.pid})" in second.stderr  # type: ignore[union-attr]
        running.kill9()  # the kernel drops the lock with the process: a restart works
        ServerProcess(db, tmp_path).start().stop()
    finally:
        running.stop()
