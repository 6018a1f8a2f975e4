"""A finished allocation's results as the job rows keep them (``ResultFile``).

Small ones (each at most ``INLINE_RESULT``) ride in the job row with the end: no file,
no fsync of their own. Larger ones are files under ``results/<job>/<attempt>/``: written
from the bytes the agent sent, or, for a blob the agent uploaded, linked from it without
reading it (``BlobStore.link``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Sequence

from corral.server.agentlink.base import ResultBlob
from corral.server.services.outcomes import Ending
from corral.server.services.unit import Runtime
from corral.server.store.records import AllocRecord, ResultFile

INLINE_RESULT = 16 * 1024
"""Results up to this size (each) are kept in the job row: a no-op's ``b"ok"`` costs no file."""
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")

Files = dict[str, list[ResultFile]]  # job id -> its result files


def apart(results: Sequence[ResultBlob]) -> bool:
    """Results that cannot ride in the job row: too large, or uploaded as blobs."""
    return any(b.upload is not None or b.size > INLINE_RESULT for b in results)


def inline_results(rec: AllocRecord, results: Sequence[ResultBlob]) -> Files:
    """Small results kept in the job row (no blob file, no fsync of their own)."""
    files: Files = {}
    for blob, name, key in _owned(rec, results):
        digest = hashlib.sha256(blob.data).hexdigest()
        files.setdefault(blob.job_id, []).append(
            ResultFile(name, key, len(blob.data), blob.content_type, digest, blob.data)
        )
    return files


async def store_results(rt: Runtime, rec: AllocRecord, results: Sequence[ResultBlob]) -> Files:
    """Results as files in the blob store (before the end that names them commits)."""
    files: Files = {}
    for blob, name, key in _owned(rec, results):
        if blob.upload is not None:  # uploaded: linked, never read into memory
            stored = await rt.blobs.link(blob.upload, key)
        else:
            stored = await rt.blobs.put(key, blob.data)
        files.setdefault(blob.job_id, []).append(
            ResultFile(name, key, stored.size, blob.content_type, stored.sha256)
        )
    return files


def cut_batch(rec: AllocRecord, finished: Sequence[str], failed_job: str) -> dict[str, Ending]:
    """How the jobs of a batch cut short ended, when not as the allocation did: the jobs that
    finished before the failure succeeded; when the agent named the job that failed, the
    others never ran (they go back to the queue, no failure counted). Empty: all alike."""
    jobs = rec.alloc.job_ids
    if len(jobs) < 2 or not (finished or failed_job):
        return {}
    done = set(finished)
    endings = {j: Ending.SUCCEEDED for j in jobs if j in done}
    if failed_job in jobs:
        endings |= {j: Ending.CUT_SHORT for j in jobs if j not in done and j != failed_job}
    return endings


def _owned(
    rec: AllocRecord, results: Sequence[ResultBlob]
) -> Iterator[tuple[ResultBlob, str, str]]:
    """The results of ``rec``'s own jobs (an agent cannot write results for work it was not
    given), each with its file name (safe, a gang replica's prefixed) and its blob key."""
    prefix = f"r{rec.alloc.replica}-" if rec.alloc.replica else ""
    for blob in results:
        if blob.job_id in rec.alloc.job_ids:
            name = prefix + (_UNSAFE.sub("_", blob.name).strip("._") or "result")
            yield blob, name, f"results/{blob.job_id}/{rec.alloc.attempt}/{name}"
