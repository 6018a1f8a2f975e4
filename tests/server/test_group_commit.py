"""Group commit of submissions: one transaction for many, each unit on its own savepoint."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from server_harness import ADMIN, World

from corral.core.errors import Conflict
from corral.server.services.unit import Tx

pytestmark = pytest.mark.anyio


async def test_concurrent_submissions_share_commits(world: World) -> None:
    records = await asyncio.gather(*(world.submit(payload={"i": i}) for i in range(20)))
    assert len({r.job.id for r in records}) == 20
    groups = world.plane.jobs.group.groups
    assert groups < 20, "concurrent submissions should share transactions"
    listed = await world.plane.jobs.page(ADMIN, limit=100)
    assert len(listed.jobs) == 20


async def test_a_failing_unit_does_not_spoil_its_group(world: World) -> None:
    await world.submit(key="k1", payload={"v": 1})
    results = await asyncio.gather(
        world.submit(payload={"v": 2}),
        world.submit(key="k1", payload={"v": "different"}),  # same key, other body: 409
        world.submit(payload={"v": 3}),
        return_exceptions=True,
    )
    assert isinstance(results[1], Conflict)
    assert not isinstance(results[0], BaseException)
    assert not isinstance(results[2], BaseException)
    submitted = [e for e in await world.events() if e.kind.value == "job.submitted"]
    assert len(submitted) == 3, "the failed unit's event is rolled back with it"


async def test_a_failed_commit_fails_every_unit_of_the_group(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_tx = world.plane.rt.tx

    @contextlib.asynccontextmanager
    async def failing_tx(**kw: bool) -> AsyncIterator[Tx]:
        async with real_tx(**kw) as tx:
            yield tx
            raise OSError("disk full")  # inside the transaction: it rolls back

    monkeypatch.setattr(world.plane.rt, "tx", failing_tx)
    results = await asyncio.gather(*(world.submit() for _ in range(3)), return_exceptions=True)
    assert all(isinstance(r, OSError) for r in results)
    monkeypatch.undo()
    assert (await world.plane.jobs.page(ADMIN)).jobs == []
