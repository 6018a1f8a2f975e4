"""The retention sweep: what the server deletes, and when (docs/server.md, "Retention").

Every ``retention.sweep_s`` the leader (one replica, as for liveness) deletes

* **previews of finished jobs** ``retention.previews_s`` after they ended: the
  image files, and the job's ``job.progress`` and ``job.preview`` events. The
  job, its other events, logs and results stay. Found from the folders under
  ``previews/`` (only jobs that sent previews have one, and the folder goes
  with them), so a sweep never reads every job. A folder of a job that no
  longer exists is deleted too;
* **finished jobs** ``retention.finished_jobs_s`` after they ended: the row,
  its events, its ended allocations, its result files and previews. Walked in
  submission order from the oldest job left, in batches of
  ``retention.batch``, and stopped at the first job submitted after the
  cutoff (it cannot have ended before it): jobs already deleted are never
  read again, so a sweep costs what it deletes plus the few old jobs still
  running. Events of no job (nodes, teams) go at the same age;
* **input files** nobody uploaded or named in a job for ``inputs.retention_s``,
  unless a job that has not ended names them (``services/inputs.py``);
* **audit records** ``retention.audit_s`` after they were made (a year by
  default), the oldest first, ``retention.batch`` × 10 per transaction. Nothing
  else ever deletes one (services/audit.py).

Files go before rows (``services/forget.py``): a sweep cut off between the
two leaves an expired job whose files are already gone (the next sweep
deletes it), never a file that nothing refers to. Previews are the other way
round (their events first), for the same reason: the next sweep finds the
folder again.

A job keeps at most ``retention.previews_per_job`` previews while it runs
(``AgentService.preview`` deletes the oldest as new ones arrive).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from corral.server.services.forget import Forgotten, delete_tree, forget
from corral.server.services.inputs import InputService
from corral.server.services.previews import PREVIEWS, preview_folder
from corral.server.services.unit import Runtime
from corral.server.store import audit as audit_repo
from corral.server.store import retention as repo

log = logging.getLogger("corral.server.retention")


class RetentionLoop:
    def __init__(self, rt: Runtime, leading: Callable[[], bool] | None = None) -> None:
        self.rt = rt
        self.leading = leading or (lambda: True)

    async def run(self) -> None:
        while True:
            await self.rt.clock.sleep(self.rt.settings.retention.sweep_s)
            try:
                await self.sweep()
            except Exception:  # keep sweeping even if one pass hits a bad row or file
                log.exception("retention sweep failed")

    async def sweep(self) -> Forgotten:
        """One pass; nothing when this replica does not lead or retention is off."""
        report = Forgotten()
        if not self.leading():
            return report
        settings = self.rt.settings.retention
        now = self.rt.clock.now()
        if settings.previews_s > 0:
            await self._previews(now - settings.previews_s, settings.batch, report)
        if settings.finished_jobs_s > 0:
            await self._jobs(now - settings.finished_jobs_s, settings.batch, report)
        if settings.audit_s > 0:
            await self._audit(now - settings.audit_s, settings.batch * 10, report)
        report.inputs += await InputService(self.rt).sweep()
        if report:
            deleted = self.rt.metrics.retention_deleted
            for what, count in vars(report).items():
                if count:
                    deleted.labels(what).inc(count)
            log.info(
                "retention: deleted %d finished jobs, %d events, %d result files, %d previews, "
                "%d audit records, %d input files",
                report.jobs,
                report.events,
                report.results,
                report.previews,
                report.audit,
                report.inputs,
            )
        return report

    async def _previews(self, cutoff: float, batch: int, report: Forgotten) -> None:
        blobs = self.rt.blobs
        folders = await blobs.folders(PREVIEWS)
        for start in range(0, len(folders), batch):
            chunk = folders[start : start + batch]
            async with self.rt.db.read() as conn:
                known = {j.id: j for j in await repo.ages(conn, chunk)}
            done = [f for f in chunk if f not in known or known[f].ended_before(cutoff)]
            if not done:
                continue
            async with self.rt.tx() as tx:  # events first: a folder left behind is found again
                report.events += await repo.delete_detail(tx.conn, [f for f in done if f in known])
            for job_id in done:
                report.previews += await delete_tree(self.rt, preview_folder(job_id))

    async def _jobs(self, cutoff: float, batch: int, report: Forgotten) -> None:
        after = 0
        while True:
            async with self.rt.db.read() as conn:
                window = await repo.window(conn, after, batch)
            if not window:
                break
            after = window[-1].seq
            report.add(await forget(self.rt, [j for j in window if j.ended_before(cutoff)]))
            if window[-1].submitted_at >= cutoff:
                break  # every later job was submitted after the cutoff: none ended before it
            await asyncio.sleep(0)  # let requests through between batches
        async with self.rt.tx() as tx:
            report.events += await repo.delete_unattached_events(tx.conn, cutoff, batch * 10)

    async def _audit(self, cutoff: float, batch: int, report: Forgotten) -> None:
        """Delete the audit records made before ``cutoff``, ``batch`` per transaction."""
        while True:
            async with self.rt.tx() as tx:
                deleted = await audit_repo.delete_before(tx.conn, cutoff, batch)
            report.audit += deleted
            if deleted < batch:
                return
            await asyncio.sleep(0)  # let requests through between batches
