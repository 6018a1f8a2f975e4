"""The SDK's ``audit()``, sync and async alike: filters and time bounds."""

from __future__ import annotations

import time

import pytest
from live_server import FAST_RETRY, Running

from corral.sdk import AsyncClient, Client


@pytest.mark.anyio
async def test_both_clients_read_the_same_records_newest_first(server: Running, team: str) -> None:
    started = time.time() - 1
    with Client(server.url, server.token, retry=FAST_RETRY) as admin:
        for quota in range(5):
            admin.set_team(team, quota=quota)
        synced = admin.audit(target=team, action="team.*", since=started, limit=4)
        everything = admin.audit(target=team, limit=100)
        none_yet = admin.audit(target=team, until=started)
    async with AsyncClient(server.url, server.token, retry=FAST_RETRY) as corral:
        awaited = await corral.audit(target=team, action=["team.set"], limit=4)

    assert [r.detail["quota_gpus"] for r in everything] == [4, 3, 2, 1, 0]
    assert synced == awaited == everything[:4]
    assert {(r.actor.kind, r.action) for r in everything} == {("admin", "team.set")}
    assert none_yet == []
