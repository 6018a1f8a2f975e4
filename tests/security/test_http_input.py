"""Attacks on the HTTP API's input parsing (issue 45, item 7): malformed values that once
reached the database, or a decoder, and answered 500 now answer 4xx naming what is wrong,
on SQLite and PostgreSQL alike (one server per database, every value sent to it)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from http_harness import Served, serve

pytestmark = pytest.mark.anyio

FORGED_CURSORS = {  # what each holds, in the API's own encoding
    "past 64 bits": "s" + "9" * 30,
    "one past the largest sequence number": "s9223372036854775808",
    "negative": "s-1",
    "underscores": "s1_000",
    "non-ASCII digits": "s ١٢",
}
NUL_BODIES = {"/queue": {"delete": ["a\x00b"]}, "/interrupt": {"prompt_id": "\x00"}}


@pytest.fixture
async def served(db_url: str, tmp_path: Path) -> AsyncIterator[Served]:
    async with serve(db_url, tmp_path) as s:
        yield s


def cursor_of(text: str) -> str:
    """A cursor in the API's encoding, holding ``text`` (a real one holds ``s<seq>``)."""
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


async def test_a_forged_cursor_is_a_422_naming_the_cursor(served: Served) -> None:
    for what, held in FORGED_CURSORS.items():
        reply = await served.admin.get("/v1/jobs", params={"cursor": cursor_of(held)})
        assert reply.status_code == 422, (what, reply.text)
        assert reply.json()["field"] == "cursor", what
    for _ in range(3):  # and a real cursor still pages
        assert (await served.admin.post("/v1/jobs", json={"payload": {}})).status_code == 201
    first = (await served.admin.get("/v1/jobs", params={"limit": 2})).json()
    rest = await served.admin.get("/v1/jobs", params={"cursor": first["next_cursor"]})
    assert rest.status_code == 200
    assert len(first["jobs"]) + len(rest.json()["jobs"]) == 3


async def test_a_basic_header_that_is_not_ascii_is_a_401(served: Served) -> None:
    async with served.client(None) as anyone:
        for path in ("/sdapi/v1/progress", "/queue"):
            basic = "Basic bÔìF¨".encode("latin-1")
            reply = await anyone.get(path, headers={"Authorization": basic})
            assert reply.status_code == 401, (path, reply.text)


async def test_a_nul_in_a_comfyui_body_is_a_400(served: Served) -> None:
    for path, body in NUL_BODIES.items():
        reply = await served.admin.post(path, json=body)
        assert reply.status_code == 400, (path, reply.text)
        assert "NUL" in reply.json()["error"]["message"]
