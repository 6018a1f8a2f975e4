"""``GET /v1/history``, the samples the dashboard's plots draw, from a real server and agent:
GPUs held per team, a team token seeing its own team only, and the range bounded."""

from __future__ import annotations

import httpx
import pytest
from e2e_harness import Cluster, eventually, submit

pytestmark = pytest.mark.slow


def test_history_counts_each_team_s_gpus_and_a_team_token_sees_its_own(
    cluster: Cluster,
) -> None:
    cluster.start_server(CORRAL_API__HISTORY_SAMPLE_S="0.2")
    cluster.start_agent("gpu-box", "--fake-gpus", "2x RTX 4090 24GiB", "--cpus", "2")
    with cluster.client() as admin:
        slow = {"steps": 400, "step_s": 0.05}
        for team in ("vision", "speech"):
            submit(admin, payload=slow, resources={"gpus": 1}, team=team)
        made = admin.post("/v1/tokens", json={"kind": "team", "name": "ci", "team": "vision"})
        secret = made.json()["token"]

        def both_held() -> dict[str, float] | None:
            last = admin.get("/v1/history", params={"seconds": 60}).json()["samples"][-1:]
            gpus = {**last[0]["held"], **last[0]["borrowed"]} if last else {}
            return gpus if set(gpus) == {"vision", "speech"} else None

        assert eventually(both_held, what="both teams' GPUs sampled") == {
            "vision": 1,
            "speech": 1,
        }
        assert admin.get("/v1/history").json()["samples"][-1]["idle_gpus"] == 0
        assert admin.get("/v1/history", params={"seconds": 0}).status_code == 422
        assert admin.get("/v1/history", params={"seconds": 7200}).status_code == 422
    headers = {"Authorization": f"Bearer {secret}"}
    with httpx.Client(base_url=cluster.http, headers=headers, timeout=10) as vision:
        last = vision.get("/v1/history").json()["samples"][-1]
        assert set(last["held"]) | set(last["borrowed"]) == {"vision"}
