"""Bearer tokens: who is asking, and what they may do.

Three kinds of token (docs/server.md, "Auth"):

* **admin**: everything. One is generated and printed at first start; only
  its SHA-256 is stored, so it cannot be shown again.
* **team**: created by the admin for one team; sees and submits only that
  team's jobs, reads nodes, teams and the queue (its own jobs in it).
* **agent**: a join token for ``corral agent``; useless on the client API.

Tokens are 256-bit random secrets, so a plain SHA-256 (not a slow password
hash) is the right way to store them.

Revoking a token ends every stream it holds open, on every replica
(``services.sessions``, docs/security/revocation.md). Rotating the admin
token makes a new one and revokes every other; with ``admin_token``
configured, that setting is the one admin token and a change of it rotates at
start.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import partial

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.errors import Conflict, Forbidden, InvalidSpec, NotFound, Unauthenticated
from corral.server.services import audit
from corral.server.services.departure import lose_node
from corral.server.services.sessions import REVOKED, AgentAdmission, LiveSessions
from corral.server.services.unit import Runtime, Tx
from corral.server.store import nodes as node_repo
from corral.server.store import tokens as token_repo
from corral.server.store.notify import Note

log = logging.getLogger("corral.server.auth")


class TokenKind(StrEnum):
    ADMIN = "admin"
    TEAM = "team"
    AGENT = "agent"


@dataclass(frozen=True, slots=True)
class Principal:
    """The holder of a verified token, and where its request came from (for the audit log)."""

    token_id: str
    kind: TokenKind
    name: str
    team: str | None = None
    address: str | None = None  # the client's address (``api.deps.origin``)
    forwarded_for: str | None = None  # the request's X-Forwarded-For as sent: unverified

    def at(self, address: str | None, forwarded_for: str | None) -> Principal:
        """This principal making a request from ``address``."""
        return replace(self, address=address, forwarded_for=forwarded_for)

    @property
    def is_admin(self) -> bool:
        return self.kind is TokenKind.ADMIN

    def require_client(self) -> None:
        if self.kind is TokenKind.AGENT:
            raise Forbidden(
                "this is an agent join token: it only lets `corral agent` join. "
                "Use an admin or team token for the client API."
            )

    def require_admin(self, action: str) -> None:
        self.require_client()
        if not self.is_admin:
            raise Forbidden(f"a team token cannot {action}: this needs the admin token")

    def sees(self, team: str) -> bool:
        """May this principal see jobs (and events) of ``team``?"""
        return self.is_admin or self.team == team


@dataclass(frozen=True, slots=True)
class TokenInfo:
    id: str
    kind: TokenKind
    name: str
    team: str | None
    created_at: float
    revoked: bool


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret(kind: TokenKind) -> str:
    return f"corral_{kind.value}_{secrets.token_urlsafe(32)}"


class AuthService:
    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._cache: dict[str, tuple[Principal, float]] = {}
        self.sessions = LiveSessions()  # the streams open here, by token
        self.publish: Callable[[Note], None] | None = None  # to the other replicas, if any

    async def bootstrap_admin(self) -> str | None:
        """Make sure an admin token exists. Returns a newly generated secret, to print once.

        With ``settings.admin_token`` set, that token is the admin token:
        registered if new, every other admin token revoked (so changing the
        setting rotates it), nothing printed. A configured token revoked
        before (replaced since) is refused: a revoked token never comes back.
        """
        fixed = self.rt.settings.admin_token
        if fixed is not None:
            async with self.rt.tx() as tx:
                revoked = await self._configured(tx, fixed.get_secret_value())
            self._ended(revoked)
            return None
        async with self.rt.tx() as tx:
            if await token_repo.has_admin(tx.conn):
                return None
            secret = new_secret(TokenKind.ADMIN)
            token_id = await self._insert(tx.conn, TokenKind.ADMIN, "admin", None, secret, tx.now)
            await audit.record(tx, None, "token.create", token_id, {"kind": "admin"})
            return secret

    async def _configured(self, tx: Tx, secret: str) -> list[str]:
        """Register the configured admin token; revoke every other admin token (their ids)."""
        row = await token_repo.by_hash(tx.conn, digest(secret))
        if row is not None and (row.revoked_at is not None or row.kind != TokenKind.ADMIN):
            what = "was revoked (replaced since)" if row.revoked_at else f"is a {row.kind} token"
            raise InvalidSpec(
                "admin_token",
                f"the configured admin token (admin_token, CORRAL_ADMIN_TOKEN) {what}: "
                "set the current admin token, or a new one to rotate it",
            )
        if row is not None:
            keep = str(row.id)
        else:
            keep = await self._insert(tx.conn, TokenKind.ADMIN, "admin", None, secret, tx.now)
            detail = {"kind": "admin", "configured": True}
            await audit.record(tx, None, "token.create", keep, detail)
        revoked = await token_repo.revoke_admins(tx.conn, keep, tx.now)
        for token_id in revoked:
            await audit.record(tx, None, "token.revoke", token_id, {"configured": keep})
        return revoked

    async def authenticate(self, secret: str | None) -> Principal:
        """The principal behind ``secret``; raises ``Unauthenticated`` with a reason."""
        if not secret:
            raise Unauthenticated(
                "missing bearer token: send the header 'Authorization: Bearer <token>'"
            )
        key = digest(secret)
        now = self.rt.clock.now()
        cached = self._cache.get(key)
        if cached and now - cached[1] < self.rt.settings.api.token_cache_s:
            return cached[0]
        async with self.rt.db.read() as conn:
            row = await token_repo.by_hash(conn, key)
        if row is None:
            self._cache.pop(key, None)
            raise Unauthenticated("unknown token")
        if row.revoked_at is not None or self.sessions.is_revoked(row.id):
            self._cache.pop(key, None)  # (revoked while this read was under way, too)
            raise Unauthenticated(REVOKED)
        principal = Principal(row.id, TokenKind(row.kind), row.name, row.team)
        self._cache[key] = (principal, now)
        return principal

    async def admit_agent(self, secret: str) -> AgentAdmission:
        """An agent join token (or the admin's), admitted: its streams end if it is revoked,
        and their nodes leave (``departure.lose_node``)."""
        who = await self.authenticate(secret)
        if who.kind is TokenKind.TEAM:
            raise Forbidden(
                "a team token cannot join an agent: ask the admin for an agent join token"
            )
        return AgentAdmission(self.sessions, who.token_id, partial(lose_node, self.rt))

    async def create(
        self, kind: TokenKind, name: str, team: str | None, by: Principal | None = None
    ) -> tuple[TokenInfo, str]:
        """A new token, made by ``by`` (None: the server itself); the secret is returned
        once and never stored."""
        if kind is TokenKind.TEAM and not team:
            raise InvalidSpec("team", "a team token needs a team")
        if kind is not TokenKind.TEAM and team:
            raise InvalidSpec("team", f"{kind.value} tokens do not belong to a team")
        secret = new_secret(kind)
        async with self.rt.tx() as tx:
            token_id = await self._insert(tx.conn, kind, name, team, secret, tx.now)
            if team:
                await node_repo.ensure_teams(tx.conn, {team}, tx.now)
            detail = {"kind": kind.value, "name": name, "team": team}
            await audit.record(tx, by, "token.create", token_id, detail)
        return TokenInfo(token_id, kind, name, team, tx.now, False), secret

    async def listing(self) -> list[TokenInfo]:
        async with self.rt.db.read() as conn:
            rows = await token_repo.listing(conn)
        return [
            TokenInfo(
                r.id, TokenKind(r.kind), r.name, r.team, r.created_at, r.revoked_at is not None
            )
            for r in rows
        ]

    async def revoke(self, token_id: str, by: Principal | None = None) -> None:
        """Revoke a token (``by``: who asked; None: the server itself): it fails from now on,
        and every stream it holds open ends, here at once and on the other replicas as soon
        as they hear of it."""
        async with self.rt.tx() as tx:
            if not await token_repo.revoke(tx.conn, token_id, tx.now):
                raise NotFound(f"token {token_id} not found (or already revoked)")
            await audit.record(tx, by, "token.revoke", token_id)
        self._ended([token_id])

    async def rotate_admin(self, who: Principal) -> tuple[TokenInfo, str]:
        """A new admin token; every other admin token is revoked (their streams end)."""
        who.require_admin("rotate the admin token")
        if self.rt.settings.admin_token is not None:
            raise Conflict(
                "the admin token is configured (admin_token, CORRAL_ADMIN_TOKEN): set a new one "
                "there and restart the server; the old one is revoked at start"
            )
        secret = new_secret(TokenKind.ADMIN)
        async with self.rt.tx() as tx:
            token_id = await self._insert(tx.conn, TokenKind.ADMIN, "admin", None, secret, tx.now)
            revoked = await token_repo.revoke_admins(tx.conn, token_id, tx.now)
            await audit.record(tx, who, "token.rotate", token_id, {"revoked": revoked})
        self._ended(revoked)
        log.warning("admin token rotated: %s made, revoked: %s", token_id, revoked)
        return TokenInfo(token_id, TokenKind.ADMIN, "admin", None, tx.now, False), secret

    def revoked(self, token_id: str) -> None:
        """``token_id`` was revoked (here, or as another replica or the store says): forget
        it and end its streams here."""
        for key, (principal, _) in list(self._cache.items()):
            if principal.token_id == token_id:
                del self._cache[key]
        self.sessions.end(token_id, f"token {token_id} was revoked")

    def _ended(self, token_ids: Sequence[str]) -> None:
        """Tokens revoked by this replica: end their streams here and tell the others."""
        for token_id in token_ids:
            self.revoked(token_id)
            if self.publish is not None:
                self.publish(Note("revoke", ref=token_id))

    async def on_notes(self, notes: Sequence[Note]) -> None:
        """Another replica revoked tokens (``revoke`` notes; others are not for us)."""
        for note in notes:
            if note.kind == "revoke":
                self.revoked(note.ref)

    async def sweep(self) -> list[str]:
        """Re-check the tokens of this replica's open streams and cache; end those revoked.

        The net under the replicas' notes: a note lost (a listener reconnecting)
        delays the end of a revoked token's streams by at most one period."""
        now, ttl = self.rt.clock.now(), self.rt.settings.api.token_cache_s
        self._cache = {k: (p, at) for k, (p, at) in self._cache.items() if now - at < ttl}
        ids = self.sessions.tokens | {p.token_id for p, _ in self._cache.values()}
        if not ids:
            return []
        async with self.rt.db.read() as conn:
            gone = await token_repo.revoked_among(conn, ids)
        for token_id in gone:
            self.revoked(token_id)
        return gone

    async def watch(self) -> None:
        """``sweep`` every ``api.revocation_check_s``, until cancelled."""
        while True:
            await self.rt.clock.sleep(self.rt.settings.api.revocation_check_s)
            try:
                await self.sweep()
            except Exception:  # keep checking: the next period may reach the store
                log.exception("re-checking open streams' tokens failed")

    async def _insert(
        self,
        conn: AsyncConnection,
        kind: TokenKind,
        name: str,
        team: str | None,
        secret: str,
        at: float,
    ) -> str:
        token_id = "tok_" + secrets.token_hex(8)
        await token_repo.insert(
            conn,
            id=token_id,
            kind=kind.value,
            team=team,
            name=name,
            hash=digest(secret),
            created_at=at,
        )
        return token_id
