"""Results cannot act as pages of the dashboard, and the dashboard keeps no token in reach of
a script (issue 45, item 10).

A job's ``text/html`` or SVG result is what an attacker who can run a job (a
team token, a compromised agent) would use to run script on the dashboard's
origin: it is served as an attachment, with ``nosniff`` and a sandboxing CSP,
from the API, the ComfyUI ``/view`` and the previews alike. The dashboard
itself is served with a strict CSP and may not be framed; its login sets an
HttpOnly, SameSite=Strict cookie scoped to the API, and a request that changes
something on the strength of that cookie alone needs the ``X-Corral-CSRF`` header.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from http_harness import ADMIN_TOKEN, Served, serve, sse_events

from corral.server.agentlink.base import ResultBlob
from corral.server.api.web import WEB

pytestmark = pytest.mark.anyio

SCRIPT = b"<html><script>fetch('/v1/tokens').then(r => r.text()).then(alert)</script></html>"
SVG = b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(document.cookie)</script></svg>'
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32
RESULTS = [
    ("page.html", SCRIPT, "text/html"),
    ("big.html", SCRIPT * 400, "text/html; charset=utf-8"),  # past the inline size: a blob
    ("logo.svg", SVG, "image/svg+xml"),
    ("notes.txt", SCRIPT, "text/plain"),  # sniffed as HTML by a browser without nosniff
    ("out.png", PNG, "image/png"),
]


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with serve(str(tmp_path / "corral.db"), tmp_path) as s:
        yield s


async def finished_job(served: Served) -> tuple[str, str]:
    """A job that ended with ``RESULTS`` and sent one preview: (its id, the preview's URL)."""
    agent = await served.agent("n1")
    job = (await served.admin.post("/v1/jobs", json={"payload": {}})).json()["id"]
    a = await agent.next_assignment()
    await agent.start(a)
    await agent.preview(a, job, PNG)
    blobs = [ResultBlob(job, name, data, kind) for name, data, kind in RESULTS]
    await served.plane.agents.finished(agent.node, a.allocation_id, a.attempt, blobs)
    params = {"kind": "job.preview"}
    async with served.admin.stream("GET", f"/v1/jobs/{job}/events", params=params) as stream:
        previews = [frame async for frame in sse_events(stream)]  # ends: the job has ended
    return job, previews[0]["data"]["data"]["url"]


async def test_a_result_is_never_a_page_of_the_dashboard(served: Served) -> None:
    job, _ = await finished_job(served)
    for name, _, _ in RESULTS:
        api = await served.admin.get(f"/v1/jobs/{job}/result/{name}")
        view = await served.admin.get("/view", params={"filename": name, "subfolder": job})
        for reply in (api, view):
            assert reply.status_code == 200, reply.text
            _assert_inert(reply, inline=name.endswith(".png"))
            assert name in reply.headers["content-disposition"]


async def test_previews_and_model_files_are_inert_too(served: Served, tmp_path: Path) -> None:
    _, preview_url = await finished_job(served)
    preview = await served.admin.get(preview_url)
    assert preview.status_code == 200, preview.text
    _assert_inert(preview, inline=True)
    model = tmp_path / "models" / "m.html"
    model.parent.mkdir(exist_ok=True)
    model.write_bytes(SCRIPT)
    assert (await served.admin.put("/v1/models/m", json={"sources": [str(model)]})).is_success
    _assert_inert(await served.admin.get("/v1/models/m/file"), inline=False)


async def test_the_dashboard_runs_only_its_own_script_and_is_never_framed(
    served: Served,
) -> None:
    for path in ("/", "/static/app.js", "/static/style.css"):
        reply = await served.admin.get(path)
        assert reply.status_code == 200
        csp = _directives(reply.headers["content-security-policy"])
        assert csp["script-src"] == ["'self'"]
        assert csp["frame-ancestors"] == ["'none'"]
        assert "'unsafe-inline'" not in str(csp)
        assert "'unsafe-eval'" not in str(csp)
        assert reply.headers["x-frame-options"] == "DENY"
        assert reply.headers["referrer-policy"] == "no-referrer"
        assert reply.headers["x-content-type-options"] == "nosniff"
    page = (WEB / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", page), "an inline <script>"
    assert not re.search(r"\son[a-z]+\s*=", page), "an inline event handler"


async def test_the_login_sets_a_cookie_no_script_or_other_site_can_use(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.base_url, timeout=10) as browser:
        login = await browser.post(
            "/v1/session", json={"token": ADMIN_TOKEN}, headers={"X-Corral-CSRF": "1"}
        )
        assert login.status_code == 200, login.text
        cookie = login.headers["set-cookie"].lower()
        for attribute in ("httponly", "samesite=strict", "path=/v1", "max-age="):
            assert attribute in cookie, cookie
        assert "secure" not in cookie  # plain HTTP here; over TLS the cookie is Secure
        assert (await browser.get("/v1/queue")).status_code == 200  # the cookie alone reads
        assert (await browser.get("/v1/session")).json()["kind"] == "admin"

        forged = await browser.post("/v1/jobs", json={"payload": {}})  # no CSRF header
        assert forged.status_code == 403, forged.text
        assert "X-Corral-CSRF" in forged.json()["message"]
        forged = await browser.post("/v1/nodes/n1/pause")
        assert forged.status_code == 403
        assert (await browser.get("/v1/jobs")).json()["jobs"] == []
        sent = await browser.post("/v1/jobs", json={"payload": {}}, headers={"X-Corral-CSRF": "1"})
        assert sent.status_code == 201

        out = await browser.delete("/v1/session", headers={"X-Corral-CSRF": "1"})
        assert out.status_code == 204
        assert (await browser.get("/v1/queue")).status_code == 401


async def test_bearer_tokens_work_as_before_and_agent_tokens_cannot_log_in(
    served: Served,
) -> None:
    agent = (await served.admin.post("/v1/tokens", json={"kind": "agent", "name": "a"})).json()
    async with served.client(None) as anyone:
        refused = await anyone.post(
            "/v1/session", json={"token": agent["token"]}, headers={"X-Corral-CSRF": "1"}
        )
        assert refused.status_code == 403
        assert "set-cookie" not in refused.headers
        bad = await anyone.post(
            "/v1/session", json={"token": "nope"}, headers={"X-Corral-CSRF": "1"}
        )
        assert bad.status_code == 401
    assert (await served.admin.post("/v1/jobs", json={"payload": {}})).status_code == 201


def _assert_inert(reply: httpx.Response, *, inline: bool) -> None:
    headers = reply.headers
    assert headers["x-content-type-options"] == "nosniff"
    csp = _directives(headers["content-security-policy"])
    assert "sandbox" in csp
    assert csp["default-src"] == ["'none'"]
    disposition = headers["content-disposition"].split(";")[0]
    assert disposition == ("inline" if inline else "attachment"), headers


def _directives(policy: str) -> dict[str, list[str]]:
    parts = [p.split() for p in policy.split(";") if p.strip()]
    return {p[0]: p[1:] for p in parts}
