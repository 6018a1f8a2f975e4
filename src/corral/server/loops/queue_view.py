"""Which jobs are queued, at which version, in submission order: the change feed's view.

Two ways to bring it up to date, each returning what changed (job id -> its
version now, or None when it left the queue):

* ``replace`` takes the version of every queued job (one narrow read of them
  all, ``store/versions.py``): what PostgreSQL does every cycle;
* ``follow`` reads, on SQLite, only the rows ``job_changes`` gained since the
  last read (triggers add one per job entering, changing in or leaving the
  queue, in commit order: migration 0006), with those jobs as they are now. A cycle over a
  queue of 40,000 jobs read all their versions in 35-70 ms; this reads the
  few that changed. The first ``follow`` reads every queued job once.

Both are safe against writes landing between their statements: ``follow``
reads the changes and the rows in one statement (a row newer than its change
would be read again with the next change anyway); ``replace`` is whole.
"""

from __future__ import annotations

import sqlite3
from itertools import filterfalse
from operator import itemgetter

from corral.server.store import jobs as job_repo

_FIRST = itemgetter(0)
Changed = dict[str, int | None]  # job id -> version now, None: no longer queued


class QueueView:
    def __init__(self) -> None:
        self.versions: dict[str, int] = {}  # queued job id -> version
        self.order: list[str] = []  # the queued job ids, by submission (``seq``)
        self.mark: int | None = None  # the last ``job_changes`` row followed; None: read all
        self.followed = 0  # changes read by the last ``follow`` (for tests)
        self._seqs: dict[str, int] = {}  # queued job id -> seq, while following

    def replace(self, queued: list[tuple[str, int]]) -> Changed:
        """Take ``queued``, every queued job's (id, version) in submission order."""
        held, wanted = set(self.versions.items()), set(queued)
        changed: Changed = dict.fromkeys(map(_FIRST, held - wanted))
        changed.update(wanted - held)
        self.versions = dict(queued)
        self.order = list(map(_FIRST, queued))
        self._seqs = {}
        self.mark = None
        return changed

    def follow(self, db: sqlite3.Connection) -> Changed:
        """Bring the view up to date from ``job_changes`` (SQLite)."""
        if self.mark is None:
            mark = job_repo.last_queue_change(db)  # before the rows: nothing falls between
            rows = job_repo.queued_seqs(db)
            changed = self.replace([(job_id, version) for _, job_id, version in rows])
            self._seqs = {job_id: seq for seq, job_id, _ in rows}
            self.followed = 0
        else:
            mark, ids, rows = job_repo.queue_changes(db, self.mark)
            self.followed = len(ids)
            changed = self._take(ids, rows)
        self.mark = mark
        return changed

    def in_order(self, ids: set[str]) -> list[str]:
        """``ids`` (queued jobs) in submission order: by their ``seq`` while following,
        else as ``order`` has them."""
        if self._seqs and len(ids) < len(self.order):
            return sorted(ids, key=self._seqs.__getitem__)
        return list(filter(ids.__contains__, self.order))

    def _take(self, ids: list[str], rows: list[tuple[int, str, int]]) -> Changed:
        """Apply what the changed ``ids`` are now (``rows`` of the ones still queued)."""
        versions, seqs = self.versions, self._seqs
        now: Changed = dict.fromkeys(ids)
        for seq, job_id, version in rows:
            now[job_id] = version
            seqs[job_id] = seq
        changed: Changed = {}
        left: set[str] = set()
        added: list[str] = []
        for job_id, after in now.items():
            before = versions.get(job_id)
            if after == before:
                continue
            changed[job_id] = after
            if after is None:
                del versions[job_id]
                del seqs[job_id]
                left.add(job_id)
            else:
                versions[job_id] = after
                if before is None:
                    added.append(job_id)
        if left:
            self.order = list(filterfalse(left.__contains__, self.order))
        if added:
            added.sort(key=seqs.__getitem__)
            order = self.order
            if order and seqs[added[0]] < seqs[order[-1]]:  # back in the queue: its old place
                order += added
                order.sort(key=seqs.__getitem__)
            else:
                order += added
        return changed
