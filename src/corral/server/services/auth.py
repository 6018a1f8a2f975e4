"""Bearer tokens: who is asking, and what they may do.

Three kinds of token (docs/server.md, "Auth"):

* **admin**: everything. One is generated and printed at first start; only
  its SHA-256 is stored, so it cannot be shown again.
* **team**: created by the admin for one team; sees and submits only that
  team's jobs, reads nodes, teams and the queue (its own jobs in it).
* **agent**: a join token for ``corral agent``; useless on the client API.

Tokens are 256-bit random secrets, so a plain SHA-256 (not a slow password
hash) is the right way to store them.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, replace
from enum import StrEnum

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.core.errors import Forbidden, InvalidSpec, NotFound, Unauthenticated
from corral.server.services import audit
from corral.server.services.unit import Runtime
from corral.server.store import nodes as node_repo
from corral.server.store import tokens as token_repo


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

    async def bootstrap_admin(self) -> str | None:
        """Make sure an admin token exists. Returns a newly generated secret, to print once.

        With ``settings.admin_token`` set, that token is registered (if new) and
        nothing is printed: the operator already knows it.
        """
        fixed = self.rt.settings.admin_token
        async with self.rt.tx() as tx:
            if fixed is not None:
                if await token_repo.by_hash(tx.conn, digest(fixed.get_secret_value())) is None:
                    token_id = await self._insert(
                        tx.conn, TokenKind.ADMIN, "admin", None, fixed.get_secret_value(), tx.now
                    )
                    detail = {"kind": "admin", "configured": True}
                    await audit.record(tx, None, "token.create", token_id, detail)
                return None
            if await token_repo.has_admin(tx.conn):
                return None
            secret = new_secret(TokenKind.ADMIN)
            token_id = await self._insert(tx.conn, TokenKind.ADMIN, "admin", None, secret, tx.now)
            await audit.record(tx, None, "token.create", token_id, {"kind": "admin"})
            return secret

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
        if row is None or row.revoked_at is not None:
            self._cache.pop(key, None)
            raise Unauthenticated("unknown or revoked token")
        principal = Principal(row.id, TokenKind(row.kind), row.name, row.team)
        self._cache[key] = (principal, now)
        return principal

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
        """Revoke a token (``by``: who asked; None: the server itself)."""
        async with self.rt.tx() as tx:
            if not await token_repo.revoke(tx.conn, token_id, tx.now):
                raise NotFound(f"token {token_id} not found (or already revoked)")
            await audit.record(tx, by, "token.revoke", token_id)
        self._cache.clear()

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
