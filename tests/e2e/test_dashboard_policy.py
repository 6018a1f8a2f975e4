"""The dashboard's policy (read only, admin) and usage panels in a real browser.

A real ``corral server`` and ``corral agent`` (fake GPUs): a policy applied
through the API shows its classes and who may use them; a running job's GPU
time shows in the usage plot beside its team's quota; a team token sees no
policy panel.
"""

from __future__ import annotations

import pytest
from e2e_harness import ADMIN, Cluster, submit, wait_state

pytestmark = pytest.mark.slow

POLICY = """\
format: 1
classes:
  - {name: surge, rank: 50, preempt_other_teams: true, allowed: {teams: [ops]}}
  - {name: free, rank: 20, default_time_limit_s: 600}
"""


def test_the_policy_and_each_team_s_usage_against_its_quota(
    cluster: Cluster, browser: object
) -> None:
    from playwright.sync_api import Browser, expect

    assert isinstance(browser, Browser)
    cluster.start_server()
    cluster.start_agent("gpu-box", "--fake-gpus", "1x RTX 4090 24GiB", "--cpus", "2")
    with cluster.client() as http:
        assert http.put("/v1/policy", json={"document": POLICY}).status_code == 200
        assert http.put("/v1/teams/default", json={"quota_gpus": 1}).status_code == 200
        job = submit(http, payload={"steps": 400, "step_s": 0.05}, resources={"gpus": 1})
        wait_state(http, job["id"], "running")
        team = http.post("/v1/tokens", json={"kind": "team", "name": "v", "team": "ops"})
        team_token = team.json()["token"]

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{cluster.http}/#token={ADMIN}")
    section = page.locator("#policy-section")
    expect(section).to_be_visible(timeout=10_000)
    expect(page.locator("#policy-version")).to_contain_text("version 1")
    expect(page.locator("#policy-classes")).to_contain_text("surge")
    expect(page.locator("#policy-classes")).to_contain_text("team ops")
    legend = page.locator("#plot-usage .u-legend")
    expect(legend).to_contain_text("default", timeout=10_000)
    expect(legend).to_contain_text("default quota")
    assert errors == []

    viewer = browser.new_page()
    viewer.goto(f"{cluster.http}/#token={team_token}")
    expect(viewer.locator("#nodes")).to_be_visible(timeout=10_000)
    expect(viewer.locator("#usage-section")).to_be_visible()
    expect(viewer.locator("#policy-section")).to_be_hidden()
