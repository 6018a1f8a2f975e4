"""Open event streams, counted: so many per token, so many in all (docs/security/limits.md).

Every open stream (an SSE response, a ComfyUI websocket) holds a connection,
a little memory and, whenever it reads the event table, a database
connection. Unbounded, 500 streams replaying history from one token took
every connection of the pool: requests answered 500 and ``/healthz`` took
15 s. ``StreamGate`` refuses a stream past either cap with ``LimitReached``
(HTTP 429, ``Retry-After``); ``EventFeed`` separately bounds how many
streams read the table at once.
"""

from __future__ import annotations

from collections import Counter

from corral.core.errors import LimitReached
from corral.server.security_settings import LimitsSettings
from corral.server.services.auth import Principal

RETRY_S = 5.0
"""Retry-After for a refused stream: streams end as their clients leave, and a client
that reconnects at once (a browser's EventSource waits about 3 s) finds the same cap."""


class StreamSlot:
    """One admitted stream's place; ``release`` gives it back (once, however often called)."""

    __slots__ = ("_gate", "_token")

    def __init__(self, gate: StreamGate, token: str) -> None:
        self._gate: StreamGate | None = gate
        self._token = token

    def release(self) -> None:
        if self._gate is not None:
            self._gate.leave(self._token)
            self._gate = None


class StreamGate:
    """Admit streams while the caller's token and the server are below their caps.

    The admin token is held to the server-wide cap only (``LimitsSettings``).
    """

    def __init__(self, limits: LimitsSettings) -> None:
        self.limits = limits
        self._open: Counter[str] = Counter()  # token id -> its open streams
        self.total = 0

    def admit(self, who: Principal) -> StreamSlot:
        """A place for one more stream of ``who``; ``LimitReached`` past a cap."""
        cap = self.limits.streams_total
        if self.total >= cap:
            raise LimitReached(
                f"this server already serves its limit of {cap} open event streams "
                f"(limits.streams_total); try again in {RETRY_S:g} s",
                RETRY_S,
            )
        mine = self.limits.streams_per_token
        if not who.is_admin and self._open[who.token_id] >= mine:
            raise LimitReached(
                f"this token already holds its limit of {mine} open event streams "
                f"(limits.streams_per_token); close one, or follow /v1/events for many "
                f"jobs at once",
                RETRY_S,
            )
        self._open[who.token_id] += 1
        self.total += 1
        return StreamSlot(self, who.token_id)

    def leave(self, token: str) -> None:
        self.total -= 1
        self._open[token] -= 1
        if self._open[token] <= 0:
            del self._open[token]
