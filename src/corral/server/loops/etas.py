"""The scheduling leader's ETAs: when each queued job should start, each running one end.

After a cycle, at most every ``EVERY_S`` (sooner when a queued job has none
yet, but never twice within ``MIN_GAP_S``), the leader reads from the store
what the pure estimate needs and the kept scheduler does not hold: the
latest finished jobs (run times, learned once each into a ``Durations``: the
ids of the latest are read, and whole only the newest of those not learned
yet, ``LEARN_ROWS`` at most, so a busy server learns from a sample of what
finished rather than from every job) and the running jobs' specs. It expects
no further arrivals (``recent`` left empty: expecting the last hour's again
made the estimate worse on the simulator's trace, docs/scheduler.md "ETA").
Then ``scheduler.eta.estimate`` replays the scheduler forward (on a thread
when the queue is large). ``GET /v1/jobs/{id}`` and ``/v1/queue`` show the
result; other replicas show what the leader last published (``loops/waits.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Collection, Sequence
from typing import Final

from corral.core.states import JobState
from corral.scheduler.api import Config, Snapshot
from corral.scheduler.durations import Durations
from corral.scheduler.eta import Eta, estimate, gpu_model
from corral.server.services.unit import Runtime
from corral.server.store import jobs as job_repo
from corral.server.store.records import JobRecord

EVERY_S: Final = 10.0  # ETAs drift slowly: re-estimated this often while work is queued
MIN_GAP_S: Final = 1.0  # a burst of submissions is estimated once a second, not per cycle
HISTORY_ROWS: Final = 500  # latest finished jobs looked at per estimate (each learned once)
LEARN_ROWS: Final = 100  # of which read whole at most: a sample is all the medians need
LEARNED: Final = 20_000  # ids of jobs already learned, kept to skip them on the next read
INLINE_WORK: Final = 4096  # queued x nodes up to which the estimate runs on the loop itself

log = logging.getLogger("corral.server.etas")


class EtaKeeper:
    """Keeps ``etas`` (job id -> ``Eta``) fresh; see the module docstring."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.durations = Durations()
        self.etas: dict[str, Eta] = {}
        self._learned: deque[str] = deque(maxlen=LEARNED)
        self._learned_ids: set[str] = set()
        self._last = float("-inf")

    @property
    def made_at(self) -> float:
        """When the latest ETAs were made (-inf: none yet)."""
        return self._last

    def of(self, job_id: str) -> tuple[Eta, float] | None:
        """``job_id``'s latest ETA and when it was made (None: none)."""
        eta = self.etas.get(job_id)
        return None if eta is None else (eta, self._last)

    def due(self, queued: Collection[str], now: float) -> bool:
        """Is an estimate due, with these jobs queued?"""
        if now - self._last < MIN_GAP_S:
            return False
        etas = self.etas
        return now - self._last >= EVERY_S or any(j not in etas for j in queued)

    async def refresh(self, snapshot: Snapshot, config: Config, now: float, seed: int) -> None:
        """Learn what finished, then estimate every queued and running job."""
        self._last = now
        if not snapshot.queued and not snapshot.allocations:
            self.etas = {}
            return
        running_ids = {j for a in snapshot.allocations if a.active for j in a.job_ids}
        async with self.rt.db.read() as conn:
            latest = await job_repo.newest_ids(conn, JobState.SUCCEEDED, HISTORY_ROWS)
            unseen = [j for j in latest if j not in self._learned_ids][:LEARN_ROWS]
            done = await job_repo.get_many(conn, unseen) if unseen else {}
            running = await job_repo.get_many(conn, running_ids) if running_ids else {}
        self._learn([done[j] for j in unseen if j in done], self._models(snapshot))

        def work() -> dict[str, Eta]:
            return estimate(
                snapshot,
                config,
                self.durations,
                now,
                running={k: r.job for k, r in running.items()},
                seed=seed,
            )

        try:
            if len(snapshot.queued) * max(1, len(snapshot.nodes)) <= INLINE_WORK:
                self.etas = work()
            else:  # keep the API serving meanwhile
                self.etas = await asyncio.to_thread(work)
        except Exception:  # a forecast: a bad one must not fail the cycle that placed work
            log.exception("estimating ETAs failed; the last ones stand")

    @staticmethod
    def _models(snapshot: Snapshot) -> dict[str, str]:
        return {n.name: gpu_model(n) for n in snapshot.nodes}

    def _learn(self, done: Sequence[JobRecord], models: dict[str, str]) -> None:
        """Each finished job's run time, once (``done`` newest first: learned oldest first,
        so the window keeps the newest). Only first attempts count: a resumed job ran part
        of its work."""
        for rec in reversed(done):
            job_id = rec.job.id
            if len(self._learned) == self._learned.maxlen:
                self._learned_ids.discard(self._learned[0])
            self._learned.append(job_id)
            self._learned_ids.add(job_id)
            if rec.started_at is None or rec.finished_at is None or rec.job.attempt > 1:
                continue
            model = models.get(rec.node or "", "")
            self.durations.record(rec.job, model, rec.finished_at - rec.started_at)
