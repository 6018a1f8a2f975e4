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
"""

from __future__ import annotations

import logging

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
    parts = key.split("/")
    if len(parts) != 4 or parts[0] != UPLOADS or not all(parts):
        return None  # not the upload service's naming: not ours to delete
    return key, parts[1]


def drop_after_commit(rt: Runtime, tx: Tx, ref: str | None) -> None:
    """After ``tx`` commits, delete the uploaded checkpoint ``ref`` if no job needs it."""
    found = uploaded(ref)
    if found is None:
        return
    key, allocation_id = found

    async def drop() -> None:
        async with rt.db.read() as conn:
            rec = await alloc_repo.get(conn, allocation_id)
            jobs = await job_repo.get_many(conn, rec.alloc.job_ids if rec else ())
        if any(j.checkpoint == ref and j.state not in JOB.terminal for j in jobs.values()):
            return  # another job of the batch resumes from it
        try:
            await rt.blobs.delete(key)
        except OSError as exc:  # the disk said no: the next drop of it, or an admin, retries
            log.warning("could not delete checkpoint %s: %s", key, exc)

    tx.then(drop)
