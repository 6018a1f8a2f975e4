"""ComfyUI's own web frontend (``comfyui-frontend-package``) pointed at corral, in a real
browser (Debian chromium driven by Playwright).

Real processes: ``corral server`` with ``compat.comfyui_frontend`` on and the default
compat settings (so a request on this CPU-only node must not wait for a GPU), the
reference ComfyUI, and ``corral agent --comfyui URL`` without GPUs. The page loads
from ``/comfyui/`` with HTTP Basic credentials (any user, a corral token), lists the
cluster's node types in its node search, and queues a graph opened as an API-format
file; the graph runs as a corral job, the page hears its progress over ``/comfyui/ws``
and fetches its image through ``/comfyui/api/view``. Screenshots land in
``test-artifacts/comfyui-frontend/``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from compat_harness import reference
from e2e_harness import ADMIN, Cluster, eventually

from corral.agent.reference.comfyui import txt2img_workflow

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ARTIFACTS = Path(os.environ.get("CORRAL_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts"))


def test_comfyuis_frontend_loads_lists_node_types_and_queues_a_graph_that_runs(
    cluster: Cluster, browser: object
) -> None:
    from playwright.sync_api import Browser, Response, expect

    assert isinstance(browser, Browser)
    shots = ARTIFACTS / "comfyui-frontend"
    shots.mkdir(parents=True, exist_ok=True)
    _, comfyui = reference(cluster, "comfyui", "--step-delay", "0.05")
    cluster.start_server(CORRAL_COMPAT__COMFYUI_FRONTEND="1")  # compat.gpus left unset
    cluster.start_agent("cpu-box", "--comfyui", comfyui, "--cpus", "2")
    context = browser.new_context(
        http_credentials={"username": "ana", "password": ADMIN},
        viewport={"width": 1280, "height": 900},
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    answers: list[Response] = []
    page.on("response", lambda r: answers.append(r))
    messages: list[dict[str, Any]] = []
    page.on(
        "websocket",
        lambda ws: ws.on(
            "framereceived",
            lambda f: messages.append(json.loads(f)) if isinstance(f, str) else None,
        ),
    )

    page.goto(f"{cluster.http}/comfyui/")
    run = page.get_by_role("button", name="Run").first
    expect(run).to_be_visible(timeout=60_000)
    page.wait_for_function("() => !!window.app?.graph")
    page.screenshot(path=str(shots / "loaded.png"))

    # a graph opened as an API-format file (what dropping one on the page does)
    graph = txt2img_workflow("a red barn", steps=6, size=64)
    page.evaluate("async (g) => await window.app.loadApiJson(g, 'red-barn.json')", graph)
    expect(page.get_by_text("red-barn").first).to_be_visible(timeout=10_000)

    # the node library lists the cluster's node types by category and display name, as
    # their object_info gives them (the tiny chain's own, ComfyUI's image nodes under "image")
    page.get_by_role("button", name="Node Library (n)").click()
    page.get_by_text("corral-reference").first.click()
    for name in ("EmptyLatentImage", "KSampler"):
        expect(page.get_by_text(name, exact=True).first).to_be_visible(timeout=10_000)
    page.get_by_text("image", exact=True).first.click()
    for name in ("Save Image", "Load Image"):
        expect(page.get_by_text(name, exact=True).first).to_be_visible(timeout=10_000)
    page.screenshot(path=str(shots / "node-library.png"))
    page.get_by_role("button", name="Node Library (n)").click()

    page.get_by_role("button", name="Fit View (.)").click()  # the page loads images it shows
    run.click()

    def heard(kind: str) -> dict[str, Any] | None:
        page.wait_for_timeout(100)  # Playwright hands the page's events over while it waits
        return next((m for m in messages if m["type"] == kind), None)

    done = eventually(
        lambda: heard("execution_success"),
        timeout=120,
        what="the page told that its prompt succeeded",
    )
    prompt_id = done["data"]["prompt_id"]
    kinds = [m["type"] for m in messages if m.get("data", {}).get("prompt_id") == prompt_id]
    assert kinds[0] == "execution_start"
    assert {"progress", "executed"} <= set(kinds)

    queued = [a for a in answers if a.request.method == "POST" and "/comfyui/api/prompt" in a.url]
    assert [a.status for a in queued] == [200]
    assert queued[0].json()["prompt_id"] == prompt_id
    views = eventually(
        lambda: (
            heard("status")
            and [a for a in answers if "/comfyui/api/view?" in a.url and a.status == 200]
        ),
        what="the output image fetched by the page",
    )
    assert views[0].headers["content-type"].startswith("image/")
    page.screenshot(path=str(shots / "ran.png"))

    with cluster.client() as http:  # the prompt was a corral job, run on the CPU-only node
        jobs = http.get("/v1/jobs", params={"limit": 10}).json()["jobs"]
        (job,) = [j for j in jobs if j["payload"].get("prompt_id") == prompt_id]
        assert (job["state"], job["backend"], job["user"]) == ("succeeded", "comfyui", "ana")
        assert job["resources"]["gpus"] == 0
    assert not errors, errors
