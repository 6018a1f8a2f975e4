"""Every dashboard view passes an accessibility check (axe-core, vendored from the npm
registry into ``tests/e2e/vendor/axe-core``) at desktop width and at 390 px, in Debian
chromium against a real server and agent. Screenshots land in ``test-artifacts/dashboard/``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from e2e_harness import ADMIN, Cluster, submit, wait_state

pytestmark = pytest.mark.slow

AXE = Path(__file__).parent / "vendor" / "axe-core" / "axe.min.js"
SHOTS = Path(os.environ.get("CORRAL_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts"))
SHOTS = SHOTS / "dashboard"
WIDTHS = (1280, 390)  # a desktop and a phone


def test_every_view_passes_axe_at_desktop_and_phone_width(cluster: Cluster, browser: Any) -> None:
    from playwright.sync_api import expect

    SHOTS.mkdir(parents=True, exist_ok=True)
    cluster.start_server()
    cluster.start_agent("gpu-box", "--fake-gpus", "1x RTX 4090 24GiB", "--cpus", "2")
    with cluster.client() as http:
        done = submit(http, payload={"steps": 3, "step_s": 0.01}, user="ada")["id"]
        wait_state(http, done, "succeeded")
        waiting = submit(http, payload={}, resources={"gpus": 8})["id"]
        quick = {"payload": {"steps": 2, "step_s": 0.01}}
        steps = {"draw": quick, "upscale": {**quick, "after": ["draw"]}}
        pipe = http.post("/v1/pipelines", json={"steps": steps}).json()["id"]
        array = http.post("/v1/arrays", json={"job": quick, "count": 3}).json()["id"]
    # The checker is injected as a script: the dashboard's own policy would refuse it.
    context = browser.new_context(bypass_csp=True)
    page = context.new_page()
    found: list[str] = []
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(cluster.http)
        expect(page.locator("#login-form")).to_be_visible(timeout=10_000)
        found += _violations(page, f"login@{width}")
    page.goto(f"{cluster.http}/#token={ADMIN}")
    expect(page.locator('#nodes .node[data-node="gpu-box"]')).to_be_visible(timeout=10_000)
    views = {  # each view, and what shows that it has drawn
        "board": ("", "#finished [data-job] img.preview"),
        "jobs": ("#jobs", "#jobs-table tr[data-job]"),
        "job": (f"#job/{done}", ".results img.preview"),
        "waiting": (f"#job/{waiting}", "#job-queue .remedy"),
        "node": ("#node/gpu-box", ".gpu-card"),
        "groups": ("#groups", "#groups-table tr[data-group]"),
        "pipeline": (f"#pipeline/{pipe}", "#pipeline-graph g.step"),
        "array": (f"#array/{array}", "tr[data-index]"),
    }
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        for name, (hash_, drawn) in views.items():
            page.goto(f"{cluster.http}/{hash_}")
            expect(page.locator(drawn).first).to_be_visible(timeout=10_000)
            found += _violations(page, f"{name}@{width}")
            page.screenshot(path=str(SHOTS / f"a11y-{name}-{width}.png"), full_page=True)
    assert found == [], "\n".join(found)


def _violations(page: Any, where: str) -> list[str]:
    """axe's violations on the page as it is now, one line each."""
    page.add_script_tag(path=str(AXE))
    result = page.evaluate("axe.run(document, {resultTypes: ['violations']})")
    return [
        f"{where}: {v['id']} ({v['impact']}): {v['help']} at "
        + ", ".join(str(n["target"]) for n in v["nodes"][:3])
        for v in result["violations"]
    ]
