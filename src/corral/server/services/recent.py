"""The events this process committed last, kept in memory for SSE readers.

Every SSE stream used to re-read the event table after each commit: with
many streams open, one query per stream per commit. On SQLite one process
writes every event, in ``seq`` order (one writer at a time, ``seq`` given at
insert), so the events it committed since it started are *all* the events
after the first of them. ``RecentEvents`` keeps the last ``MAX_KEPT`` of
them; a reader whose position is inside that window is served from memory,
one further behind (resuming an old stream) reads the table as before.

On PostgreSQL, other replicas commit events too, and a replica's memory
would miss theirs. But events are numbered in commit order there too (the
event-ordering lock), so a run of kept events whose numbers follow each other
without a gap, starting right after a reader's position, is exactly what the
table holds there: such a reader is served from memory (``contiguous``). A gap
(another replica's event, a number a rolled-back write drew) or nothing kept
after the position sends the reader to the table, which also brings it other
replicas' events (it reads the table at least every ``api.sse_poll_s``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from corral.core.events import Event
from corral.server.store.events import TeamEvent

MAX_KEPT = 10_000
"""Events kept: a few seconds of a busy server, enough for readers that keep up."""


class RecentEvents:
    def __init__(
        self, *, enabled: bool = True, max_kept: int = MAX_KEPT, contiguous: bool = False
    ) -> None:
        self.enabled = enabled
        self.contiguous = contiguous  # other writers: serve only gapless runs (PostgreSQL)
        self._kept: deque[tuple[Event, str | None]] = deque(maxlen=max_kept)
        self._floor: int | None = None  # every committed event after this seq is kept

    def add(self, batch: Sequence[TeamEvent], seqs: Sequence[int]) -> None:
        """Record a committed batch with the ``seq`` the store gave each event, in order."""
        if not self.enabled or not batch:
            return
        if len(seqs) != len(batch):  # the store did not say: stop trusting memory
            self.enabled = False
            return
        if self._floor is None:
            self._floor = seqs[0] - 1
        for te, seq in zip(batch, seqs, strict=True):
            if len(self._kept) == self._kept.maxlen:
                self._floor = self._kept[0][0].seq  # the oldest one falls out of the window
            self._kept.append((te.event.numbered(seq), te.team))

    def after(
        self, seq: int, *, job_id: str | None = None, team: str | None = None, limit: int = 500
    ) -> list[tuple[Event, str | None]] | None:
        """Events after ``seq`` as ``event_repo.after`` gives them, or None: read the table."""
        if not self.enabled or self._floor is None or seq < self._floor:
            return None
        out: list[tuple[Event, str | None]] = []
        expect = None  # contiguous: the number the next older kept event must have
        for event, owner in reversed(self._kept):  # readers are usually near the end
            if event.seq <= seq:
                break
            if self.contiguous:
                if expect is not None and event.seq != expect:
                    return None  # a gap: someone else's event, or a number never used
                expect = event.seq - 1
            if (job_id is None or event.job_id == job_id) and (team is None or owner == team):
                out.append((event, owner))
        if self.contiguous and expect != seq:  # nothing kept after it, or a gap right after
            return None
        out.reverse()
        return out[:limit]
