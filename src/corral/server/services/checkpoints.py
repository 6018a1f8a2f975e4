"""Uploaded checkpoints are kept while a job may still resume from them, and no longer.

A job's checkpoint is ``blob:<id>`` when its agent uploaded it (``grpc_uploads``:
``uploads/<allocation>/<attempt>/<sha256>``); otherwise it is a path on shared
storage, which belongs to the user and is never touched. Only the latest one is
ever handed to a next attempt, and none once the job has ended, so a training job
that checkpoints every few minutes would otherwise leave every superseded archive
on the server's disk. ``drop_after_commit`` deletes such a blob once the change
that stopped needing it has committed: the one a newer checkpoint replaces, and a
job's last one when the job ends (succeeded, failed for good, cancelled). A blob
stays while any job of the allocation that uploaded it (a batch shares one) still
names it and has not ended. Jobs keep the reference in their JSON as history.
Results uploaded the same way are deleted once copied under ``results/`` (the
agent link asks for it a while later: ``AgentLinkService._uploads_read``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from corral.core.states import JOB
from corral.server.services.unit import Runtime, Tx
from corral.server.store import allocations as alloc_repo
from corral.server.store import jobs as job_repo

log = logging.getLogger("corral.server.checkpoints")

BLOB = "blob:"
UPLOADS = "uploads"


def uploaded(ref: str | None) -> tuple[str, str] | None:
    """``(blob key, uploading allocation)`` of an uploaded checkpoint ``ref``, else None."""
    if ref is None or not ref.startswith(BLOB):
        return None
    key = ref[len(BLOB) :]
    allocation_id = _uploader(key)
    return None if allocation_id is None else (key, allocation_id)


def _uploader(key: str) -> str | None:
    """The allocation that uploaded blob ``key``; None if not the upload service's naming
    (then it is not ours to delete)."""
    parts = key.split("/")
    if len(parts) != 4 or parts[0] != UPLOADS or not all(parts):
        return None
    return parts[1]


def drop_after_commit(rt: Runtime, tx: Tx, ref: str | None) -> None:
    """After ``tx`` commits, delete the uploaded checkpoint ``ref`` if no job needs it."""
    found = uploaded(ref)
    if found is None:
        return
    key, allocation_id = found

    async def drop() -> None:
        await drop_uploads(rt, allocation_id, [key])

    tx.then(drop)


async def drop_uploads(rt: Runtime, allocation_id: str, keys: Sequence[str]) -> None:
    """Delete ``allocation_id``'s uploads ``keys`` that no job of it resumes from.

    Results travel through the same uploads as checkpoints (``uploads_read``: once a
    result is copied under ``results/``, its upload is no use), and a result with a
    checkpoint's bytes is that very blob: it stays while a job still names it.
    """
    mine = [k for k in keys if _uploader(k) == allocation_id]
    if not mine:
        return
    async with rt.db.read() as conn:
        rec = await alloc_repo.get(conn, allocation_id)
        jobs = await job_repo.get_many(conn, rec.alloc.job_ids if rec else ())
    needed = {j.checkpoint for j in jobs.values() if j.state not in JOB.terminal}
    for key in mine:
        if BLOB + key in needed:
            continue  # a job of the allocation (a batch shares one) resumes from it
        try:
            await rt.blobs.delete(key)
        except OSError as exc:  # the disk said no: an admin, or the next drop of it, retries
            log.warning("could not delete upload %s: %s", key, exc)


async def may_fetch(rt: Runtime, allocation_id: str, attempt: int, blob_id: str) -> bool:
    """Only a live allocation resuming from ``blob_id`` may download it."""
    async with rt.db.read() as conn:
        rec = await alloc_repo.get(conn, allocation_id)
        if rec is None or rec.alloc.attempt != attempt or not rec.alloc.active:
            return False
        jobs = await job_repo.get_many(conn, rec.alloc.job_ids)
    return any(j.checkpoint == BLOB + blob_id for j in jobs.values())
