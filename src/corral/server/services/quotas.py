"""Per-team caps on queued jobs and on stored result bytes (docs/security/limits.md).

A team token's submission is admitted only while its team stays within
``quotas.max_queued_jobs`` (else 429: more fit as its jobs start) and holds
less than ``quotas.max_stored_bytes`` of results (else 403: only deleting
finished jobs, or retention, frees room). ``quotas.teams`` gives some teams
their own caps. The admin's submissions are not checked: the operator
decides what the admin submits.

Counting a team's jobs on every submission would cost a query on the hot
path, so each team's holdings are counted in the database at most every
``quotas.usage_refresh_s``, and this server adds the jobs it admits
meanwhile (reserved before their commit, so concurrent submissions cannot
all slip under the cap together). Other replicas' submissions show at the
next count: with several replicas a team may pass its queue cap by what they
accept in that time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from corral.core.errors import LimitReached, QuotaExceeded
from corral.server.services.auth import Principal, TokenKind
from corral.server.services.unit import Runtime
from corral.server.store import usage as usage_repo

GIB = 1024**3


@dataclass
class Usage:
    """One team's holdings as last counted, and the jobs this server let in since."""

    queued: int = 0
    stored: int = 0  # bytes of its jobs' results
    accepted: int = 0  # jobs committed here since the last count began
    pending: int = 0  # jobs admitted whose commit has not ended yet
    counted_at: float | None = None
    counting: asyncio.Task[None] | None = None

    def held(self) -> int:
        return self.queued + self.accepted + self.pending


@dataclass
class Admission:
    """Jobs let in under a team's caps; the submitter says whether they were created."""

    created: bool = False


class TeamQuotas:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.settings = rt.settings.quotas
        self._usage: dict[str, Usage] = {}

    @contextlib.asynccontextmanager
    async def admit(self, who: Principal, jobs: int) -> AsyncIterator[Admission]:
        """Let ``jobs`` new jobs of ``who``'s team in, or raise: ``LimitReached`` past the
        queue cap, ``QuotaExceeded`` at the stored-bytes cap. Set ``created`` on what this
        yields once they are committed; until then they count as pending."""
        admission = Admission()
        if who.kind is not TokenKind.TEAM or who.team is None:
            yield admission
            return
        team = who.team
        usage = await self._counted(team)
        self._check(team, usage, jobs)
        usage.pending += jobs
        try:
            yield admission
        finally:
            usage.pending -= jobs
            if admission.created:
                usage.accepted += jobs

    def caps(self, team: str) -> tuple[int, int]:
        """``team``'s caps: (queued jobs, stored bytes); 0 is no cap."""
        own = self.settings.teams.get(team)
        queued = self.settings.max_queued_jobs
        stored = self.settings.max_stored_bytes
        if own is not None and own.max_queued_jobs is not None:
            queued = own.max_queued_jobs
        if own is not None and own.max_stored_bytes is not None:
            stored = own.max_stored_bytes
        return queued, stored

    def _check(self, team: str, usage: Usage, jobs: int) -> None:
        queued_cap, stored_cap = self.caps(team)
        if queued_cap and usage.held() + jobs > queued_cap:
            raise LimitReached(
                f"team {team!r} may have {queued_cap} jobs queued (quotas.max_queued_jobs) "
                f"and has {usage.held()}: {jobs} more would pass the cap; submit them as "
                "queued jobs start",
                self.settings.usage_refresh_s,
            )
        if stored_cap and usage.stored >= stored_cap:
            raise QuotaExceeded(
                f"team {team!r} keeps {usage.stored / GIB:.2f} GiB of results, its cap is "
                f"{stored_cap / GIB:.2f} GiB (quotas.max_stored_bytes): delete finished jobs "
                "(DELETE /v1/jobs/{id}) or wait for retention to remove them"
            )

    async def _counted(self, team: str) -> Usage:
        """``team``'s usage, counted again first when the last count is too old."""
        usage = self._usage.setdefault(team, Usage())
        now = self.rt.clock.now()
        stale = usage.counted_at is None or now - usage.counted_at >= self.settings.usage_refresh_s
        if stale and usage.counting is None:  # one count at a time; the others wait for it
            usage.counting = asyncio.create_task(self._count(team, usage))
        if usage.counting is not None:
            await asyncio.shield(usage.counting)
        return usage

    async def _count(self, team: str, usage: Usage) -> None:
        try:
            usage.accepted = 0  # commits from here on show in the count, or are added again
            queued_cap, stored_cap = self.caps(team)
            queued = stored = 0
            if queued_cap:
                async with self.rt.db.read() as conn:
                    queued = await usage_repo.queued_jobs(conn, team)
            if stored_cap:
                stored = await self._stored(team)
            usage.queued, usage.stored = queued, stored
            usage.counted_at = self.rt.clock.now()
        finally:
            usage.counting = None

    async def _stored(self, team: str) -> int:
        """The bytes of ``team``'s results, a page of jobs per read."""
        total, after, read = 0, 0, usage_repo.PAGE
        while read == usage_repo.PAGE:
            async with self.rt.db.read() as conn:
                read, after, size = await usage_repo.result_bytes_page(conn, team, after)
            total += size
            await asyncio.sleep(0)  # let requests run between pages
        return total
