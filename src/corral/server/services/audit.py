"""The audit log: who did what to what, when and from where (docs/security/audit.md).

Every change a token makes to how the server is run (tokens made and revoked, team
quotas, the model registry, nodes paused, drained and resumed, jobs cancelled,
interrupted and deleted) is recorded by ``record`` inside the transaction of the
change itself: there is no change without its record, and no record of a change
that rolled back. Reads are not recorded. A request refused for lack of rights
(403) is recorded too, at most ``DENIALS_PER_MINUTE`` per token, so a leaked
token probing admin routes shows up without letting it flood the table.

The log is separate from job events: deleting a job deletes its events, never
its audit records. Records are never updated (the table refuses it) and only
the retention sweep deletes them, after ``retention.audit_s``; no route does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from corral.server.services.unit import Runtime, Tx
from corral.server.store import audit as audit_repo
from corral.server.store.audit import AuditFilter, AuditRecord

if TYPE_CHECKING:  # auth records its own changes here: a plain import would be a cycle
    from corral.server.services.auth import Principal

log = logging.getLogger("corral.server.audit")

SERVER = "server"
"""The actor of what the server does on its own (its first admin token, the autoscaler's)."""
DENIED = "auth.denied"
DENIALS_PER_MINUTE = 10
"""Refusals recorded per token and minute: enough to see a token probing, too few to flood."""
DENIAL_WINDOW_S = 60.0
TEXT_MAX = 255  # a target's or a detail text's length: ids, names, URLs, not documents
ITEMS_MAX = 20  # items of a detail list kept (a model has at most 16 sources)


async def record(
    tx: Tx,
    who: Principal | None,
    action: str,
    target: str,
    detail: Mapping[str, Any] | None = None,
) -> None:
    """Append a record of ``action`` on ``target`` by ``who`` (None: the server itself) to
    ``tx``: it commits with the change it describes, or not at all."""
    await audit_repo.append(
        tx.conn,
        at=tx.now,
        **actor_of(who),
        action=action,
        target=target[:TEXT_MAX],
        detail={k: _small(v) for k, v in (detail or {}).items()},
    )


def actor_of(who: Principal | None) -> dict[str, Any]:
    """The actor columns of a record: the token's id, kind, name and team, and where the
    request came from."""
    if who is None:
        return {"actor_id": None, "actor_kind": SERVER, "actor_name": SERVER}
    return {
        "actor_id": who.token_id,
        "actor_kind": who.kind.value,
        "actor_name": who.name,
        "actor_team": who.team,
        "address": who.address,
        "forwarded_for": who.forwarded_for,
    }


def _small(value: Any) -> Any:
    """``value`` cut to a record's size: long texts shortened, long lists truncated."""
    if isinstance(value, str):
        return value[:TEXT_MAX]
    if isinstance(value, list | tuple):
        return [_small(v) for v in value[:ITEMS_MAX]]
    if isinstance(value, Mapping):
        return {str(k)[:TEXT_MAX]: _small(v) for k, v in list(value.items())[:ITEMS_MAX]}
    return value


@dataclass(frozen=True, slots=True)
class AuditPage:
    records: list[AuditRecord]
    next_seq: int | None  # where the next (older) page starts; None: this was the last


class AuditService:
    """Reading the log (the admin), and recording refused requests."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        # Refusals counted per token id: (window start, count). One entry per token ever
        # refused, and tokens exist only as the admin makes them.
        self._denials: dict[str, tuple[float, int]] = {}

    async def page(
        self, who: Principal, where: AuditFilter, before_seq: int | None, limit: int
    ) -> AuditPage:
        """Records matching ``where``, newest first, ``limit`` at a time (admin only)."""
        who.require_admin("read the audit log")
        async with self.rt.db.read() as conn:
            found = await audit_repo.page(conn, where, before_seq, limit + 1)
        records = found[:limit]
        return AuditPage(records, records[-1].seq if len(found) > limit and records else None)

    async def denied(self, who: Principal, request: str, reason: str) -> None:
        """Record that ``who`` was refused ``request`` (``"POST /v1/tokens"``), unless this
        token's refusals this minute were recorded enough already. Never raises: the
        refusal is answered whether or not its record could be written."""
        if not self._counts(who.token_id):
            return
        try:
            async with self.rt.tx(durable=False) as tx:
                await record(tx, who, DENIED, request, {"reason": reason})
        except Exception:
            log.warning("could not record a refused request in the audit log", exc_info=True)

    def _counts(self, token_id: str) -> bool:
        """Count one refusal of ``token_id``; False past ``DENIALS_PER_MINUTE``."""
        now = self.rt.clock.now()
        start, count = self._denials.get(token_id, (now, 0))
        if now - start >= DENIAL_WINDOW_S:
            start, count = now, 0
        self._denials[token_id] = (start, count + 1)
        return count < DENIALS_PER_MINUTE
