"""A node's page in a real browser (Debian chromium, Playwright): each GPU with the work
it holds, the models, and pause, drain and resume acting through the API. The screenshot
lands in ``test-artifacts/dashboard/node.png``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from e2e_harness import ADMIN, Cluster, eventually, submit

pytestmark = pytest.mark.slow

SHOTS = Path(os.environ.get("CORRAL_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts"))
SHOTS = SHOTS / "dashboard"


def test_the_node_page_shows_each_card_s_work_and_drains_and_resumes(
    cluster: Cluster, browser: Any
) -> None:
    from playwright.sync_api import expect

    SHOTS.mkdir(parents=True, exist_ok=True)
    cluster.start_server(CORRAL_API__HISTORY_SAMPLE_S="0.2")
    cluster.start_agent("gpu-box", "--fake-gpus", "2x RTX 4090 24GiB", "--cpus", "2")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{cluster.http}/#token={ADMIN}")
    expect(page.locator('#nodes .node[data-node="gpu-box"]')).to_be_visible(timeout=30_000)
    with cluster.client() as http:
        slow = {"steps": 400, "step_s": 0.05}
        job_id = submit(http, payload=slow, resources={"gpus": 1})["id"]
        eventually(lambda: http.get(f"/v1/jobs/{job_id}").json()["state"] == "running")
        card = http.get(f"/v1/jobs/{job_id}").json()
        node = http.get("/v1/nodes/gpu-box").json()
        (alloc,) = [a for a in node["allocations"] if job_id in a["job_ids"]]
        (index,) = alloc["gpu_indices"]

        page.locator('#nodes .node[data-node="gpu-box"] h3 a').click()  # from the cluster view
        gpu = page.locator(f'.gpu-card[data-gpu="{index}"]')
        expect(gpu.locator(f'a[href="#job/{job_id}"]')).to_be_visible(timeout=10_000)
        expect(gpu).to_contain_text("VRAM reserved 24.0 GiB")  # a whole card: all of it
        expect(page.locator(f'.gpu-card[data-gpu="{1 - index}"]')).to_contain_text("idle")
        assert card["node"] == "gpu-box"
        # a quota line and a job that waits, for the cluster's plots
        assert http.put("/v1/teams/default", json={"quota_gpus": 1}).status_code == 200
        stuck = submit(http, payload={}, resources={"gpus": 8})["id"]
        # the last hour, sampled: the job's card is held by its team, reserved whole
        samples = eventually(
            lambda: [
                s
                for s in http.get("/v1/history", params={"node": "gpu-box"}).json()["samples"]
                if s["held"] or s["borrowed"]
            ],
            what="a sample with the job's GPU",
        )
        last = samples[-1]
        assert last["held"].get("default", 0) + last["borrowed"].get("default", 0) == 1
        # fake cards look as busy as the agent's work: the job's warms, the other idles
        warm = eventually(
            lambda: [
                s["cards"]
                for s in http.get("/v1/history", params={"node": "gpu-box"}).json()["samples"]
                if s["cards"] and (s["cards"][index]["temperature_c"] or 0) > 35
            ],
            what="the busy card warming",
        )[-1]
        assert (warm[index]["utilization"], warm[1 - index]["utilization"]) == (1.0, 0.0)
        assert last["idle_gpus"] == 1
        assert last["cards"][index]["vram_reserved"] == 24 * 2**30
        page.reload()
        expect(gpu.locator(f"#plot-util-{index} canvas")).to_be_visible(timeout=10_000)
        expect(gpu.locator(f"#plot-vram-{index} canvas")).to_be_visible()
        expect(gpu.locator(f"#plot-temp-{index} canvas")).to_be_visible()
        expect(gpu).to_contain_text("100% busy")
        expect(gpu).to_contain_text("°C")
        page.screenshot(path=str(SHOTS / "node.png"), full_page=True)
        eventually(
            lambda: http.get("/v1/history", params={"seconds": 60}).json()["samples"][-1]["quota"],
            what="a sample with the team's quota",
        )
        page.goto(f"{cluster.http}/#")
        expect(page.locator("#plot-gpus canvas")).to_be_visible(timeout=10_000)
        expect(page.locator("#plot-gpus .u-legend")).to_contain_text("default quota")
        expect(page.locator("#plot-wait .u-legend")).to_contain_text("free")
        expect(page.locator("#plot-queue canvas")).to_be_visible()
        expect(page.locator("#plot-wait canvas")).to_be_visible()
        page.screenshot(path=str(SHOTS / "cluster-plots.png"), full_page=True)
        page.goto(f"{cluster.http}/#node/gpu-box")

        page.locator('button[data-action="drain"]').click()
        expect(page.locator("#node-state")).to_have_text("draining", timeout=10_000)
        assert http.get("/v1/nodes/gpu-box").json()["draining"]
        page.locator('button[data-action="resume"]').click()
        expect(page.locator("#node-state")).to_have_text("ready", timeout=10_000)
        assert not http.get("/v1/nodes/gpu-box").json()["draining"]
        assert http.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
        assert http.post(f"/v1/jobs/{stuck}/cancel").status_code == 200
