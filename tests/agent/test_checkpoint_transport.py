"""Checkpoints between machines: packing, shipping decisions, and a fetch that fails safely."""

from __future__ import annotations

import asyncio
import hashlib
import io
import tarfile
from pathlib import Path
from typing import Any

import grpc
import pytest

from corral.agent import blobs
from corral.agent.checkpoints import CheckpointCourier
from corral.agent.executors.base import Checkpoint, JobWork
from corral.agent.orders import Report
from corral.core import LinkError
from corral.proto.gen.corral.v1 import agent_pb2 as pb

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["stdlib filter", "by hand"])
def extraction(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Unpack with tarfile's "data" filter (Python 3.11.4 on), or as a Python without
    extraction filters does (``blobs.extract_data``: Debian 12's 3.11.2)."""
    if request.param == "stdlib filter" and not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python has no tarfile extraction filters")
    if request.param == "by hand":
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    return str(request.param)


def _archive(tmp_path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> Path:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for info, data in members:
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data) if data else None)
    path = tmp_path / "handmade.tar"
    path.write_bytes(buffer.getvalue())
    return path


def _entry(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o4755  # setuid: must not survive
    return info


def test_a_file_and_a_directory_round_trip(tmp_path: Path, extraction: str) -> None:
    file = tmp_path / "model.pt"
    file.write_bytes(b"weights")
    folder = tmp_path / "ckpt"
    (folder / "opt").mkdir(parents=True)
    (folder / "opt" / "state").write_text("adam")
    (folder / "step").write_text("7")

    got = blobs.unpack(blobs.pack(file, tmp_path / "a1.tar"), tmp_path / "out1")
    assert (got.name, got.read_bytes()) == ("model.pt", b"weights")
    got = blobs.unpack(blobs.pack(folder, tmp_path / "a2.tar"), tmp_path / "out2")
    assert got.is_dir()
    assert (got / "opt" / "state").read_text() == "adam"
    assert blobs.size_of(folder) == len("adam") + len("7")


def test_an_archive_that_escapes_its_directory_is_refused(tmp_path: Path, extraction: str) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo("../escape")
        info.size = 1
        archive.addfile(info, io.BytesIO(b"x"))
    bad = tmp_path / "bad.tar"
    bad.write_bytes(buffer.getvalue())
    with pytest.raises((tarfile.TarError, LinkError)):
        blobs.unpack(bad, tmp_path / "in")
    assert not (tmp_path / "escape").exists()


def test_links_inside_the_checkpoint_are_kept_and_modes_made_plain(
    tmp_path: Path, extraction: str
) -> None:
    archive = _archive(
        tmp_path,
        (_entry("ck", tarfile.DIRTYPE), b""),
        (_entry("ck/weights"), b"w"),
        (_entry("ck/latest", tarfile.SYMTYPE, "weights"), b""),
        (_entry("ck/again", tarfile.LNKTYPE, "ck/weights"), b""),
    )
    got = blobs.unpack(archive, tmp_path / "out")
    assert (got / "latest").is_symlink()
    assert (got / "latest").read_bytes() == b"w"
    assert (got / "again").read_bytes() == b"w"
    assert not (got / "weights").stat().st_mode & 0o4000


@pytest.mark.parametrize(
    "entry",
    [
        _entry("ck/../../outside"),
        _entry("/ck"),
        _entry("ck/up", tarfile.SYMTYPE, "../../outside"),
        _entry("ck/abs", tarfile.SYMTYPE, "/etc/passwd"),
        _entry("ck/hard", tarfile.LNKTYPE, "/etc/passwd"),
        _entry("ck/pipe", tarfile.FIFOTYPE),
    ],
    ids=["dot-dot", "absolute", "symlink out", "absolute symlink", "hard link out", "pipe"],
)
def test_entries_that_leave_the_checkpoint_or_are_not_data_are_refused(
    tmp_path: Path, extraction: str, entry: tarfile.TarInfo
) -> None:
    archive = _archive(tmp_path, (_entry("ck", tarfile.DIRTYPE), b""), (entry, b""))
    with pytest.raises((tarfile.TarError, LinkError)):
        blobs.unpack(archive, tmp_path / "deep" / "out")
    assert not (tmp_path / "outside").exists()
    assert not (tmp_path / "deep" / "outside").exists()


class FakeStub:
    """UploadBlob that stores whole blobs (probe first, like the server); FetchBlob that fails."""

    def __init__(self) -> None:
        self.stored: dict[str, bytes] = {}

    async def UploadBlob(self, chunks: Any, metadata: Any = None) -> pb.BlobAck:
        parts = list(chunks)
        if len(parts) == 1 and not parts[0].data and not parts[0].last:
            return pb.BlobAck(received=0)
        blob_id = f"uploads/{parts[0].allocation_id}/{parts[0].attempt}/{parts[0].sha256}"
        self.stored[blob_id] = b"".join(p.data for p in parts)
        return pb.BlobAck(blob_id=blob_id, received=len(self.stored[blob_id]))


def courier(tmp_path: Path, **kw: Any) -> CheckpointCourier:
    settings = {"chunk_bytes": 4, "max_bytes": 1000, "shared": [tmp_path / "nfs"], **kw}
    return CheckpointCourier((), scratch=tmp_path / "scratch", **settings)


def report(path: Path | str, step: int = 3) -> Report:
    return Report("al_1", 1, Checkpoint(str(path), step), job_id="j1")


async def test_a_local_checkpoint_is_uploaded_and_named_by_its_blob(tmp_path: Path) -> None:
    ckpt = tmp_path / "local" / "step-3.json"
    ckpt.parent.mkdir()
    ckpt.write_text('{"step": 3}')
    stub = FakeStub()
    ids = await courier(tmp_path).ship(stub, report(ckpt))
    assert list(ids) == [0]
    assert ids[0].startswith("uploads/al_1/1/")
    archive = tmp_path / "got.tar"
    archive.write_bytes(stub.stored[ids[0]])
    back = blobs.unpack(archive, tmp_path / "back")
    assert back.read_text() == '{"step": 3}'
    assert ids[0].endswith(hashlib.sha256(stub.stored[ids[0]]).hexdigest())
    assert list((tmp_path / "scratch").iterdir()) == [], "the archive went once uploaded"


@pytest.mark.parametrize(
    ("where", "why"),
    [("nfs/step-3.json", "on shared storage"), ("gone/step-3.json", "not on disk (any more)")],
)
async def test_a_checkpoint_is_reported_by_path_when(tmp_path: Path, where: str, why: str) -> None:
    path = tmp_path / where
    if where.startswith("nfs"):
        path.parent.mkdir()
        path.write_text("{}")
    stub = FakeStub()
    assert await courier(tmp_path).ship(stub, report(path)) == {}, why
    assert stub.stored == {}


async def test_a_checkpoint_over_the_limit_is_reported_by_path(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(b"x" * 2000)
    assert await courier(tmp_path).ship(FakeStub(), report(big)) == {}


async def test_a_checkpoint_that_cannot_be_fetched_starts_the_attempt_afresh(
    tmp_path: Path,
) -> None:
    connected = asyncio.Event()
    connected.set()
    c = courier(tmp_path, stub=lambda: None, connected=connected)  # connected, but no stub
    job = JobWork("al_2", 2, ("j1",), resume_from="blob:uploads/al_1/1/ab", resume_step=3)
    ready = await c.prepare(job)
    assert (ready.resume_from, ready.resume_step) == (None, 0)
    local = JobWork("al_2", 2, ("j1",), resume_from="/nfs/ckpt", resume_step=3)
    assert await c.prepare(local) is local, "a path is used as it is"


class FlakyFetch:
    """FetchBlob on a channel that closes under the first call, then serves the blob."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.calls = 0

    def FetchBlob(self, request: pb.BlobRequest, metadata: Any = None) -> Any:
        self.calls += 1
        if self.calls == 1:
            raise grpc.aio.UsageError("Channel is closed.")
        return self._chunks(request)

    async def _chunks(self, request: pb.BlobRequest) -> Any:
        sha = hashlib.sha256(self.data).hexdigest()
        half = len(self.data) // 2
        for offset, last in ((0, False), (half, True)):
            end = None if last else half
            yield pb.BlobChunk(offset=offset, data=self.data[offset:end], last=last, sha256=sha)


async def test_an_uploaded_checkpoint_is_fetched_even_when_the_session_drops(
    tmp_path: Path,
) -> None:
    saved = tmp_path / "k-step5.json"
    saved.write_text('{"step": 5}')
    stub = FlakyFetch(blobs.pack(saved, tmp_path / "saved.tar").read_bytes())
    connected = asyncio.Event()
    connected.set()
    c = courier(tmp_path, stub=lambda: stub, connected=connected)
    job = JobWork(
        "al_2", 2, ("j1",), resume_from="blob:uploads/al_1/1/ab", resume_step=5,
        checkpoint_dir=tmp_path / "ckpt" / "j1",
    )  # fmt: skip
    ready = await c.prepare(job)
    assert ready.resume_from == str(tmp_path / "ckpt" / "j1" / "resume-2" / "k-step5.json")
    assert Path(ready.resume_from).read_text() == '{"step": 5}'
    assert (ready.resume_step, stub.calls, c.fetched) == (5, 2, 1)
    assert list((tmp_path / "scratch").iterdir()) == [], "the archive went once unpacked"


class CutOffUpload:
    """UploadBlob that keeps only the first ``keep`` bytes of the first full call (a cut-off
    connection), then takes the rest from where it stopped, as the server does."""

    def __init__(self, keep: int) -> None:
        self.keep, self.got, self.starts = keep, bytearray(), []

    async def UploadBlob(self, chunks: Any, metadata: Any = None) -> pb.BlobAck:
        parts = list(chunks)
        if len(parts) == 1 and not parts[0].data and not parts[0].last:
            return pb.BlobAck(received=len(self.got))
        self.starts.append(parts[0].offset)
        for part in parts:
            if part.offset == len(self.got):
                self.got += part.data
            if len(self.starts) == 1 and len(self.got) >= self.keep:
                return pb.BlobAck(received=len(self.got))
        return pb.BlobAck(blob_id=f"uploads/al_1/1/{parts[0].sha256}", received=len(self.got))


async def test_a_file_upload_resumes_where_it_was_cut_off(tmp_path: Path) -> None:
    source = tmp_path / "big.tar"
    source.write_bytes(bytes(range(256)) * 40)
    stub = CutOffUpload(keep=4000)
    base = pb.BlobChunk(allocation_id="al_1", attempt=1, name="big.tar")
    blob = await blobs.upload(stub, (), base, source, 1000)
    assert stub.starts == [0, 4000]
    assert bytes(stub.got) == source.read_bytes()
    assert blob.endswith(hashlib.sha256(source.read_bytes()).hexdigest())


async def test_a_download_that_does_not_match_its_sha256_is_dropped(tmp_path: Path) -> None:
    saved = tmp_path / "k.json"
    saved.write_text("{}")
    stub = FlakyFetch(blobs.pack(saved, tmp_path / "k.tar").read_bytes())
    stub.calls = 1  # no flake: serve at once
    original = stub._chunks

    async def lying(request: pb.BlobRequest) -> Any:  # the bytes do not match the sha256
        async for part in original(request):
            part.sha256 = "0" * 64
            yield part

    stub._chunks = lying  # type: ignore[method-assign]
    connected = asyncio.Event()
    connected.set()
    c = courier(tmp_path, stub=lambda: stub, connected=connected)
    job = JobWork("al_2", 2, ("j1",), resume_from="blob:uploads/al_1/1/ab", resume_step=5)
    ready = await c.prepare(job)
    assert (ready.resume_from, ready.resume_step, c.fetched) == (None, 0, 0)
    assert list((tmp_path / "scratch").iterdir()) == [], "nothing left half-written"
