"""The dashboard's pipeline page in a real browser (Debian chromium, Playwright): a real
``corral server`` and ``corral agent`` (fake GPUs, CPU demo executor) run a diamond of four
steps; the page draws the steps as a graph, an arrow per dependency, each box taking its
step's state as the run goes, links each step to its job's page, and lists the calls of
the pipeline's own webhook."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_harness import ADMIN, Cluster

pytestmark = pytest.mark.slow

SHOTS = Path(os.environ.get("CORRAL_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts"))
SHOTS = SHOTS / "dashboard"
QUICK = {"steps": 10, "step_s": 0.1}


def test_the_pipeline_page_draws_the_steps_as_a_graph_with_their_states(
    cluster: Cluster, browser: Any
) -> None:
    from playwright.sync_api import expect

    SHOTS.mkdir(parents=True, exist_ok=True)
    cluster.start_server()
    cluster.start_agent("gpu-box", "--fake-gpus", "1x RTX 4090 24GiB", "--cpus", "1")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.on("pageerror", lambda e: print("PAGEERROR", e))
    page.goto(f"{cluster.http}/#token={ADMIN}")
    expect(page.locator('#nodes .node[data-node="gpu-box"]')).to_be_visible(timeout=10_000)
    steps = {
        "txt2img": {"payload": {**QUICK, "prompt": "a fox"}},
        "upscale": {"payload": QUICK, "after": ["txt2img"]},
        "facefix": {"payload": QUICK, "after": ["txt2img"]},
        "compose": {"payload": QUICK, "after": ["upscale", "facefix"]},
    }
    with cluster.client() as http:
        hook = {"url": "https://hooks.invalid/corral"}  # .invalid: never resolves, no network
        made = http.post("/v1/pipelines", json={"steps": steps, "webhook": hook})
        assert made.status_code == 201, made.text
        pipe = made.json()["id"]
    page.goto(f"{cluster.http}/#pipeline/{pipe}")
    graph = page.locator("#pipeline-graph")
    expect(graph.locator("g.step")).to_have_count(4, timeout=10_000)
    expect(graph.locator("line.edge")).to_have_count(4)
    expect(graph.locator('line.edge[data-from="facefix"][data-to="compose"]')).to_have_count(1)
    expect(graph.locator('g[data-step="compose"]')).to_have_attribute("data-state", "waiting")
    page.screenshot(path=str(SHOTS / "pipeline-running.png"), full_page=True)
    expect(page.locator("#group-state")).to_have_text("succeeded", timeout=30_000)
    for name in steps:
        expect(graph.locator(f'g[data-step="{name}"]')).to_have_attribute("data-state", "succeeded")
    page.screenshot(path=str(SHOTS / "pipeline-done.png"), full_page=True)
    expect(page.locator("#group-webhook")).to_contain_text("when every job has ended")
    with cluster.client() as http:  # made on the webhook loop's next pass
        for _ in range(200):
            made_calls = http.get(f"/v1/pipelines/{pipe}/deliveries").json()["deliveries"]
            if made_calls:
                break
            time.sleep(0.05)
        assert [d["kind"] for d in made_calls] == ["pipeline.succeeded"]
    page.reload()  # the page stops reading once the pipeline ended: read its calls again
    calls = page.locator("#group-deliveries li")
    expect(calls).to_have_count(1, timeout=10_000)
    expect(calls).to_contain_text("pipeline.succeeded")
    graph.locator('g[data-step="upscale"] a').click()
    expect(page.locator("#job-group")).to_contain_text("step upscale of pipeline")
    page.goto(f"{cluster.http}/#groups")
    expect(page.locator(f'#groups-table tr[data-group="{pipe}"]')).to_contain_text("succeeded")
