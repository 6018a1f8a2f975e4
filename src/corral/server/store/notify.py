"""Replicas tell each other things through PostgreSQL LISTEN/NOTIFY (DESIGN.md section 6).

Several ``corral server`` replicas share one PostgreSQL database. An agent
holds its stream to one of them, but any replica may decide something for
it: the scheduling leader places work, any replica takes a cancel. A
replica that cannot reach a node itself publishes a ``Note`` ("assign
allocation A to node N"); every replica listens, and the one holding N's
stream reads the intent back from the store and sends it. The note carries
only ids, never the intent itself: the store stays the source of truth, and
a note that is lost (a listener reconnecting) is covered by the periodic
resync (``services.delivery``).

Notes are batched: those published within a couple of milliseconds share one
``pg_notify`` (payloads stay under PostgreSQL's 8000-byte limit). Each
replica ignores its own notes. The connection is a dedicated asyncpg one
(LISTEN needs a session), reopened when it breaks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import asyncpg  # type: ignore[import-untyped]

from corral.server.store.db import DbTarget

log = logging.getLogger("corral.server.notify")

MAX_PAYLOAD = 7000
"""Bytes per NOTIFY payload; PostgreSQL's limit is 8000."""

BATCH_S = 0.002
"""Notes published within this long share one NOTIFY."""

RECONNECT_S = 1.0
"""Wait before reopening a broken listening connection."""


@dataclass(frozen=True, slots=True)
class Note:
    """``kind``: assign | stop (``ref`` is the allocation) | intake (of ``node``) | kick |
    revoke (``ref`` is the token: its streams end)."""

    kind: str
    node: str = ""
    ref: str = ""


Receiver = Callable[[Sequence[Note]], Awaitable[None]]


class Notifier(Protocol):
    """Publish notes to the other replicas; hear theirs."""

    async def start(self, receive: Receiver) -> None: ...

    def publish(self, note: Note) -> None:
        """Queue ``note``; it goes out within ``BATCH_S``. Never blocks, never raises."""
        ...

    async def close(self) -> None: ...


def channel_for(schema: str | None) -> str:
    """One channel per schema, so servers on different schemas never hear each other."""
    return f"corral_{schema}"[:63] if schema else "corral"


def encode(replica: str, notes: Sequence[Note]) -> list[str]:
    """Payloads of at most ``MAX_PAYLOAD`` bytes carrying ``notes`` in order."""
    payloads: list[str] = []
    batch: list[list[str]] = []
    for note in notes:
        item = [note.kind, note.node, note.ref]
        if batch and len(json.dumps({"r": replica, "n": [*batch, item]})) > MAX_PAYLOAD:
            payloads.append(json.dumps({"r": replica, "n": batch}))
            batch = []
        batch.append(item)
    if batch:
        payloads.append(json.dumps({"r": replica, "n": batch}))
    return payloads


def decode(payload: str) -> tuple[str, list[Note]]:
    """(sending replica, notes); a malformed payload decodes to no notes."""
    try:
        data = json.loads(payload)
        return str(data["r"]), [Note(str(k), str(n), str(r)) for k, n, r in data["n"]]
    except (ValueError, KeyError, TypeError):
        log.warning("ignoring a malformed replica note: %.200s", payload)
        return "", []


class PgNotifier:
    """``Notifier`` over LISTEN/NOTIFY on a dedicated asyncpg connection."""

    def __init__(self, target: DbTarget, replica: str | None = None) -> None:
        self.dsn = target.url.set(drivername="postgresql").render_as_string(hide_password=False)
        self.channel = channel_for(target.schema)
        self.replica = replica or secrets.token_hex(6)
        self.sent = 0  # notes published (for tests and figures)
        self.heard = 0  # notes received from other replicas
        self._receive: Receiver | None = None
        self._conn: Any = None
        self._pending: list[Note] = []
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._handlers: set[asyncio.Task[None]] = set()

    async def start(self, receive: Receiver) -> None:
        self._receive = receive
        await self._connect()
        self._tasks = [
            asyncio.create_task(self._flush_forever(), name="corral-notify-flush"),
            asyncio.create_task(self._keep_connected(), name="corral-notify-keeper"),
        ]

    def publish(self, note: Note) -> None:
        self._pending.append(note)
        self._wake.set()

    async def close(self) -> None:
        for task in [*self._tasks, *self._handlers]:
            task.cancel()
        for task in [*self._tasks, *self._handlers]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        await self._drop()

    async def _connect(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        await conn.add_listener(self.channel, self._heard)
        self._conn = conn

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 2.0)

    def _heard(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        sender, notes = decode(payload)
        if sender == self.replica or not notes or self._receive is None:
            return
        self.heard += len(notes)
        task = asyncio.get_running_loop().create_task(self._deliver(notes))
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    async def _deliver(self, notes: Sequence[Note]) -> None:
        assert self._receive is not None
        try:
            await self._receive(notes)
        except Exception:  # one bad note must not stop the replica hearing the next
            log.exception("handling replica notes failed")

    async def _flush_forever(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(BATCH_S)  # let the rest of a burst join this NOTIFY
            self._wake.clear()
            notes, self._pending = self._pending, []
            try:
                await self._send(notes)
            except Exception as exc:  # the periodic resync covers what is lost here
                log.warning("could not notify the other replicas (%s); they resync", exc)

    async def _send(self, notes: Sequence[Note]) -> None:
        if self._conn is None:
            raise ConnectionError("no connection to PostgreSQL")
        for payload in encode(self.replica, notes):
            await self._conn.execute("SELECT pg_notify($1, $2)", self.channel, payload)
        self.sent += len(notes)

    async def _keep_connected(self) -> None:
        while True:
            await asyncio.sleep(RECONNECT_S)
            if self._conn is not None and not self._conn.is_closed():
                continue
            await self._drop()
            try:
                await self._connect()
                log.info("listening for replica notes again")
            except (OSError, asyncpg.PostgresError) as exc:
                log.warning("cannot listen for replica notes yet: %s", exc)
