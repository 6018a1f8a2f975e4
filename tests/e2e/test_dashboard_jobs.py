"""The dashboard's jobs list and job page in a real browser (Debian chromium, Playwright).

A real ``corral server`` and ``corral agent`` (fake GPUs, CPU demo executor). The job
page shows the timeline, live progress and a preview, then the result with its download
link; its buttons interrupt, retry, cancel and delete through the API. The list filters
by state and pages with the API's cursor; a job no node can hold says why it waits.
Screenshots land in ``test-artifacts/dashboard/``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from e2e_harness import ADMIN, Cluster, eventually, submit, wait_state

pytestmark = pytest.mark.slow

SHOTS = Path(os.environ.get("CORRAL_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts"))
SHOTS = SHOTS / "dashboard"


def test_the_job_page_follows_a_job_and_its_buttons_act_on_it(
    cluster: Cluster, browser: object
) -> None:
    from playwright.sync_api import expect

    page = _logged_in(cluster, browser)
    with cluster.client() as http:
        slow = {"steps": 200, "step_s": 0.05, "preview_every": 10, "prompt": "a red barn"}
        job_id = submit(http, payload=slow, user="alice")["id"]
        page.goto(f"{cluster.http}/#job/{job_id}")
        timeline = page.locator("#job-timeline")
        expect(timeline.locator('[data-kind="job.started"]')).to_be_visible(timeout=10_000)
        expect(timeline.locator('[data-kind="job.placed"]')).to_contain_text("gpu-box")
        expect(page.locator("#job-placement")).to_contain_text("gpu-box")  # where, on what
        expect(page.locator("#job-preview img.preview")).to_be_visible(timeout=10_000)
        progress = page.locator("#job-progress")
        eventually(lambda: _percent(progress.inner_text()) > 0, what="progress shown")
        expect(page.locator("pre.payload")).to_contain_text("a red barn")
        page.screenshot(path=str(SHOTS / "job-running.png"), full_page=True)

        page.locator('button[data-action="interrupt"]').click()
        expect(page.locator("#job-state")).to_have_text("interrupted", timeout=10_000)
        assert wait_state(http, job_id, "succeeded")["interrupted"]
        result = page.locator(".results li").first
        expect(result.locator("img.preview")).to_be_visible(timeout=10_000)
        href = result.locator("a").get_attribute("href")
        assert href is not None
        assert http.get(href).status_code == 200  # the download link
        page.screenshot(path=str(SHOTS / "job-finished.png"), full_page=True)

        page.locator('button[data-action="retry"]').click()  # the same request, a new job
        retried = eventually(
            lambda: (
                (newest := http.get("/v1/jobs?limit=1").json()["jobs"][0]["id"]) != job_id
                and newest
            ),
            what="the same request submitted again",
        )
        expect(page.locator("#job-summary h2")).to_contain_text(retried, timeout=10_000)
        assert http.get(f"/v1/jobs/{retried}").json()["payload"] == slow
        page.locator('button[data-action="cancel"]').click()
        wait_state(http, retried, "cancelled")
        expect(page.locator("#job-state")).to_have_text("cancelled", timeout=10_000)

        page.goto(f"{cluster.http}/#job/{job_id}")
        page.on("dialog", lambda d: d.accept())
        page.locator('button[data-action="delete"]').click()
        eventually(lambda: http.get(f"/v1/jobs/{job_id}").status_code == 404, what="deleted")
        expect(page.locator("#jobs-view")).to_be_visible(timeout=10_000)  # back to the list


def test_the_jobs_list_filters_pages_and_explains_a_job_that_cannot_run(
    cluster: Cluster, browser: object
) -> None:
    from playwright.sync_api import expect

    page = _logged_in(cluster, browser)
    with cluster.client() as http:
        big = {"payload": {"steps": 1}, "resources": {"gpus": 8}, "team": "vision"}
        reply = http.post("/v1/jobs/batch", json={"jobs": [big] * 55})
        assert reply.status_code == 201, reply.text
        done = submit(http, payload={"steps": 2, "step_s": 0.01})["id"]
        wait_state(http, done, "succeeded")

        page.goto(f"{cluster.http}/#jobs")
        page.select_option("#job-filters select[name=state]", "queued")
        page.fill("#job-filters input[name=team]", "vision")
        page.locator("#job-filters button[type=submit]").click()
        rows = page.locator("#jobs-table tr[data-job]")
        expect(rows).to_have_count(50)  # one page
        expect(page.locator(f'#jobs-table tr[data-job="{done}"]')).to_have_count(0)
        page.screenshot(path=str(SHOTS / "jobs-list.png"), full_page=True)
        page.locator("#jobs-more").click()
        expect(rows).to_have_count(55)  # the next page, from the cursor
        expect(page.locator("#jobs-more")).to_be_hidden()

        page.select_option("#job-filters select[name=state]", "")
        page.fill("#job-filters input[name=team]", "")
        page.fill("#job-filters input[name=q]", done[:-3])  # an id's beginning
        page.select_option("#job-filters select[name=since]", "3600")
        page.locator("#job-filters button[type=submit]").click()
        expect(rows).to_have_count(1)
        expect(page.locator(f'#jobs-table tr[data-job="{done}"]')).to_be_visible()

        sdxl = submit(http, model="sdxl-base", resources={"gpus": 8})["id"]
        page.fill("#job-filters input[name=q]", "")
        page.fill("#job-filters input[name=model]", "sdxl-base")
        page.locator("#job-filters button[type=submit]").click()
        expect(page.locator(f'#jobs-table tr[data-job="{sdxl}"]')).to_be_visible(timeout=10_000)
        expect(rows).to_have_count(1)

        waiting = reply.json()["jobs"][0]["id"]
        page.goto(f"{cluster.http}/#job/{waiting}")
        explained = page.locator("#job-queue")
        eventually(
            lambda: http.get(f"/v1/jobs/{waiting}").json()["queue"]["reasons"], what="a reason"
        )
        page.reload()
        expect(explained).to_be_visible(timeout=10_000)
        expect(explained).to_contain_text("fewer than 8 usable GPUs")
        expect(explained.locator(".remedy")).to_contain_text("--fake-gpus")
        expect(page.locator("#job-eta")).to_contain_text("no node can run it")
        page.screenshot(path=str(SHOTS / "job-waiting.png"), full_page=True)

        page.set_viewport_size({"width": 390, "height": 844})  # a phone
        for view in (f"#job/{waiting}", "#jobs", ""):
            page.goto(f"{cluster.http}/{view}")
            page.wait_for_timeout(300)
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, f"{view or 'the board'} is {width}px wide at 390"
        page.screenshot(path=str(SHOTS / "board-390.png"), full_page=True)


def _logged_in(cluster: Cluster, browser: Any) -> Any:
    from playwright.sync_api import expect

    SHOTS.mkdir(parents=True, exist_ok=True)
    cluster.start_server()
    cluster.start_agent("gpu-box", "--fake-gpus", "1x RTX 4090 24GiB", "--cpus", "2")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.on("pageerror", lambda e: print("PAGEERROR", e))
    page.goto(f"{cluster.http}/#token={ADMIN}")
    expect(page.locator('#nodes .node[data-node="gpu-box"]')).to_be_visible(timeout=10_000)
    return page


def _percent(text: str) -> int:
    return int(text.rstrip("%") or 0)


def test_a_team_token_s_dashboard_shows_its_team_only(cluster: Cluster, browser: object) -> None:
    from playwright.sync_api import expect

    page = _logged_in(cluster, browser)
    with cluster.client() as http:
        ours = submit(http, payload={}, resources={"gpus": 8}, team="vision")["id"]
        theirs = submit(http, payload={}, resources={"gpus": 8}, team="speech")["id"]
        made = http.post("/v1/tokens", json={"kind": "team", "name": "ci", "team": "vision"})
        secret = made.json()["token"]
    page.locator("#logout").click()
    expect(page.locator("#login-form")).to_be_visible()
    page.fill("#token", secret)
    page.click("#login-form button[type=submit]")
    expect(page.locator("#nav")).to_be_visible(timeout=10_000)
    page.goto(f"{cluster.http}/#jobs")
    expect(page.locator(f'#jobs-table tr[data-job="{ours}"]')).to_be_visible(timeout=10_000)
    expect(page.locator(f'#jobs-table tr[data-job="{theirs}"]')).to_have_count(0)
    page.goto(f"{cluster.http}/#job/{theirs}")
    expect(page.locator("#job-error")).to_contain_text("not found", timeout=10_000)


def test_the_job_page_shows_a_job_s_memory_and_a_node_s(cluster: Cluster, browser: object) -> None:
    from playwright.sync_api import expect

    page = _logged_in(cluster, browser)
    with cluster.client() as http:
        slow = {"steps": 100, "step_s": 0.05}
        job_id = submit(http, payload=slow, resources={"gpus": 1, "memory": "512Mi"})["id"]
        page.goto(f"{cluster.http}/#job/{job_id}")
        expect(page.locator("#job-placement")).to_contain_text("0.5 GiB memory", timeout=10_000)
        expect(page.locator("pre.payload")).to_contain_text('"memory_bytes": 536870912')
        page.goto(f"{cluster.http}/#node/gpu-box")
        expect(page.locator("#node-body")).to_contain_text("memory for jobs")
        http.post(f"/v1/jobs/{job_id}/cancel")
