"""Input files over HTTP, on SQLite and PostgreSQL: ``/v1/inputs`` (streamed, capped per
file and per team, stored once per content), jobs naming them, the retention sweep, and
the drop-in ComfyUI ``/upload/image`` and ``/upload/mask`` answering as ComfyUI does."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_harness import ADMIN_TOKEN, Served, serve
from PIL import Image

from corral.server.loops.retention import RetentionLoop

pytestmark = pytest.mark.anyio
DAY = 86400.0
MAX_FILES = 6
LIMITS = {"inputs": {"max_bytes": 4096, "max_files": MAX_FILES, "retention_s": DAY}}
BASIC = {"Authorization": "Basic " + base64.b64encode(f"ann:{ADMIN_TOKEN}".encode()).decode()}


def png(color: tuple[int, ...], mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    Image.new(mode, (4, 4), color).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture
async def served(db_url: str, tmp_path: Path) -> AsyncIterator[Served]:
    async with serve(db_url, tmp_path, sections=LIMITS) as s:
        yield s


async def team(served: Served, name: str) -> httpx.AsyncClient:
    made = await served.admin.post("/v1/tokens", json={"kind": "team", "name": name, "team": name})
    return served.client(made.json()["token"])


async def put(client: httpx.AsyncClient, data: bytes, name: str = "a.png") -> httpx.Response:
    return await client.post("/v1/inputs", params={"name": name}, content=data)


def blobs(served: Served) -> list[str]:
    root = served.plane.rt.settings.blob_path() / "inputs"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


async def test_a_file_is_stored_once_and_each_team_holds_only_its_own(served: Served) -> None:
    red, blue = await team(served, "red"), await team(served, "blue")
    async with red, blue:
        first = await put(red, b"pixels", "a.png")
        assert first.status_code == 201
        sha = first.json()["blob"]
        assert (await put(red, b"pixels", "b.png")).json() == first.json()
        assert (await put(blue, b"pixels", "c.png")).json()["name"] == "c.png"  # its own row
        assert blobs(served) == [sha]  # the bytes once
        assert (await blue.get(f"/v1/inputs/{sha}")).json()["name"] == "c.png"
        assert (await red.delete(f"/v1/inputs/{sha}")).status_code == 204
        assert (await red.get(f"/v1/inputs/{sha}")).status_code == 404
        assert blobs(served) == [sha]  # blue still holds it
        assert (await blue.delete(f"/v1/inputs/{sha}")).status_code == 204
        assert blobs(served) == []


async def test_files_are_capped_in_size_and_in_number(served: Served) -> None:
    red = await team(served, "red")
    async with red:
        big = await put(red, b"x" * 4097)
        assert big.status_code == 413
        assert "inputs.max_bytes" in big.json()["message"]

        async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
            for _ in range(10):
                yield b"y" * 1000

        streamed = await red.post("/v1/inputs", params={"name": "s.bin"}, content=chunked())
        assert streamed.status_code == 413
        for n in range(MAX_FILES):
            assert (await put(red, f"file {n}".encode())).status_code == 201
        full = await put(red, b"one too many")
        assert full.status_code == 403
        assert "inputs.max_files" in full.json()["message"]
        assert (await put(red, b"file 0")).status_code == 201  # one it holds: no new file
        assert (
            await red.post("/v1/inputs", params={"name": "a/b"}, content=b"z")
        ).status_code == 422


async def test_a_job_may_name_only_files_of_its_team(served: Served) -> None:
    red, blue = await team(served, "red"), await team(served, "blue")
    async with red, blue:
        sha = (await put(red, b"photo")).json()["blob"]
        job = {"kind": "sample", "backend": "comfyui", "payload": {"workflow": {}}}
        ok = await red.post("/v1/jobs", json={**job, "inputs": [{"blob": sha, "name": "p.png"}]})
        assert ok.status_code == 201
        assert ok.json()["inputs"] == [{"blob": sha, "name": "p.png"}]
        theirs = await blue.post(
            "/v1/jobs", json={**job, "inputs": [{"blob": sha, "name": "p.png"}]}
        )
        assert theirs.status_code == 422
        assert theirs.json()["field"] == "inputs[0].blob"
        batch = await blue.post(
            "/v1/jobs/batch", json={"jobs": [job, {**job, "inputs": [{"blob": sha, "name": "x"}]}]}
        )
        assert batch.status_code == 422
        assert batch.json()["field"] == "jobs[1].inputs[0].blob"
        escape = await red.post(
            "/v1/jobs", json={**job, "inputs": [{"blob": sha, "name": "../etc/passwd"}]}
        )
        assert escape.status_code == 422


async def test_retention_deletes_unused_files_but_not_those_an_unended_job_names(
    served: Served,
) -> None:
    red = await team(served, "red")
    async with red:
        kept = (await put(red, b"named by a queued job")).json()["blob"]
        gone = (await put(red, b"nobody names me")).json()["blob"]
        job = {"kind": "sample", "backend": "comfyui", "payload": {}}
        await red.post("/v1/jobs", json={**job, "inputs": [{"blob": kept, "name": "k.png"}]})
        served.plane.rt.clock = _Later(served.plane.rt.clock, 2 * DAY)
        report = await RetentionLoop(served.plane.rt).sweep()
        assert report.inputs == 1
        assert blobs(served) == [kept]
        assert (await red.get(f"/v1/inputs/{gone}")).status_code == 404


class _Later:
    """The server's clock, ``by`` seconds on."""

    def __init__(self, clock: Any, by: float) -> None:
        self.clock, self.by = clock, by

    def now(self) -> float:
        return float(self.clock.now()) + self.by

    def __getattr__(self, name: str) -> Any:
        return getattr(self.clock, name)


