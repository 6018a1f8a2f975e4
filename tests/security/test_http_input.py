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
