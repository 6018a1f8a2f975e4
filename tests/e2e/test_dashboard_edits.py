"""The job page's queue buttons in a real browser (Debian chromium, Playwright): hold and
release a queued job, move it to the top of its user's queue, and change its priority
class, time limit and labels, each through ``PATCH /v1/jobs/{id}``. A real ``corral
server`` and ``corral agent`` (fake GPU); the jobs ask for more GPUs than it has, so
they stay queued."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_harness import Cluster, eventually, submit
from test_dashboard_jobs import SHOTS, _logged_in

pytestmark = pytest.mark.slow


def test_the_job_page_holds_releases_tops_and_edits_a_queued_job(
    cluster: Cluster, browser: object
) -> None:
    from playwright.sync_api import expect

    page = _logged_in(cluster, browser)
    with cluster.client() as http:
        older, job_id = (
            submit(http, payload={}, resources={"gpus": 8}, user="ana")["id"] for _ in range(2)
        )
        page.goto(f"{cluster.http}/#job/{job_id}")
        page.locator('button[data-action="hold"]').click()
        expect(page.locator('button[data-action="release"]')).to_be_visible(timeout=10_000)
        expect(page.locator("#job-queue")).to_contain_text("held")
        assert http.get(f"/v1/jobs/{job_id}").json()["held"] is True
        page.screenshot(path=str(Path(SHOTS) / "job-held.png"), full_page=True)
        page.locator('button[data-action="release"]').click()
        expect(page.locator('button[data-action="hold"]')).to_be_visible(timeout=10_000)
        assert http.get(f"/v1/jobs/{job_id}").json()["held"] is False

        page.locator('button[data-action="top"]').click()

        def ahead() -> bool:  # the scheduler's next explanation orders it first
            queue = http.get("/v1/queue").json()["entries"]
            place = {e["job"]["id"]: e["position"] for e in queue}
            return place.get(job_id, 1e9) < place.get(older, -1)

        eventually(ahead, what="moved ahead of its user's older job", timeout=30)

        form = page.locator("#job-edit")
        form.locator("input[name=priority]").fill("paid")
        form.locator("input[name=timeout_s]").fill("120")
        form.locator("input[name=labels]").fill("run=b, stage=2")
        form.locator("input[name=user_weight]").fill("2")
        form.locator('button[data-action="save"]').click()
        expect(page.locator("#job-labels")).to_contain_text("stage=2", timeout=10_000)
        expect(page.locator("#job-summary")).to_contain_text("priority paid")
        got = http.get(f"/v1/jobs/{job_id}").json()
        assert (got["priority"], got["timeout_s"]) == ("paid", 120)
        assert got["labels"] == {"run": "b", "stage": "2"}
        weights = http.get("/v1/policy").json()["policy"]["user_weights"]
        assert weights == {got["user"]: 2}  # the user's weight, as a policy version
        form.locator("input[name=priority]").fill("gold")
        form.locator('button[data-action="save"]').click()
        expect(page.locator("#job-error")).to_contain_text("gold", timeout=10_000)
