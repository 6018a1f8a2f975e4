"""The policy in force: applied, versioned, read back by every replica (docs/server.md).

Each document applied is stored whole as a new version with who applied it
and when; the highest version is in force. Nothing is pushed to replicas:
the scheduling leader reads the latest version number at the start of every
cycle (one indexed read beside the cycle's own) and rebuilds its scheduler
when it changed, and every replica reads it again before admitting work when
its copy is older than ``REFRESH_S``. So a policy takes effect at the next
cycle, on every replica, without a restart.

``entitle`` is the one answer to "may this caller put work of this team and
user into this class": submissions use it, and so does anything else that
moves a job between classes.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence

import sqlalchemy as sa
import yaml
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.errors import Conflict, Forbidden, InvalidSpec, LimitReached, NotFound
from corral.core.states import JobState
from corral.server.policy_doc import DEFAULT_DOCUMENT, Policy, default_policy, parse
from corral.server.services import audit
from corral.server.services.auth import Principal
from corral.server.services.unit import Runtime
from corral.server.store import policies as repo
from corral.server.store.policies import PolicyVersion
from corral.server.store.tables import jobs

log = logging.getLogger("corral.server.policy")

REFRESH_S = 1.0
"""How old a replica's copy of the policy may be when it admits work: a second after an
apply every replica enforces it, at one tiny read a second at most."""

BUILT_IN = PolicyVersion(0, DEFAULT_DOCUMENT, "corral", 0.0, "built in")
"""Version 0: the policy in force before any is applied (today's fixed classes)."""

HISTORY_MAX = 1000
"""Versions listed by one history request at most."""


def may_use(policy: Policy, who: Principal, team: str, user: str, priority: str) -> bool:
    """May ``who`` put work of ``team`` and ``user`` in class ``priority``? The admin token
    may use every class; a team token the classes open to its team or to the user named."""
    rule = policy.rule(priority)
    if rule is None:
        return False
    return who.is_admin or rule.allows(team, user)


class PolicyService:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._checked_at = float("-inf")

    @property
    def current(self) -> Policy:
        return self.rt.policy

    async def refresh(self, conn: AsyncConnection) -> bool:
        """Read the version in force; True when it changed (and is now ``rt.policy``)."""
        self._checked_at = self.rt.clock.now()
        version = await repo.latest_version(conn)
        if version == self.rt.policy_version:
            return False
        entry = await repo.get(conn, version) if version else None
        try:
            policy = default_policy() if entry is None else parse(entry.document)
        except InvalidSpec as e:  # applied by a server that read it otherwise: keep ours
            log.error(
                "policy version %d cannot be read here (%s): keeping the last one", version, e
            )
            self.rt.policy_version = version
            return False
        self.rt.policy, self.rt.policy_version = policy, version
        log.info("policy version %d in force", version)
        return True

    async def fresh(self) -> Policy:
        """The policy, read again first when this replica's copy is older than ``REFRESH_S``."""
        if self.rt.clock.now() - self._checked_at >= REFRESH_S:
            async with self.rt.db.read() as conn:
                await self.refresh(conn)
        return self.rt.policy

    async def entitle(
        self, who: Principal, team: str, user: str, priority: str, field: str = "priority"
    ) -> None:
        """Raise unless ``who`` may put work of ``team`` and ``user`` in class ``priority``:
        ``InvalidSpec`` (422) for a class the policy does not name, ``Forbidden`` (403)
        naming the class and the team for one it may not use."""
        policy = await self.fresh()
        if policy.rule(priority) is None:
            known = ", ".join(r.pclass.name for r in policy.classes)
            raise InvalidSpec(field, f"unknown class {priority!r} (known: {known})")
        if not may_use(policy, who, team, user, priority):
            raise Forbidden(
                f"team {team!r} may not use priority class {priority!r} (user {user!r}): "
                "the policy opens it to other teams or users; ask an administrator"
            )

    async def check_queued(self, who: Principal, counts: dict[tuple[str, str], int]) -> None:
        """Refuse (429) new jobs past a user's (in every team) or a team's ``max_queued_jobs``
        in the policy. ``counts``: new jobs per (team, user). The admin's submissions are not
        capped. Counted before the insert, as the caps in ``quotas.py`` are: concurrent
        submissions may pass a cap by what they add together."""
        policy = self.rt.policy
        if who.is_admin or not (policy.users or policy.teams):
            return
        by_user: dict[str, int] = defaultdict(int)
        by_team: dict[str, int] = defaultdict(int)
        for (team, user), new in counts.items():
            by_user[user] += new
            by_team[team] += new
        async with self.rt.db.read() as conn:
            for user, new in by_user.items():
                caps = policy.users.get(user)
                if caps is not None and caps.max_queued_jobs is not None:
                    held = await _queued(conn, jobs.c.user == user)
                    _refuse_past(f"user {user!r}", caps.max_queued_jobs, held, new)
            for team, new in by_team.items():
                caps = policy.teams.get(team)
                if caps is not None and caps.max_queued_jobs is not None:
                    held = await _queued(conn, jobs.c.team == team)
                    _refuse_past(f"team {team!r}", caps.max_queued_jobs, held, new)

    # ---- the admin's side ---------------------------------------------------------------

    async def show(self) -> tuple[PolicyVersion, Policy]:
        """The version in force, and its policy (version 0: the built-in one)."""
        async with self.rt.db.read() as conn:
            await self.refresh(conn)
            entry = await repo.get(conn, self.rt.policy_version)
        return entry or BUILT_IN, self.rt.policy

    async def apply(self, who: Principal, document: str, note: str = "") -> PolicyVersion:
        """Check ``document`` and make it the next version, in force from the next cycle."""
        who.require_admin("change the policy")
        policy = parse(document)
        async with self.rt.tx(reschedule=True) as tx:
            version = await repo.latest_version(tx.conn) + 1
            entry = PolicyVersion(version, document, who.name[:128], tx.now, note[:512])
            try:
                await repo.insert(tx.conn, entry)
            except sa.exc.IntegrityError:
                raise Conflict(
                    "another policy was applied meanwhile: look and apply again"
                ) from None
            await audit.record(tx, who, "policy.apply", f"policy/{version}", {"note": note})
        self.rt.policy, self.rt.policy_version = policy, version
        self._checked_at = self.rt.clock.now()
        return entry

    async def set_user_weight(
        self, who: Principal, user: str, weight: float, note: str
    ) -> PolicyVersion:
        """The policy in force with ``user``'s weight (``users.<user>.weight``) set, applied
        as the next version (admin). The new version's document is the old one's data
        written again: its comments stay in the version before it."""
        who.require_admin("change a user's weight")
        entry, _ = await self.show()
        doc = yaml.safe_load(entry.document) or {}
        users = doc.get("users") or {}
        if not isinstance(doc, dict) or not isinstance(users, dict):
            raise InvalidSpec("user_weight", "the policy in force has no users mapping to set")
        users[user] = {**(users.get(user) or {}), "weight": weight}
        doc["users"] = users
        return await self.apply(who, yaml.safe_dump(doc, sort_keys=False), note)

    async def version(self, who: Principal, version: int) -> PolicyVersion:
        """Version ``version`` as applied (0: the built-in policy)."""
        who.require_admin("read the policy")
        if version == 0:
            return BUILT_IN
        async with self.rt.db.read() as conn:
            entry = await repo.get(conn, version)
        if entry is None:
            raise NotFound(f"policy version {version} not found (`corral policy history`)")
        return entry

    async def rollback(self, who: Principal, version: int) -> PolicyVersion:
        """Apply version ``version``'s document again, as a new version."""
        entry = await self.version(who, version)
        return await self.apply(who, entry.document, note=f"rollback to version {version}")

    async def history(self, who: Principal, limit: int) -> Sequence[PolicyVersion]:
        who.require_admin("read the policy history")
        async with self.rt.db.read() as conn:
            return await repo.history(conn, max(1, min(limit, HISTORY_MAX)))


async def _queued(conn: AsyncConnection, whose: sa.ColumnElement[bool]) -> int:
    query = sa.select(sa.func.count()).where(whose, jobs.c.state == JobState.QUEUED.value)
    return int((await conn.execute(query)).scalar() or 0)


def _refuse_past(whose: str, cap: int, held: int, new: int) -> None:
    if held + new > cap:
        raise LimitReached(
            f"{whose} may have {cap} jobs queued (the policy's max_queued_jobs) and has "
            f"{held}: {new} more would pass the cap; submit them as queued jobs start",
            5.0,
        )
