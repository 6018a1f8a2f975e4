"""The model registry over real HTTP: register, validate, upload (chunked, resumable,
checked), serve with Range, show where models are cached, remove.

Store-dependent paths run on SQLite and PostgreSQL; the HTTP details on SQLite.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from http_harness import Served, serve

from corral.server.agentlink.model_wire import DownloadInfo, ModelReport

pytestmark = pytest.mark.anyio
CHUNK = 64 * 1024  # the body limit these servers run with


@pytest.fixture
async def served(db_url: str, tmp_path: Path) -> AsyncIterator[Served]:
    async with serve(db_url, tmp_path, max_body_bytes=CHUNK) as s:
        yield s


@pytest.fixture
async def served_sqlite(tmp_path: Path) -> AsyncIterator[Served]:
    async with serve(str(tmp_path / "c.db"), tmp_path, max_body_bytes=CHUNK) as s:
        yield s


def blob(size: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(size)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def register(s: Served, name: str, **body: Any) -> dict[str, Any]:
    r = await s.admin.put(f"/v1/models/{name}", json=body)
    assert r.status_code in (200, 201), r.text
    return dict(r.json())


async def send(s: Served, name: str, data: bytes, start: int, size: int) -> Any:
    end = start + len(data) - 1
    headers = {"Content-Range": f"bytes {start}-{end}/{size}"}
    return await s.admin.put(f"/v1/models/{name}/upload", content=data, headers=headers)


async def test_a_url_model_is_registered_replaced_listed_and_removed(served: Served) -> None:
    data = blob(1024)
    body = {"sources": ["https://models.example/sdxl.safetensors"], "size": "1KiB"}
    r = await served.admin.put(
        "/v1/models/org/sdxl-base", json=body | {"sha256": sha(data), "backend": "a1111"}
    )
    assert r.status_code == 201, r.text
    created = r.json()
    assert (created["name"], created["size"], created["state"]) == ("org/sdxl-base", 1024, "ready")
    assert created["file_url"] is None
    assert created["cached"] == []

    r = await served.admin.put(
        "/v1/models/org/sdxl-base", json=body | {"sha256": sha(data), "kind": "lora"}
    )
    assert r.status_code == 200, r.text
    assert r.json()["kind"] == "lora"

    listed = (await served.admin.get("/v1/models")).json()
    assert [m["name"] for m in listed] == ["org/sdxl-base"]
    assert (await served.admin.get("/v1/models/org/sdxl-base")).json()["kind"] == "lora"

    assert (await served.admin.delete("/v1/models/org/sdxl-base")).status_code == 204
    assert (await served.admin.get("/v1/models/org/sdxl-base")).status_code == 404
    assert (await served.admin.delete("/v1/models/org/sdxl-base")).status_code == 404


@pytest.mark.parametrize(
    ("name", "body", "want_field"),
    [
        ("m", {"sources": ["https://x.example/m"], "size": 10}, "sha256"),
        ("m", {"sources": ["https://x.example/m"], "sha256": "ab" * 32}, "size"),
        ("m", {"sources": ["https://x.example/m"], "size": 10, "sha256": "xyz"}, "sha256"),
        ("m", {"sources": ["https://x.example/m", "ftp://x/m"], "size": 1, "sha256": "a" * 64},
         "sources[1]"),
        ("m", {"sources": ["upload", "/srv/m.bin"], "size": 1, "sha256": "a" * 64}, "sources[1]"),
        ("m", {"sources": ["upload"], "size": 1, "sha256": "a" * 64, "kind": "movie"}, "kind"),
        ("m", {"sources": ["/nowhere/at/all.bin"]}, "sources[0]"),
        ("org/file", {"sources": ["upload"], "size": 1, "sha256": "a" * 64}, "name"),
        ("-bad", {"sources": ["upload"], "size": 1, "sha256": "a" * 64}, "name"),
        ("m", {"sources": []}, "sources"),
    ],
    ids=[
        "url-without-sha", "url-without-size", "sha-not-hex", "ftp-source", "two-server-copies",
        "unknown-kind", "missing-server-file", "reserved-suffix", "bad-name", "no-sources",
    ],
)  # fmt: skip
async def test_bad_registrations_are_a_422_naming_the_field(
    served_sqlite: Served, name: str, body: dict[str, Any], want_field: str
) -> None:
    r = await served_sqlite.admin.put(f"/v1/models/{name}", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["field"] == want_field


async def test_a_server_file_is_hashed_and_served_with_range(
    served_sqlite: Served, tmp_path: Path
) -> None:
    data = blob(300_000, seed=7)
    path = tmp_path / "models" / "vae.safetensors"  # in the model directory: servable
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    entry = await register(served_sqlite, "vae-ft", sources=[f"file://{path}"], kind="vae")
    assert (entry["size"], entry["sha256"]) == (len(data), sha(data))
    assert entry["file_url"] == "/v1/models/vae-ft/file"

    whole = await served_sqlite.admin.get("/v1/models/vae-ft/file")
    assert whole.status_code == 200
    assert whole.content == data
    assert whole.headers["etag"] == f'"{sha(data)}"'
    part = await served_sqlite.admin.get(
        "/v1/models/vae-ft/file", headers={"Range": "bytes=1000-1999"}
    )
    assert part.status_code == 206
    assert part.content == data[1000:2000]
    assert part.headers["content-range"] == f"bytes 1000-1999/{len(data)}"


async def test_an_upload_survives_a_cut_and_resumes_from_what_arrived(served: Served) -> None:
    data = blob(3 * CHUNK + 123, seed=3)
    size = len(data)
    entry = await register(served, "dreambooth-v3", sources=["upload"], size=size, sha256=sha(data))
    assert entry["state"] == "uploading"
    assert entry["uploaded"] == 0
    assert (await served.admin.get("/v1/models/dreambooth-v3/file")).status_code == 409

    assert (await send(served, "dreambooth-v3", data[:CHUNK], 0, size)).status_code == 200
    # the client was cut off; it asks where to go on from
    status = (await served.admin.get("/v1/models/dreambooth-v3/upload")).json()
    assert status == {
        "name": "dreambooth-v3", "size": size, "received": CHUNK, "complete": False,
        "chunk_bytes": CHUNK,
    }  # fmt: skip
    gap = await send(served, "dreambooth-v3", data[2 * CHUNK : 3 * CHUNK], 2 * CHUNK, size)
    assert gap.status_code == 409
    assert str(CHUNK) in gap.json()["message"]
    # a retried chunk is rewritten, not appended twice
    assert (await send(served, "dreambooth-v3", data[:CHUNK], 0, size)).json()["received"] == CHUNK
    for start in range(CHUNK, size, CHUNK):
        r = await send(served, "dreambooth-v3", data[start : start + CHUNK], start, size)
        assert r.status_code == 200, r.text
    assert r.json()["complete"] is True
    got = (await served.admin.get("/v1/models/dreambooth-v3")).json()
    assert (got["state"], got["uploaded"]) == ("ready", size)
    served_bytes = await served.admin.get(
        "/v1/models/dreambooth-v3/file", headers={"Range": f"bytes={size - 100}-"}
    )
    assert served_bytes.status_code == 206
    assert served_bytes.content == data[-100:]


async def test_a_corrupted_upload_is_discarded_naming_both_hashes(served_sqlite: Served) -> None:
    data = blob(1000, seed=4)
    await register(served_sqlite, "m", sources=["upload"], size=1000, sha256=sha(data))
    bad = bytearray(data)
    bad[500] ^= 0xFF
    r = await send(served_sqlite, "m", bytes(bad), 0, 1000)
    assert r.status_code == 422
    assert r.json()["field"] == "sha256"
    assert sha(bytes(bad)) in r.json()["message"]
    status = (await served_sqlite.admin.get("/v1/models/m/upload")).json()
    assert (status["received"], status["complete"]) == (0, False)
    assert (await send(served_sqlite, "m", data, 0, 1000)).json()["complete"] is True


@pytest.mark.parametrize(
    ("header", "want"),
    [(None, "Content-Range"), ("bytes 0-9/11", "Content-Range"), ("bytes 0-4/10", "Content-Range"),
     ("items 0-9/10", "Content-Range")],
    ids=["missing", "wrong-total", "length-mismatch", "not-bytes"],
)  # fmt: skip
async def test_bad_chunks_are_refused_naming_content_range(
    served_sqlite: Served, header: str | None, want: str
) -> None:
    await register(served_sqlite, "m", sources=["upload"], size=10, sha256="a" * 64)
    headers = {"Content-Range": header} if header else {}
    r = await served_sqlite.admin.put("/v1/models/m/upload", content=b"x" * 10, headers=headers)
    assert r.status_code == 422
    assert r.json()["field"] == want


async def test_who_may_do_what(served_sqlite: Served, tmp_path: Path) -> None:
    s = served_sqlite
    models = tmp_path / "models"  # the model directory: files there may be served
    models.mkdir(exist_ok=True)
    (models / "f.bin").write_bytes(b"abc")
    await register(s, "f", sources=[str(models / "f.bin")])
    tokens = {}
    for kind, extra in (("team", {"team": "vision"}), ("agent", {})):
        r = await s.admin.post("/v1/tokens", json={"kind": kind, "name": kind, **extra})
        tokens[kind] = r.json()["token"]
    async with s.client(tokens["team"]) as team, s.client(tokens["agent"]) as agent:
        assert (await team.get("/v1/models")).status_code == 200
        put = await team.put("/v1/models/g", json={"sources": [str(models / "f.bin")]})
        assert put.status_code == 403
        assert (await team.delete("/v1/models/f")).status_code == 403
        assert (await agent.get("/v1/models")).status_code == 403
        fetched = await agent.get("/v1/models/f/file")  # agents download model files
        assert fetched.status_code == 200
        assert fetched.content == b"abc"
    async with s.client(None) as anonymous:
        assert (await anonymous.get("/v1/models/f/file")).status_code == 401


async def test_where_models_are_cached_comes_from_agents_reports(served: Served) -> None:
    data = blob(100)
    await register(
        served, "sdxl-base", sources=["https://x.example/sdxl"], size=100, sha256=sha(data)
    )
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        await served.agent(name)
    status = served.plane.model_status
    await status.report(
        "gpu-a", ModelReport(on_disk=frozenset({"sdxl-base"}), loaded=frozenset({"sdxl-base"}))
    )
    await status.report("gpu-b", ModelReport(on_disk=frozenset({"sdxl-base"}), budget_bytes=10**9))
    await status.report(
        "gpu-c", ModelReport(downloads=(DownloadInfo("sdxl-base", 43, 100, jobs=("j1",)),))
    )
    cached = (await served.admin.get("/v1/models/sdxl-base")).json()["cached"]
    assert [(c["node"], c["state"], c["progress"]) for c in cached] == [
        ("gpu-a", "loaded", None),
        ("gpu-b", "on_disk", None),
        ("gpu-c", "downloading", 0.43),
    ]
    node = (await served.admin.get("/v1/nodes/gpu-b")).json()
    assert node["models_on_disk"] == ["sdxl-base"]  # the scheduler routes by it
    budgets = await _budgets(served)
    assert budgets["gpu-b"].budget_bytes == 10**9
    assert "gpu-a" not in budgets


async def _budgets(s: Served) -> dict[str, Any]:
    async with s.plane.rt.db.read() as conn:
        return await s.plane.model_status.budgets(conn)
