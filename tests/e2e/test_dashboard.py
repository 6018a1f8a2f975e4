"""The web dashboard in a real browser (Debian chromium driven by Playwright).

A real ``corral server`` and a real ``corral agent`` (fake GPUs, CPU demo
executor): the page shows the node, a running job's progress moves without a
reload, a preview image appears, and the pause toggle changes the node in the
API. Screenshots land in ``test-artifacts/dashboard/``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from e2e_harness import ADMIN, Cluster, eventually, submit, wait_state

pytestmark = pytest.mark.slow

ARTIFACTS = Path(os.environ.get("CORRAL_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts"))


def test_dashboard_shows_nodes_live_progress_and_pauses_a_node(
    cluster: Cluster, browser: object
) -> None:
    from playwright.sync_api import Browser, expect

    assert isinstance(browser, Browser)
    shots = ARTIFACTS / "dashboard"
    shots.mkdir(parents=True, exist_ok=True)
    cluster.start_server()
    cluster.start_agent("gpu-box", "--fake-gpus", "2x RTX 4090 24GiB", "--cpus", "2")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on(  # the page's Content-Security-Policy refuses nothing it needs
        "console",
        lambda m: errors.append(m.text) if "Content Security Policy" in m.text else None,
    )

    page.goto(f"{cluster.http}/#token={ADMIN}")
    node = page.locator('#nodes .node[data-node="gpu-box"]')
    expect(node).to_be_visible(timeout=10_000)
    _assert_the_page_keeps_no_token(page)
    expect(node).to_contain_text("RTX 4090")
    expect(node.locator(".badge")).to_have_text("ready")
    expect(page.locator("#live")).to_have_text("live")

    with cluster.client() as http:
        slow = {"steps": 200, "step_s": 0.05, "preview_every": 10}
        job_id = submit(http, payload=slow, user="alice")["id"]
        card = page.locator(f'#running [data-job="{job_id}"]')
        expect(card).to_be_visible(timeout=10_000)
        text = card.locator(".progress-text")
        first = eventually(lambda: _percent(text.inner_text()), what="progress shown") or 0
        later = eventually(
            lambda: (p := _percent(text.inner_text())) > first and p, what="progress moving"
        )
        assert later > first  # updated live over SSE: the page was never reloaded
        expect(card.locator("img.preview")).to_be_visible(timeout=10_000)
        page.screenshot(path=str(shots / "running.png"), full_page=True)

        node.locator("button.toggle").click()
        eventually(
            lambda: http.get("/v1/nodes/gpu-box").json()["paused"], what="node paused in API"
        )
        expect(node.locator(".badge")).to_have_text("paused", timeout=10_000)
        page.screenshot(path=str(shots / "paused.png"), full_page=True)

        assert http.post(f"/v1/jobs/{job_id}/interrupt").status_code == 200
        wait_state(http, job_id, "succeeded")
        finished = page.locator(f'#finished [data-job="{job_id}"]')
        expect(finished.locator("img.preview")).to_be_visible(timeout=10_000)
        expect(finished.locator(".badge")).to_have_text("interrupted")  # not "succeeded"
        expect(finished.locator(".ran")).to_contain_text("seed=")  # the demo drew one

        page.locator('#nodes .node[data-node="gpu-box"] button.toggle').click()
        eventually(lambda: not http.get("/v1/nodes/gpu-box").json()["paused"], what="resumed")
        page.screenshot(path=str(shots / "finished.png"), full_page=True)
    assert errors == []


def test_a_bad_token_is_refused_with_a_message(cluster: Cluster, browser: object) -> None:
    from playwright.sync_api import Browser, expect

    assert isinstance(browser, Browser)
    cluster.start_server()
    page = browser.new_page()
    page.goto(cluster.http)
    page.fill("#token", "not-a-token")
    page.click("button[type=submit]")
    expect(page.locator("#login-error")).to_contain_text("not accepted")
    expect(page.locator("#board")).to_be_hidden()


def _assert_the_page_keeps_no_token(page: Any) -> None:
    """Logged in: the hash is gone, the page's storage holds no token, and the session
    cookie is out of scripts' reach (HttpOnly), sent to the API only."""
    assert "token" not in page.url
    stored = page.evaluate("JSON.stringify([{...localStorage}, {...sessionStorage}])")
    assert ADMIN not in stored, stored
    assert ADMIN not in page.evaluate("document.cookie")
    (cookie,) = page.context.cookies()
    assert (cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (True, "Strict", "/v1")


def _percent(text: str) -> int:
    return int(text.rstrip("%") or 0)
