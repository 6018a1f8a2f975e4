"""The synchronous client's administration calls: teams, the policy, usage, tokens and the
audit log. ``Client`` has them all; they are kept here so the client's module reads as the
calls a person submitting work makes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from corral.sdk import calls
from corral.sdk.calls import UNCHANGED, Unchanged, merge_team
from corral.sdk.models import (
    AuditRecord,
    NewToken,
    PolicyStatus,
    PolicyVersion,
    TeamQuota,
    UsageReport,
)

T = TypeVar("T")


class AdminCalls:
    def run(self, call: calls.Call[T]) -> T:  # the client's request, retried (client.py)
        raise NotImplementedError

    def teams(self) -> list[TeamQuota]:
        return self.run(calls.list_teams())

    def set_team(
        self,
        name: str,
        *,
        quota: float | None = None,
        borrow_limit: float | Unchanged | None = UNCHANGED,
        weight: float | None = None,
    ) -> TeamQuota:
        """Create or change a team (admin). Settings not given keep their current value;
        ``borrow_limit=None`` means "may borrow any idle GPU"."""
        current = next((t for t in self.teams() if t.name == name), None)
        team = merge_team(name, current, quota, borrow_limit, weight)
        return self.run(calls.put_team(team))

    def policy(self) -> PolicyStatus:
        """The policy in force (admin): its document, version, who applied it and when."""
        return self.run(calls.get_policy())

    def apply_policy(self, document: str, note: str = "") -> PolicyStatus:
        """Apply a policy document (YAML) as the next version (admin); ``BadRequest`` names
        the line and field of a mistake."""
        return self.run(calls.put_policy(document, note))

    def check_policy(self, document: str) -> dict[str, Any]:
        """How the server reads a policy document, without applying it (admin)."""
        return self.run(calls.check_policy(document))

    def policy_history(self, limit: int = 50) -> list[PolicyVersion]:
        """The versions applied, newest first (admin)."""
        return self.run(calls.policy_history(limit))

    def rollback_policy(self, version: int) -> PolicyStatus:
        """Apply an earlier version again, as a new version (admin)."""
        return self.run(calls.rollback_policy(version))

    def usage(
        self, by: Sequence[str] = ("team",), since: float | None = None, until: float | None = None
    ) -> UsageReport:
        """GPU-seconds, CPU-seconds, jobs and cost per group of ``by`` (team, user, class,
        pool, day, hour) between ``since`` and ``until`` (epoch seconds; default: the last
        30 days). A team token sees its own team alone."""
        return self.run(calls.usage(by, since, until))

    def create_token(self, kind: str, name: str, team: str | None = None) -> NewToken:
        """A new ``team`` or ``agent`` token (admin); the secret is in ``.token``, once."""
        return self.run(calls.create_token(kind, name, team))

    def audit(
        self,
        *,
        actor: str | None = None,
        team: str | None = None,
        action: str | Sequence[str] | None = None,
        target: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 50,
    ) -> list[AuditRecord]:
        """The audit log, newest first (admin): who made, changed or removed what, when and
        from where. ``actor`` is a token's id or name, ``action`` one or several actions
        (``job.*``: every job action), ``since``/``until`` epoch seconds. Follows pages
        until ``limit`` records are read."""
        actions = [action] if isinstance(action, str) else list(action or ())
        out: list[AuditRecord] = []
        cursor: str | None = None
        while len(out) < limit:
            call = calls.audit(
                actor=actor, team=team, actions=actions, target=target, since=since,
                until=until, limit=limit - len(out), cursor=cursor,
            )  # fmt: skip
            page = self.run(call)
            out += page.records
            cursor = page.next_cursor
            if not cursor or not page.records:
                break
        return out
