"""Attacks on the HTTP API's input parsing (issue 45, item 7): malformed values that once
reached the database answer 422 naming the field, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from http_harness import serve

pytestmark = pytest.mark.anyio


def cursor_of(text: str) -> str:
    """A cursor in the API's encoding, holding ``text`` (a real one holds ``s<seq>``)."""
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "held",
    [
        pytest.param("s" + "9" * 30, id="past-64-bits"),
        pytest.param("s9223372036854775808", id="one-past-the-largest-seq"),
        pytest.param("s-1", id="negative"),
        pytest.param("s1_000", id="underscores"),
        pytest.param("s ١٢", id="non-ascii-digits"),
    ],
)
async def test_a_forged_cursor_is_a_422_naming_the_cursor(
    db_url: str, tmp_path: Path, held: str
) -> None:
    async with serve(db_url, tmp_path) as served:
        reply = await served.admin.get("/v1/jobs", params={"cursor": cursor_of(held)})
        assert reply.status_code == 422, reply.text
        assert reply.json()["field"] == "cursor"
        assert "cursor" in reply.json()["message"]


async def test_a_real_cursor_still_pages(db_url: str, tmp_path: Path) -> None:
    async with serve(db_url, tmp_path) as served:
        for _ in range(3):
            assert (await served.admin.post("/v1/jobs", json={"payload": {}})).status_code == 201
        first = (await served.admin.get("/v1/jobs", params={"limit": 2})).json()
        rest = await served.admin.get("/v1/jobs", params={"cursor": first["next_cursor"]})
        assert rest.status_code == 200
        assert len(first["jobs"]) + len(rest.json()["jobs"]) == 3


@pytest.mark.parametrize("path", ["/sdapi/v1/progress", "/queue"])
async def test_a_basic_header_that_is_not_ascii_is_a_401(
    db_url: str, tmp_path: Path, path: str
) -> None:
    async with serve(db_url, tmp_path) as served, served.client(None) as anyone:
        reply = await anyone.get(path, headers={"Authorization": "Basic bÔìF¨".encode("latin-1")})
        assert reply.status_code == 401, reply.text


@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param("/queue", {"delete": ["a\x00b"]}, id="queue-delete"),
        pytest.param("/interrupt", {"prompt_id": "\x00"}, id="interrupt"),
    ],
)
async def test_a_nul_in_a_comfyui_body_is_a_400(
    db_url: str, tmp_path: Path, path: str, body: dict[str, object]
) -> None:
    async with serve(db_url, tmp_path) as served:
        reply = await served.admin.post(path, json=body)
        assert reply.status_code == 400, reply.text
        assert "NUL" in reply.json()["error"]["message"]
