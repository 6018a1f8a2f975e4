"""Where preview images live in the blob store, and how many a job keeps.

A preview is ``previews/<job id>/<attempt>-<random>.<ext>``; the retention sweep
(``loops/retention.py``) deletes a finished job's folder later on.
"""

from __future__ import annotations

from corral.server.services.unit import Runtime

PREVIEWS = "previews"


def preview_folder(job_id: str) -> str:
    return f"{PREVIEWS}/{job_id}"


def preview_key(job_id: str, name: str) -> str:
    return f"{preview_folder(job_id)}/{name}"


async def keep_latest(rt: Runtime, job_id: str) -> int:
    """A job keeps its latest ``retention.previews_per_job`` previews (a long run that sends
    one a minute must not fill the disk); the oldest go. How many were deleted."""
    keep = rt.settings.retention.previews_per_job
    if keep <= 0:
        return 0
    stored = await rt.blobs.keys(preview_folder(job_id))
    old = stored[: max(0, len(stored) - keep)]
    for key in old:
        await rt.blobs.delete(key)
    return len(old)
