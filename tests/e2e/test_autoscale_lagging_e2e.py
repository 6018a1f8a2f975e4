"""The autoscaler against a provider whose list lags, across a server kill: a real
``corral server`` (killed with SIGKILL and restarted on the same database) whose command
provider (``examples/autoscale/local_provider.py``, its list 8 s behind its launches)
starts real ``corral agent`` processes. One waiting job starts one machine, before and
after the restart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from e2e_harness import ADMIN, CLI, Cluster, eventually, submit, wait_state
from test_autoscale_e2e import EXAMPLE, _terminate_all

pytestmark = pytest.mark.slow

POOLS = """\
pools:
  - {name: g4090, gpus: 1, gpu_model: RTX 4090, vram: 24GiB, cpus: 2, max_nodes: 3,
     cost_per_hour: 0.5}
"""


def launched(http: httpx.Client) -> list[str]:
    exported = [json.loads(line) for line in http.get("/v1/events/export").text.splitlines()]
    return [e["node"] for e in exported if e["kind"] == "node.launched"]


def test_one_job_starts_one_machine_through_a_lagging_list_and_a_restart(
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
        "CORRAL_LOCAL_PROVIDER_DIR": str(provider_dir),
        "CORRAL_LOCAL_PROVIDER_LAG_S": "8",
        "CORRAL_LOCAL_PROVIDER_GRACE_S": "3",
    }
    server = cluster.start_server(**settings)
    try:
        with cluster.client() as http:
            job_id = submit(http, resources={"gpus": 1}, payload={"steps": 2, "step_s": 0.05})["id"]
            eventually(lambda: launched(http), timeout=30, what="a launch")
        server.kill9()  # the list still hides the machine: only the store knows it is coming
        cluster.start_server(**settings)
        with cluster.client() as http:
            done = wait_state(http, job_id, "succeeded", timeout=90)
            assert launched(http) == [done["node"]]

            def decided_on_it() -> dict[str, object]:
                status: dict[str, object] = http.get("/v1/autoscaler").json()
                return status if status["pools"][0]["machines"] == {"joined": 1} else {}  # type: ignore[index]

            status = eventually(decided_on_it, timeout=30, what="a decision that sees it joined")
            assert status["spend"]["cost_per_hour_now"] == 0.5
            lines = [line for d in status["decisions"] for line in d["lines"]]
            assert [x for x in lines if x.startswith("launch")] == []  # after the restart

            page = browser.new_page()  # the dashboard's autoscaler panel
            page.goto(f"{cluster.http}/#token={ADMIN}")
            row = page.locator('#pools tr[data-pool="g4090"]')
            expect(row.locator("td.joined")).to_have_text("1", timeout=10_000)
            expect(row.locator("td.cost")).to_contain_text("0.5 each")
            expect(page.locator("#autoscaler-spend")).to_contain_text("0.5/h now, no overall cap")
        shown = subprocess.run(
            [sys.executable, "-c", CLI, "autoscaler", "status", "--url", cluster.http,
             "--token", ADMIN],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        assert "g4090: 0 launching, 1 joined, 0 draining; 0.5/h now" in shown
        assert "spend: 0.5/h now, no overall cap" in shown
        assert _started(provider_dir) == 1
    finally:
        _terminate_all(provider_dir)


def _started(provider_dir: Path) -> int:
    """How many agents the provider ever started (one log file each)."""
    return len(list((provider_dir / "logs").glob("*.log")))