async def upload(
    client: httpx.AsyncClient, name: str, data: bytes, path: str = "/upload/image", **form: str
) -> httpx.Response:
    return await client.post(path, files={"image": (name, data)}, data=form)


async def test_comfyuis_upload_answers_and_names(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.base_url, headers=BASIC) as comfy:
        red = png((255, 0, 0))
        first = await upload(comfy, "p.png", red)
        assert first.json() == {"name": "p.png", "subfolder": "", "type": "input"}
        assert (await upload(comfy, "p.png", red)).json()["name"] == "p.png"  # same bytes
        assert (await upload(comfy, "p.png", png((0, 9, 0)))).json()["name"] == "p (1).png"
        assert (await upload(comfy, "p.png", png((0, 0, 9)))).json()["name"] == "p (2).png"
        over = await upload(comfy, "p.png", png((1, 1, 1)), overwrite="true")
        assert over.json()["name"] == "p.png"
        shown = await comfy.get("/view", params={"filename": "p (1).png", "type": "input"})
        assert shown.content == png((0, 9, 0))
        assert shown.headers["content-type"] == "image/png"
        missing = await comfy.get("/view", params={"filename": "q.png", "type": "input"})
        assert missing.status_code == 404
        sub = await upload(comfy, "p.png", red, subfolder="masks", type="temp")
        assert sub.json() == {"name": "p.png", "subfolder": "masks", "type": "temp"}
        assert (await upload(comfy, "p.png", red, subfolder="../x")).status_code == 400
        assert (await upload(comfy, "p.png", red, type="elsewhere")).status_code == 400
        no_file = await comfy.post("/upload/image", data={"type": "input"})
        assert no_file.status_code == 400
        ref = json.dumps({"filename": "p.png", "subfolder": "", "type": "input"})
        mask = await upload(
            comfy, "p-mask.png", png((0, 0, 0, 40), "RGBA"), "/upload/mask", original_ref=ref
        )
        assert mask.json() == {"name": "p-mask.png", "subfolder": "", "type": "input"}
        lost = json.dumps({"filename": "none.png", "type": "input"})
        nothing = await upload(comfy, "n.png", red, "/upload/mask", original_ref=lost)
        assert nothing.json()["name"] == "n.png"  # answered, yet nothing saved (as ComfyUI)
        stored = [served.plane.rt.settings.blob_path() / "inputs" / sha for sha in blobs(served)]
        alphas = []
        for path in stored:
            with Image.open(path) as picture:
                if picture.mode == "RGBA":
                    alphas.append(picture.getpixel((0, 0)))
        assert alphas == [(1, 1, 1, 40)]  # the overwritten original, with the mask's alpha
