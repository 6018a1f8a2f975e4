"""The dashboard's first load holds up when the network is slow or the server briefly fails.

A real ``corral server`` and agent (fake GPUs), a real browser. Playwright's
routing plays the bad network: the session answer arriving before the page's
later scripts have loaded (as on a busy machine), and one panel's request
failing for a while. Each time the rest of the board draws, the live badge
connects, and the failed panel says why and heals without a reload.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from e2e_harness import ADMIN, Cluster

pytestmark = pytest.mark.slow


def test_the_board_loads_when_the_session_answers_before_the_last_scripts(
    cluster: Cluster, browser: object
) -> None:
    from playwright.sync_api import Browser, Route, expect

    assert isinstance(browser, Browser)
    cluster.start_server()
    cluster.start_agent("gpu-box", "--fake-gpus", "1x RTX 4090 24GiB", "--cpus", "2")
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))

    def late(route: Route) -> None:  # the scripts after app.js arrive half a second apart
        time.sleep(0.5)  # the browser goes on meanwhile: only these answers wait
        route.continue_()

    for name in ("jobs", "node", "groups", "plots", "usage"):
        page.route(f"**/static/{name}.js", late)
    page.goto(f"{cluster.http}/#token={ADMIN}")
    expect(page.locator('#nodes .node[data-node="gpu-box"]')).to_be_visible(timeout=15_000)
    expect(page.locator("#live")).to_have_text("live", timeout=10_000)
    expect(page.locator("#policy-section")).to_be_visible(timeout=10_000)
    assert errors == []


def test_a_panel_that_fails_says_so_while_the_others_draw_and_it_heals(
    cluster: Cluster, browser: object
) -> None:
    from playwright.sync_api import Browser, Route, expect

    assert isinstance(browser, Browser)
    cluster.start_server()
    cluster.start_agent("gpu-box", "--fake-gpus", "1x RTX 4090 24GiB", "--cpus", "2")
    page = browser.new_page()
    failing_until = time.monotonic() + 3.0

    def queue(route: Route) -> Any:  # the queue's answers fail for three seconds
        if time.monotonic() < failing_until:
            return route.fulfill(status=503, json={"message": "busy, try again"})
        return route.continue_()

    page.route("**/v1/queue", queue)
    page.goto(f"{cluster.http}/#token={ADMIN}")
    expect(page.locator('#nodes .node[data-node="gpu-box"]')).to_be_visible(timeout=10_000)
    expect(page.locator("#live")).to_have_text("live")
    alert = page.locator("#board-error")
    expect(alert).to_contain_text("queue: busy, try again")
    expect(alert).to_contain_text("retrying")
    expect(page.locator("#queue-count")).to_have_text("(0)", timeout=10_000)  # healed
    expect(alert).to_be_empty()
