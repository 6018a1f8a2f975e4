"""The autoscaler end to end: a real ``corral server`` whose command provider
(``examples/autoscale/local_provider.py``) starts real ``corral agent`` processes.

No machine exists when the job is submitted; the autoscaler launches one, its
agent joins over gRPC and runs the job, and once idle the machine is drained,
terminated and forgotten.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_harness import ADMIN, CLI, Cluster, eventually, submit, wait_state

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "autoscale" / "local_provider.py"
POOLS = """\
pools:
  - name: g4090
    gpus: 1
    gpu_model: RTX 4090
    vram: 24GiB
    cpus: 2
    max_nodes: 2
"""


def test_a_machine_is_launched_for_work_and_removed_when_idle(
    cluster: Cluster, browser: object
) -> None:
    from playwright.sync_api import Browser, expect

    assert isinstance(browser, Browser)
    pools = cluster.tmp / "pools.yaml"
    pools.write_text(POOLS)
    provider_dir = cluster.tmp / "provider"
    settings = {
        "CORRAL_AUTOSCALE__POOLS_FILE": str(pools),
        "CORRAL_AUTOSCALE__COMMAND": f"{sys.executable} {EXAMPLE}",
        "CORRAL_AUTOSCALE__TICK_S": "0.3",
        "CORRAL_AUTOSCALE__SCALE_UP_DELAY_S": "0",
        "CORRAL_AUTOSCALE__IDLE_S": "1",
        "CORRAL_LOCAL_PROVIDER_DIR": str(provider_dir),
        "CORRAL_LOCAL_PROVIDER_GRACE_S": "3",
    }
    cluster.start_server(**settings)
    try:
        with cluster.client() as http:
            quick = {"steps": 2, "step_s": 0.05}
            job_id = submit(http, resources={"gpus": 1}, payload=quick)["id"]
            done = wait_state(http, job_id, "succeeded", timeout=60)
            node = done["node"]
            assert node.startswith("g4090-"), done

            status = http.get("/v1/autoscaler").json()
            assert status["enabled"] is True
            assert [p["name"] for p in status["pools"]] == ["g4090"]
            shown = subprocess.run(
                [sys.executable, "-c", CLI, "autoscaler", "--url", cluster.http, "--token", ADMIN],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
            assert "g4090" in shown
            assert "1x RTX 4090 24GiB" in shown

            page = browser.new_page()  # the dashboard shows the pool (an admin sees it)
            page.goto(f"{cluster.http}/#token={ADMIN}")
            pool = page.locator('#pools tr[data-pool="g4090"]')
            expect(pool).to_be_visible(timeout=10_000)
            expect(pool).to_contain_text("1x RTX 4090")
            expect(pool).to_contain_text("0..2")

            def removed() -> bool:
                return node not in {n["name"] for n in http.get("/v1/nodes").json()}

            eventually(removed, timeout=60, what=f"node {node} removed")
            exported = [
                json.loads(line) for line in http.get("/v1/events/export").text.splitlines()
            ]
            kinds = [e["kind"] for e in exported if e.get("node") == node]
            assert kinds[0] == "node.launched", kinds
            assert kinds[-2:] == ["node.draining", "node.removed"], kinds
        assert _members(provider_dir) == [], "the agent process was terminated"
    finally:
        _terminate_all(provider_dir)


def _members(provider_dir: Path) -> list[str]:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), "list"],
        input="{}",
        capture_output=True,
        text=True,
        env={"CORRAL_LOCAL_PROVIDER_DIR": str(provider_dir), "PATH": "/usr/bin:/bin"},
        check=True,
        timeout=30,
    )
    return [m["name"] for m in json.loads(out.stdout)["members"]]


def _terminate_all(provider_dir: Path) -> None:
    """Never leave agents behind, whatever failed."""
    names = _members(provider_dir) if provider_dir.exists() else []
    if names:
        subprocess.run(
            [sys.executable, str(EXAMPLE), "terminate"],
            input=json.dumps({"names": names}),
            text=True,
            env={"CORRAL_LOCAL_PROVIDER_DIR": str(provider_dir), "PATH": "/usr/bin:/bin"},
            timeout=30,
            check=False,
        )


def test_work_no_pool_fits_is_listed_as_not_served(cluster: Cluster) -> None:
    pools = cluster.tmp / "pools.yaml"
    pools.write_text("pools:\n  - {name: cpu, cpus: 4, max_nodes: 2}\n")
    provider_dir = cluster.tmp / "provider"
    cluster.start_server(
        CORRAL_AUTOSCALE__POOLS_FILE=str(pools),
        CORRAL_AUTOSCALE__COMMAND=f"{sys.executable} {EXAMPLE}",
        CORRAL_AUTOSCALE__TICK_S="0.3",
        CORRAL_AUTOSCALE__SCALE_UP_DELAY_S="0",
        CORRAL_LOCAL_PROVIDER_DIR=str(provider_dir),
    )
    try:
        with cluster.client() as http:
            ids = [submit(http, resources={"gpus": 1})["id"] for _ in range(25)]

            def decided() -> list[dict[str, str]]:
                last = http.get("/v1/autoscaler").json()["last"]
                return last["unmet"] if last and len(last["unmet"]) == 25 else []

            unmet = eventually(decided, timeout=30, what="a decision over all 25 jobs")
            assert {u["job_id"] for u in unmet} == set(ids)
            assert "needs 1 GPU, cpu has 0" in unmet[0]["reason"]
        argv = [sys.executable, "-c", CLI, "autoscaler", "--url", cluster.http, "--token", ADMIN]
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True, env=env)
        assert done.stdout.count("not served") == 20 + 1  # 20 listed, then how many more
        assert "and 5 more waiting jobs not served" in done.stdout
        assert _members(provider_dir) == []  # nothing launched for work no machine fits
    finally:
        _terminate_all(provider_dir)
