"""uvicorn's HTTP protocol with the limits a server facing the internet needs.

uvicorn closes a connection idle *between* requests (``timeout_keep_alive``),
but a client that opens a connection and then sends its headers, or its body,
a byte at a time (a "slowloris") holds the connection and its descriptor for
as long as it likes. ``guarded_protocol(limits)`` is uvicorn's httptools
protocol with:

* a **header deadline**: a request's line and headers must be complete within
  ``header_timeout_s`` of its first byte, or of the connection opening;
* **body deadlines**: a body that sends nothing for ``body_timeout_s``, or
  that arrives slower than ``min_body_bytes_per_s`` once ``body_timeout_s``
  has passed, is cut off (the rule of Apache's mod_reqtimeout). Time the
  server itself stops reading, to apply back-pressure, does not count;
* a **header size limit** (``max_header_bytes``; httptools, unlike h11, has none);
* a **connection limit**: above ``max_connections`` open connections (event
  streams and websockets included), or ``max_connections_per_address`` from one
  client address (a trusted proxy's excepted), a new one is answered 503 and
  closed at once.

A client past a limit gets a JSON error naming the setting (408, 431 or 503)
when no response is under way, and the connection is closed; the app sees a
disconnect. One timer per connection checks the deadlines: a request only
records its phase, its start and the bytes it brought.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("corral.server.http")

BUSY_LOG_EVERY_S = 60.0
"""A server at its connection limit says so at most this often (an attack refuses thousands)."""
RATE_CHECK_S = 1.0
"""How often a body past its first ``body_timeout_s`` is checked against the minimum rate."""
LINGER_S = 2.0
"""A connection this guard ends is half-closed, and what the client still sends is read and
dropped this long before the close: closing with unread bytes resets the connection, and a
reset can lose the answer before the client reads it (as nginx's lingering close)."""


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """The limits, from ``ApiSettings`` (``max_connections`` already fitted to descriptors)."""

    header_timeout_s: float
    body_timeout_s: float
    min_body_bytes_per_s: float
    max_header_bytes: int
    max_connections: int
    max_connections_per_address: int
    proxies: frozenset[str] = frozenset()  # addresses not held to the per-address limit


class Phase(Enum):
    """What the connection waits for from its client, and so which deadline applies."""

    HEADERS = "headers"
    BODY = "body"
    DRAINING = "draining"  # answered before its body arrived: the rest is read and dropped
    NOTHING = "nothing"  # the app is answering (an event stream may take hours)
    CLOSED = "closed"  # answered by this guard (or refused) and closed: the rest is ignored


def guarded_protocol(limits: HttpLimits) -> type[asyncio.Protocol]:
    """The protocol class to give uvicorn as ``http=``, bound to ``limits``."""
    shared: dict[str, object] = {"limits": limits, "busy_logged_at": None, "by_address": Counter()}
    return type("GuardedHttp", (GuardedHttp,), shared)


class GuardedHttp(HttpToolsProtocol):
    """``HttpToolsProtocol`` with deadlines for headers and body, and a connection limit."""

    limits: ClassVar[HttpLimits]
    busy_logged_at: ClassVar[float | None]
    by_address: ClassVar[Counter[str]]  # open connections per client address

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase = Phase.HEADERS
        self._began = 0.0  # when the phase began (a body's: its current measuring window)
        self._last = 0.0  # the phase's last byte
        self._bytes = 0  # bytes of headers, or of body in the window
        self._watch: asyncio.TimerHandle | None = None
        self._address: str | None = None  # counted in ``by_address`` while open

    # ---- the connection ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections:
            limit = self.limits.max_connections
            self._refuse(transport, f"the server has {limit} connections open, its limit "
                         "(api.max_connections)")  # fmt: skip
            return
        peer = transport.get_extra_info("peername")
        address = str(peer[0]) if peer else None
        proxies = self.limits.proxies
        if address is not None and address not in proxies and "*" not in proxies:
            limit = self.limits.max_connections_per_address
            if self.by_address[address] >= limit:
                self._refuse(transport, f"{address} has {limit} connections open, the limit "
                             "of one address (api.max_connections_per_address)")  # fmt: skip
                return
            self.by_address[address] += 1
            self._address = address
        super().connection_made(transport)
        self._enter(Phase.HEADERS)
        self._watch = self.loop.call_later(self.limits.header_timeout_s, self._check)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_watching()
        if self._address is not None:
            self.by_address[self._address] -= 1
            if self.by_address[self._address] <= 0:
                del self.by_address[self._address]
            self._address = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._phase is not Phase.CLOSED:
            super().data_received(data)

    def handle_websocket_upgrade(self) -> None:
        self._stop_watching()  # the websocket protocol takes over, with its own pings
        super().handle_websocket_upgrade()

    # ---- a request's phases (httptools' callbacks) -----------------------------------------

    def on_message_begin(self) -> None:
        if self._phase is not Phase.CLOSED:
            self._enter(Phase.HEADERS)
            super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        if self._phase is not Phase.CLOSED:
            self._bytes += len(url)
            super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._phase is not Phase.CLOSED:
            self._bytes += len(name) + len(value)
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._phase is Phase.CLOSED:
            return
        if self._bytes > self.limits.max_header_bytes:
            message = f"request headers over {self.limits.max_header_bytes} bytes"
            self._answer_and_close(431, "too_large", message, "api.max_header_bytes")
            return
        self._enter(Phase.BODY)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._phase is Phase.CLOSED:
            return
        self._last = self.loop.time()
        self._bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._phase is Phase.CLOSED:
            return
        # After a drained body the client has its answer: its next request is awaited.
        self._enter(Phase.HEADERS if self._phase is Phase.DRAINING else Phase.NOTHING)
        super().on_message_complete()

    def on_response_complete(self) -> None:
        if self._phase is Phase.BODY:
            # Answered before its body arrived (a 401, a 413): the rest is still read, so the
            # client is not reset before it reads the answer, for body_timeout_s at most.
            self._enter(Phase.DRAINING)
        super().on_response_complete()

    # ---- deadlines ---------------------------------------------------------------------

    def _enter(self, phase: Phase) -> None:
        self._phase = phase
        self._began = self._last = self.loop.time()
        self._bytes = 0

    def _check(self) -> None:
        """The timer: close the connection past its phase's deadline, else look again later."""
        self._watch = None
        if self.transport.is_closing() or self._phase is Phase.CLOSED:
            return
        now = self.loop.time()
        if self._phase is Phase.BODY and self.flow.read_paused:
            self._began = self._last = now  # the server is the slow one: a new window
            self._bytes = 0
        overdue = self._overdue(now)
        if overdue is not None:
            self._time_out(*overdue)
            return
        self._watch = self.loop.call_later(self._next_check(now), self._check)

    def _overdue(self, now: float) -> tuple[str, str] | None:
        """(why, setting) when the phase is past a deadline, else None."""
        limits = self.limits
        if self._phase is Phase.HEADERS and now - self._began >= limits.header_timeout_s:
            why = f"request headers not complete in {limits.header_timeout_s:g} s"
            return why, "api.header_timeout_s"
        if self._phase is Phase.DRAINING and now - self._began >= limits.body_timeout_s:
            return "request body still arriving after the answer", "api.body_timeout_s"
        if self._phase is not Phase.BODY:
            return None
        if now - self._last >= limits.body_timeout_s:
            return f"no request body for {limits.body_timeout_s:g} s", "api.body_timeout_s"
        elapsed = now - self._began
        slow = self._bytes < limits.min_body_bytes_per_s * elapsed
        if elapsed >= limits.body_timeout_s and slow:
            why = f"request body slower than {limits.min_body_bytes_per_s:g} bytes/s"
            return why, "api.min_body_bytes_per_s"
        return None

    def _next_check(self, now: float) -> float:
        limits = self.limits
        if self._phase is Phase.HEADERS:
            return self._began + limits.header_timeout_s - now
        if self._phase is Phase.DRAINING:
            return self._began + limits.body_timeout_s - now
        if self._phase is Phase.BODY:
            idle = self._last + limits.body_timeout_s - now
            rate = max(self._began + limits.body_timeout_s - now, RATE_CHECK_S)
            return min(idle, rate)
        return min(limits.header_timeout_s, limits.body_timeout_s)  # a new request may start

    def _time_out(self, why: str, setting: str) -> None:
        if self._phase is Phase.DRAINING:
            self._close()  # its answer went out already
            return
        self._answer_and_close(408, "timeout", why, setting)

    def _stop_watching(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    # ---- answers -----------------------------------------------------------------------

    def _answer_and_close(self, status: int, code: str, message: str, setting: str) -> None:
        """Answer ``status`` if no response is under way, and close; the app sees a disconnect."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete or not cycle.response_started:
            self.transport.write(_raw_response(status, code, f"{message} ({setting})"))
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's later writes are dropped, its reads end
            cycle.message_event.set()
        self._close()

    def _close(self) -> None:
        """Send our end's FIN, drop what still arrives, close after ``LINGER_S``."""
        self._stop_watching()
        self._phase = Phase.CLOSED
        if not self.transport.can_write_eof():  # TLS: no half-close
            self.transport.close()
            return
        self.transport.write_eof()
        self._watch = self.loop.call_later(LINGER_S, self.transport.close)

    def _refuse(self, transport: asyncio.Transport, message: str) -> None:
        """Over a connection limit: a 503 and close, before reading a byte of the request."""
        self._phase = Phase.CLOSED
        self.transport = transport  # uvicorn's connection_lost closes it again, harmlessly
        transport.write(_raw_response(503, "busy", message, retry_after=1))
        transport.close()
        now = self.loop.time()
        cls = type(self)
        if cls.busy_logged_at is None or now - cls.busy_logged_at >= BUSY_LOG_EVERY_S:
            cls.busy_logged_at = now
            log.warning("refusing new HTTP connections: %s", message)


_REASONS = {
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}


def _raw_response(status: int, code: str, message: str, retry_after: int | None = None) -> bytes:
    """A complete response in the API's error shape, written straight to the socket."""
    body = json.dumps({"error": code, "message": message}).encode()
    head = [
        f"HTTP/1.1 {status} {_REASONS[status]}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
    ]
    if retry_after is not None:
        head.append(f"retry-after: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body
