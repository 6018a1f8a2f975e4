"""The SDK's policy and usage calls, sync and async alike, against a real server."""

from __future__ import annotations

import pytest
from live_server import FAST_RETRY, Running

from corral.sdk import AsyncClient, BadRequest, Client, PermissionDenied

OPEN = """\
format: 1
classes:
  - {name: interactive, rank: 40, preemptible: false, may_preempt: true}
  - {name: paid, rank: 30, may_preempt: true}
  - {name: free, rank: 20}
  - {name: batch, rank: 10, cpu_offload: true}
"""


@pytest.mark.anyio
async def test_both_clients_read_check_and_apply_the_policy(server: Running, team: str) -> None:
    async with AsyncClient(server.url, server.token, retry=FAST_RETRY) as corral:
        with pytest.raises(BadRequest) as refused:
            await corral.check_policy(OPEN.replace("rank: 30", "rank: [30]"))
        assert refused.value.field == "classes[1].rank"
        applied = await corral.apply_policy(OPEN, note="sdk")
        assert (await corral.policy()).version == applied.version
        assert (await corral.policy_history(limit=1))[0].note == "sdk"
        report = await corral.usage(by=("team", "class"))
        assert report.by == ["team", "class"]
    with Client(server.url, server.token, retry=FAST_RETRY) as admin:
        back = admin.rollback_policy(0)
        assert back.version == applied.version + 1
        assert admin.policy().document == back.document
        secret = admin.create_token("team", "sdk-reader", team).token
    with Client(server.url, secret, retry=FAST_RETRY) as reader:
        with pytest.raises(PermissionDenied):
            reader.policy()
        assert all(r.team == team for r in reader.usage(by=("team",)).rows)
