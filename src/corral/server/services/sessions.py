"""Open streams and connections by the token that opened them, so a revocation ends them.

A token is checked when a request arrives; a stream it opens (an SSE
response, a ComfyUI websocket, an agent's Connect stream) may then live for
hours. Each one registers here under its token's id while it is open, with
how to end it. ``AuthService.revoke`` ends the local ones at once and tells
the other replicas, which end theirs; every replica also re-checks the tokens
of its open streams every ``api.revocation_check_s``, the net under a lost
note. A token known revoked here opens no new stream, so a request that
passed authentication just before the revocation cannot start one after it
(docs/security/revocation.md).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TypeVar, cast

from corral.core.errors import Unauthenticated

log = logging.getLogger("corral.server.auth")

T = TypeVar("T")

End = Callable[[str], object]
"""Ends one open stream; the argument says why, for its client."""

REVOKED = "this token was revoked"

_DONE = object()


class LiveSessions:
    """This replica's open streams, by token id, and the tokens it knows are revoked."""

    def __init__(self) -> None:
        self._open: dict[str, dict[int, End]] = {}
        self._revoked: set[str] = set()
        self._keys = itertools.count()
        self._tasks: set[asyncio.Task[None]] = set()  # what revocations set going (nodes leaving)

    def check(self, token_id: str) -> None:
        """Raise ``Unauthenticated`` when ``token_id`` is known to be revoked."""
        if token_id in self._revoked:
            raise Unauthenticated(REVOKED)

    def is_revoked(self, token_id: str) -> bool:
        return token_id in self._revoked

    @property
    def tokens(self) -> set[str]:
        """The ids of the tokens that hold streams open here."""
        return set(self._open)

    def held(self, token_id: str) -> int:
        """How many streams ``token_id`` holds open here."""
        return len(self._open.get(token_id, ()))

    def hold(self, token_id: str, end: End) -> Callable[[], None]:
        """Register an open stream of ``token_id``, ended by ``end`` if the token is revoked.

        Returns the release, to call once the stream is over. Raises
        ``Unauthenticated`` when the token is already known to be revoked.
        """
        self.check(token_id)
        key = next(self._keys)
        self._open.setdefault(token_id, {})[key] = end

        def release() -> None:
            ends = self._open.get(token_id)
            if ends is not None and ends.pop(key, None) is not None and not ends:
                del self._open[token_id]

        return release

    def end(self, token_id: str, why: str) -> int:
        """``token_id`` was revoked: end its streams here and open no new ones. How many ended."""
        self._revoked.add(token_id)
        ends = self._open.pop(token_id, {})
        for end in ends.values():
            try:
                end(why)
            except Exception:  # one stream failing to end must not keep the others open
                log.exception("ending a stream of revoked token %s failed", token_id)
        if ends:
            log.info("token %s revoked: ended %d open stream(s)", token_id, len(ends))
        return len(ends)

    def guard(self, token_id: str, stream: AsyncIterator[T]) -> AsyncIterator[T]:
        """``stream``, ending as soon as ``token_id`` is revoked.

        Raises ``Unauthenticated`` now when the token is known to be revoked
        (the route answers 401 instead of starting a response); the stream
        registers when its response starts, so one never started holds nothing.
        """
        self.check(token_id)
        return self.until_revoked(token_id, stream)

    async def until_revoked(
        self, token_id: str, stream: AsyncIterator[T]
    ) -> AsyncGenerator[T, None]:
        """Each item of ``stream`` until it ends or the token is revoked, whichever is first
        (nothing at all when the token is already known to be revoked).

        The stream is read from a task of its own, so a revocation ends it while it
        waits (an SSE feed may wait seconds for the next event)."""
        revoked = asyncio.Event()
        try:
            release = self.hold(token_id, lambda _why: revoked.set())
        except Unauthenticated:  # revoked between the route's check and the response's start
            await _close(stream)
            return
        waiting = asyncio.ensure_future(revoked.wait())
        step: asyncio.Future[T | object] | None = None
        try:
            while True:
                step = asyncio.ensure_future(_next(stream))
                await asyncio.wait((step, waiting), return_when=asyncio.FIRST_COMPLETED)
                if not step.done():  # revoked while the stream waited
                    return
                item = step.result()
                if item is _DONE:
                    return
                yield cast(T, item)
        finally:
            waiting.cancel()
            release()
            if step is not None and not step.done():
                step.cancel()  # the stream cannot be closed while a read of it is under way
                await asyncio.gather(step, return_exceptions=True)
            await _close(stream)

    def spawn(self, work: Awaitable[object], what: str) -> None:
        """Run ``work`` (what a revocation set going) in the background; log if it fails."""

        async def run() -> None:
            try:
                await work
            except Exception:
                log.exception("%s failed", what)

        task = asyncio.ensure_future(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class AgentAdmission:
    """An agent's accepted join token (``AgentInbound.authenticate``): its streams are held
    under the token, and the node of a stream that a revocation ends leaves (``leave``:
    lost, its work requeued) instead of keeping its work for an agent shut out."""

    def __init__(
        self,
        sessions: LiveSessions,
        token_id: str,
        leave: Callable[[str, str], Awaitable[object]],
    ) -> None:
        self.sessions = sessions
        self.token_id = token_id
        self.leave = leave

    def hold(self, node: str, end: Callable[[str], bool]) -> Callable[[], None]:
        """Register ``node``'s stream; on revocation ``end(why)`` ends it (True: it was live)
        and the node leaves. Returns the release; ``Unauthenticated`` if already revoked."""

        def revoked(why: str) -> None:
            if end(why):
                self.sessions.spawn(self.leave(node, why), f"node {node} leaving")

        return self.sessions.hold(self.token_id, revoked)


async def _next(stream: AsyncIterator[T]) -> T | object:
    return await anext(stream, _DONE)


async def _close(stream: AsyncIterator[T]) -> None:
    closing = getattr(stream, "aclose", None)
    if closing is not None:
        await closing()
