"""Models end to end: a real server, two real agents (processes), real downloads.

One model is uploaded to the server through the API (the server serves it with
Range); the other lives on an HTTP file server that drops the connection half
way through the first transfer. Each agent's cache budget holds one model, not
both. Jobs go to the agent that has their model; a job shows "waiting for model
X: N%" while its agent downloads; the registry (and the dashboard, in a real
browser) shows where each model is.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_harness import ADMIN, Cluster, events, eventually, submit, wait_state

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "agent"))

from model_fixtures import FileServer, file_server

from corral.sdk import Client

pytestmark = pytest.mark.slow
MIB = 1024 * 1024
ALPHA = random.Random(1).randbytes(6 * MIB)
BETA = random.Random(2).randbytes(6 * MIB)
QUICK = {"steps": 2, "step_s": 0.02, "preview_every": 0}
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
ARTIFACTS = Path(os.environ.get("CORRAL_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts"))


@pytest.fixture
def files() -> Iterator[FileServer]:
    with file_server() as s:
        yield s


def cached(http: Any, model: str) -> dict[str, str]:
    return {c["node"]: c["state"] for c in http.get(f"/v1/models/{model}").json()["cached"]}


def cached_on(http: Any, model: str, want: dict[str, str]) -> None:
    """Wait until the registry says ``model`` is cached exactly as ``want`` (agents report it
    after the job; a loaded machine may take a while), showing the last answer on failure."""
    seen: list[dict[str, str]] = []
    ok = lambda: (seen.append(cached(http, model)) or seen[-1]) == want  # noqa: E731
    try:
        eventually(ok, timeout=45, what=f"{model} cached as {want}")
    except AssertionError as e:
        raise AssertionError(f"{e}; the registry said {seen[-1]}") from None


def run(http: Any, model: str, **extra: Any) -> dict[str, Any]:
    job = submit(http, model=model, payload=QUICK, **extra)
    return wait_state(http, job["id"], "succeeded", "failed", timeout=60)


def test_jobs_go_to_the_agent_that_has_their_model(
    cluster: Cluster, files: FileServer, tmp_path: Path
) -> None:
    # The model files come from an HTTP server on loopback: a private address agents may use.
    cluster.start_server(CORRAL_MODELS__ALLOWED_NETWORKS='["127.0.0.0/8"]')
    for name in ("gpu-a", "gpu-b"):
        cluster.start_agent(
            name, "--fake-gpus", "1x RTX 4090 24GiB", "--cpus", "1", "--labels", f"box={name}",
            "--models-budget", "9MiB",
        )  # fmt: skip
    (tmp_path / "alpha.safetensors").write_bytes(ALPHA)
    beta_url = files.add("beta.safetensors", BETA, drop_at=3 * MIB)  # the first try is cut off
    with Client(cluster.http, ADMIN) as sdk:
        sdk.add_model("alpha", file=str(tmp_path / "alpha.safetensors"))
        sdk.add_model("beta", sources=[beta_url], size=len(BETA),
                      sha256=hashlib.sha256(BETA).hexdigest())  # fmt: skip
    with cluster.client() as http:
        first = run(http, "alpha", node_selector={"box": "gpu-a"})
        assert (first["state"], first["node"]) == ("succeeded", "gpu-a"), first
        waiting = [
            e["data"]["data"].get("message", "")
            for e in events(http, first["id"])
            if e["event"] == "job.progress"
        ]
        assert any(m.startswith("waiting for model alpha: ") for m in waiting), waiting
        cached_on(http, "alpha", {"gpu-a": "on_disk"})

        beta = run(http, "beta", node_selector={"box": "gpu-b"})
        assert (beta["state"], beta["node"]) == ("succeeded", "gpu-b"), beta
        assert [h.range for h in files.hits("beta.safetensors")][:2] == [
            "bytes=0-6291455",  # one 16 MiB chunk asked for the whole 6 MiB file ...
            "bytes=3145728-6291455",  # ... cut off at 3 MiB: resumed from there
        ]
        cached_on(http, "beta", {"gpu-b": "on_disk"})

        # No selector now: each job goes where its model already is.
        for model, node in (("alpha", "gpu-a"), ("beta", "gpu-b"), ("alpha", "gpu-a")):
            done = run(http, model)
            assert (done["state"], done["node"]) == ("succeeded", node), (model, done)

        # gpu-b's budget holds one model: fetching alpha there evicts beta.
        forced = run(http, "alpha", node_selector={"box": "gpu-b"})
        assert forced["state"] == "succeeded", forced
        eventually(
            lambda: cached(http, "alpha") == {"gpu-a": "on_disk", "gpu-b": "on_disk"},
            what="alpha on both",
        )
        assert cached(http, "beta") == {}
        nodes = {n["name"]: n["models_on_disk"] for n in http.get("/v1/nodes").json()}
        assert nodes == {"gpu-a": ["alpha"], "gpu-b": ["alpha"]}
    dashboard_shows_where_models_are(cluster.http)


def dashboard_shows_where_models_are(url: str) -> None:
    """The dashboard's Models section, in a real browser (Debian chromium, Playwright)."""
    from playwright.sync_api import expect, sync_playwright

    shots = ARTIFACTS / "dashboard"
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{url}/#token={ADMIN}")
            alpha = page.locator('#models tr[data-model="alpha"]')
            expect(alpha.locator("td.cached")).to_have_text("gpu-a, gpu-b", timeout=10_000)
            expect(page.locator('#models tr[data-model="beta"] td.cached')).to_have_text(
                "not cached yet"
            )
            expect(page.locator('#nodes .node[data-node="gpu-b"]')).to_contain_text(
                "models on disk: alpha"
            )
            page.screenshot(path=str(shots / "models.png"), full_page=True)
        finally:
            browser.close()
