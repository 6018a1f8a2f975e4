"""The dashboard says "resumed from step N" for a job that resumed from a checkpoint.

Real processes and a real browser (Debian chromium via Playwright): a job
checkpoints on one agent, the agent is killed, the job resumes on another,
and its card shows the attempt and the step it resumed from.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_harness import ADMIN, Cluster, eventually, job, submit, wait_state

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
BENCH = Path(__file__).resolve().parents[2] / "bench"
HANDLER = ("--handler", "chaos_work:run", "--fake-gpus", "1x RTX 4090 24GiB")


@pytest.fixture
def page() -> Iterator[object]:
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian chromium is required for the dashboard test (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--no-first-run"]
        )
        try:
            yield browser.new_page(viewport={"width": 1280, "height": 900})
        finally:
            browser.close()


def test_a_resumed_job_says_from_which_step(
    cluster: Cluster, page: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    from playwright.sync_api import Page, expect

    assert isinstance(page, Page)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(BENCH), os.environ.get("PYTHONPATH", "")])
    )
    cluster.start_server(node_timeout=2.0)
    first = cluster.start_agent("box-a", *HANDLER)
    with cluster.client() as c:
        payload = {"key": "dash", "steps": 30, "step_s": 0.1, "checkpoint_every": 5}
        j = submit(c, kind="train", payload=payload, resources={"gpus": 1})
        eventually(lambda: (job(c, j["id"]).get("checkpoint_step") or 0) >= 5, 20, "checkpoint")
        first.kill9()
        cluster.start_agent("box-b", *HANDLER)
        done = wait_state(c, j["id"], "succeeded", timeout=40)

    page.goto(f"{cluster.http}/#token={ADMIN}")
    card = page.locator(f'#finished [data-job="{j["id"]}"]')
    expect(card.locator(".resumed")).to_have_text(
        f"attempt 2 · resumed from step {done['resumed_from_step']}", timeout=10_000
    )
