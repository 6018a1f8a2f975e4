"""Checkpoints between attempts: shipped to the server, fetched back where the job resumes.

An executor reports a checkpoint as a path (a file or a directory) and a
step. A job can resume on another machine, so the agent

* **ships** it: a path under one of the agent's shared-storage roots
  (``--shared-storage``, e.g. an NFS mount every node sees) is reported as
  it is; anything else is packed (tar) and uploaded in chunks before the
  report goes out, and the report names the blob (``Checkpoint.blob_id``);
  the server then keeps ``blob:<id>`` as the job's latest checkpoint;
* **fetches** it: an assignment whose ``resume_from`` is ``blob:<id>`` gets
  the blob downloaded (resumably) and unpacked into the job's checkpoint
  directory before its executor starts, and the executor sees the local
  path (``CORRAL_RESUME_FROM``, ``ctx.resume_from``) and the step.

A checkpoint that cannot be shipped is reported by path only (a resume on
this node still finds it); one that cannot be fetched is dropped, and the
attempt starts from the beginning: slower, never wrong.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc

from corral.agent import blobs
from corral.agent.executors.base import Checkpoint, JobWork
from corral.agent.orders import Report
from corral.core import LinkError
from corral.proto.gen.corral.v1 import agent_pb2 as pb

log = logging.getLogger("corral.agent.checkpoints")

BLOB = "blob:"
CONNECT_WAIT_S = 60.0
"""How long a resuming attempt waits for the link before starting without its checkpoint."""


class CheckpointCourier:
    def __init__(
        self,
        metadata: Sequence[tuple[str, str | bytes]],
        *,
        chunk_bytes: int,
        max_bytes: int,
        shared: Sequence[Path] = (),
        stub: Callable[[], Any] = lambda: None,
        connected: asyncio.Event | None = None,
        scratch: Path | None = None,
    ) -> None:
        self.metadata = tuple(metadata)
        self.chunk_bytes = chunk_bytes
        self.max_bytes = max_bytes
        self.shared = tuple(p.expanduser().resolve() for p in shared)
        self.stub = stub  # the connected session's stub, or None
        self.connected = connected or asyncio.Event()
        self.scratch = scratch  # where to unpack when a job has no checkpoint directory
        self.shipped = 0
        self.fetched = 0

    def on_shared_storage(self, path: Path) -> bool:
        resolved = path.expanduser().resolve()
        return any(resolved.is_relative_to(root) for root in self.shared)

    async def ship(self, stub: Any, report: Report) -> dict[int, str]:
        """Upload ``report``'s checkpoint unless it is on shared storage: ``{0: blob_id}`` or {}.

        Raises ``grpc.aio.AioRpcError`` when the connection breaks (the report is resent later).
        """
        update = report.update
        assert isinstance(update, Checkpoint)
        path = Path(update.path)
        if not update.path or self.on_shared_storage(path) or not path.exists():
            return {}
        size = await asyncio.to_thread(blobs.size_of, path)
        if size > self.max_bytes:
            log.warning("checkpoint %s is %d bytes, over the upload limit: path only", path, size)
            return {}
        chunk = pb.BlobChunk(
            allocation_id=report.allocation_id,
            attempt=report.attempt,
            name=f"{report.job_id or 'job'}/checkpoint-{update.step}.tar",
            mime="application/x-tar",
        )
        with tempfile.TemporaryDirectory(dir=self._temp_root(), prefix="ship-") as tmp:
            archive = await asyncio.to_thread(blobs.pack, path, Path(tmp) / "checkpoint.tar")
            try:
                blob = await blobs.upload(stub, self.metadata, chunk, archive, self.chunk_bytes)
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.UNAVAILABLE:
                    raise
                log.warning("the server refused checkpoint %s (%s): path only", path, exc.details())
                return {}
        self.shipped += 1
        return {0: blob}

    def _temp_root(self) -> Path | None:
        """Where archives travel from and to: the agent's scratch folder (its work dir, on
        the disk checkpoints live on), else the system's temp folder."""
        if self.scratch is None:
            return None
        self.scratch.mkdir(parents=True, exist_ok=True)
        return self.scratch

    async def prepare(self, job: JobWork) -> JobWork:
        """``job`` with an uploaded checkpoint fetched and unpacked locally (see the module doc)."""
        ref = job.resume_from
        if not ref or not ref.startswith(BLOB):
            return job
        try:
            path = await self._fetch(job, ref[len(BLOB) :])
        except Exception as exc:  # whatever went wrong, starting afresh is safe
            log.warning(
                "job %s: cannot fetch its checkpoint (%s); starting afresh", job.job_id, exc
            )
            return replace(job, resume_from=None, resume_step=0)
        self.fetched += 1
        log.info("job %s resumes from %s (step %d)", job.job_id, path, job.resume_step)
        return replace(job, resume_from=str(path))

    async def _fetch(self, job: JobWork, blob_id: str) -> Path:
        request = pb.BlobRequest(
            allocation_id=job.allocation_id, attempt=job.attempt, blob_id=blob_id
        )
        base = job.checkpoint_dir or self.scratch
        if base is None:
            raise LinkError("no directory to unpack the checkpoint into")
        into = Path(base) / f"resume-{job.attempt}"
        with tempfile.TemporaryDirectory(dir=self._temp_root(), prefix="fetch-") as tmp:
            archive = await self.download(request, Path(tmp) / "checkpoint.tar")
            return await asyncio.to_thread(blobs.unpack, archive, into)

    async def download(self, request: pb.BlobRequest, into: Path) -> Path:
        """The blob into the file ``into``, over whichever session is up; a session ending
        mid-way is retried."""
        for _ in range(blobs.FETCH_TRIES):
            async with asyncio.timeout(CONNECT_WAIT_S):  # not wait_for: it can lose a cancel
                await self.connected.wait()
            stub = self.stub()
            if stub is None:
                await asyncio.sleep(0.1)
                continue
            try:
                return await blobs.fetch(stub, self.metadata, request, into)
            except blobs.FetchRefused:
                raise
            except (LinkError, grpc.aio.UsageError) as exc:  # its channel closed under it
                log.info("fetching %s: %s; trying again", request.blob_id, exc)
                await asyncio.sleep(0.2)
        raise LinkError(f"could not download {request.blob_id}")
