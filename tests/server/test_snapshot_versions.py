"""The cycle's first read (store/versions.py): one query on PostgreSQL, the same answer as
the four reads it replaces."""

from __future__ import annotations

import pytest
from server_harness import World

from corral.core.model import Team
from corral.server.store import allocations as alloc_repo
from corral.server.store import jobs as job_repo
from corral.server.store import nodes as node_repo
from corral.server.store import pgraw, versions

pytestmark = pytest.mark.anyio


async def test_one_read_gives_what_the_four_reads_give(world: World) -> None:
    for i in range(5):
        await world.submit(resources={"gpus": 1}, payload={"i": i})
    await world.agent("n1", gpus=2)
    await world.agent("n2", gpus=1)
    await world.cycle()  # three placed (active allocations), two still queued
    async with world.plane.rt.tx() as tx:
        await node_repo.put_team(tx.conn, Team("b-team", 4.0, None, 2.0), tx.now)
        await node_repo.put_team(tx.conn, Team("a-team", 8.0, 2.5, 1.0), tx.now)

    async with world.plane.rt.db.read() as conn:
        assert (pgraw.pg(conn) is not None) == world.plane.rt.db.is_postgres, "the fast path"
        got = await versions.read(conn)
        queued = await job_repo.queued_versions(conn)
        active = await alloc_repo.active_versions(conn)
        nodes = await node_repo.versions(conn)
        teams = await node_repo.all_teams(conn)

    assert len(queued) == 2
    assert len(active) == 3
    assert set(nodes) == {"n1", "n2"}
    assert got.queued == queued, "the same jobs in submission order"
    assert got.active == active
    assert got.nodes == nodes
    assert got.teams == teams
    assert [t.name for t in got.teams][:2] == ["a-team", "b-team"]
    assert got.teams[0] == Team("a-team", 8.0, 2.5, 1.0)
    assert got.teams[1].borrow_limit_gpus is None


async def test_an_empty_store_reads_as_empty(world: World) -> None:
    async with world.plane.rt.db.read() as conn:
        got = await versions.read(conn)
    assert (got.queued, got.active, got.nodes) == ([], {}, {})
