"""A job's input files: fetched from the server before its executor starts, removed after.

A job that names uploaded files (``Work.inputs``) gets each downloaded through
``FetchBlob`` (``inputs/<sha256>``: resumable, its sha256 checked) into a folder of
its own, and its executor sees the local paths (``JobWork.inputs``): the ComfyUI
executor uploads them to its backend, the AUTOMATIC1111 one sends them as base64. A
file this machine made itself as a result (a pipeline's step before) is taken from
``ProducedFiles``, a hard link, with no transfer at all. A file that cannot be fetched
fails the attempt retryably (another attempt, maybe on another node, tries again):
unlike a checkpoint, a job cannot run without its inputs.
The folder is removed when the job's run ends, whatever its outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Protocol

from corral.agent.executors.base import InputPath, JobWork
from corral.agent.produced import ProducedFiles
from corral.proto.gen.corral.v1 import agent_pb2 as pb

log = logging.getLogger("corral.agent.inputs")

Download = Callable[[pb.BlobRequest, Path], Awaitable[Path]]


class InputFetcher(Protocol):
    """Puts a job's input files on local disk, and removes them (``agent/inputs.py``)."""

    async def fetch(self, job: JobWork) -> JobWork: ...

    async def discard(self, job: JobWork) -> None: ...


class InputCourier:
    def __init__(
        self, download: Download, root: Path, produced: ProducedFiles | None = None
    ) -> None:
        self.download = download  # over whichever session is up (``CheckpointCourier``)
        self.root = root
        self.produced = produced  # results this machine made: a pipeline's next step's inputs
        self.fetched = 0

    async def fetch(self, job: JobWork) -> JobWork:
        """``job`` with each input file on local disk; raises if one cannot be fetched."""
        folder = self.folder(job)
        ready: list[InputPath] = []
        for i, item in enumerate(job.inputs):
            request = pb.BlobRequest(
                allocation_id=job.allocation_id,
                attempt=job.attempt,
                blob_id=f"inputs/{item.sha256}",
            )
            local = folder / str(i) / (PurePosixPath(item.name).name or "input")
            here = await self.produced.take(item.sha256, local) if self.produced else None
            if here is not None:
                log.info("%s: input %s is a result made here: no transfer", job.job_id, item.name)
            path = here or await self.download(request, local)
            ready.append(replace(item, path=path))
            self.fetched += 1
        return replace(job, inputs=tuple(ready))

    def folder(self, job: JobWork) -> Path:
        return self.root / f"{job.allocation_id}-{job.attempt}" / job.job_id

    async def discard(self, job: JobWork) -> None:
        """Remove the job's fetched files."""
        folder = self.folder(job)
        await asyncio.to_thread(shutil.rmtree, folder, ignore_errors=True)
        with contextlib.suppress(OSError):  # the allocation's, once its last job's is gone
            folder.parent.rmdir()
