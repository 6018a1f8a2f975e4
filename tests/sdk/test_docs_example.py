"""The ten-line web app of docs/sdk.md, run word for word against a server process."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from live_server import Running

DOC = Path(__file__).resolve().parents[2] / "docs" / "sdk.md"


def web_app_example() -> str:
    section = DOC.read_text(encoding="utf-8").split("## A web app in ten lines", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "no python block under 'A web app in ten lines'"
    return match.group(1)


def test_the_web_app_example_draws_through_corral(
    stub: Running, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    code = web_app_example()
    assert len([line for line in code.splitlines() if line.strip()]) <= 10
    monkeypatch.setenv("CORRAL_URL", stub.url)
    monkeypatch.setenv("CORRAL_TOKEN", stub.token)
    monkeypatch.setenv("CORRAL_CONFIG", str(tmp_path / "config.toml"))
    namespace: dict[str, Any] = {}
    exec(compile(code, str(DOC), "exec"), namespace)

    with TestClient(namespace["app"]) as web:
        try:
            reply = web.post("/draw", params={"prompt": "a red fox", "user": "ada"})
        finally:
            web.portal.call(namespace["corral"].close)
    assert reply.status_code == 200, reply.text
    assert reply.content.startswith(b"done job_")
    assert reply.headers["content-type"].startswith("text/plain")
