"""When to try again: backoff for requests, and resuming an event stream (pure decisions).

The clients ask these objects what to do after each failure and do the
waiting themselves, so the rules are the same for the sync and async
clients and testable without a network.
"""

from __future__ import annotations

import errno
import random
from dataclasses import dataclass, field

import httpx

from corral.sdk.errors import ServerUnreachable, WaitTimeout

DEADLINE_SLICE = 2.0  # seconds; see Follow.read_timeout

# Worth another try: the request may not have reached the server, or its answer was lost.
# Submissions carry an Idempotency-Key, so repeating one never makes a second job.
RETRYABLE: tuple[type[Exception], ...] = (
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
)


@dataclass(frozen=True, slots=True)
class Retry:
    """Exponential backoff with jitter: ``base_s``, 2×, 4×, ... capped at ``max_s``.

    ``attempts`` counts every try, the first included; 1 means never retry.
    The default gives up after about 2 s of a server that refuses
    connections: long enough to ride out a restart, short enough for a CLI.
    """

    attempts: int = 4
    base_s: float = 0.25
    max_s: float = 4.0
    jitter: float = 0.2  # ± this fraction, so many clients do not retry in lockstep
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def delay(self, attempt: int) -> float | None:
        """Seconds to wait after failed try number ``attempt`` (1-based); None: give up."""
        if attempt >= self.attempts:
            return None
        raw = min(self.max_s, self.base_s * 2.0 ** (attempt - 1))
        return max(0.0, raw * (1 + self.rng.uniform(-self.jitter, self.jitter)))


NO_RETRY = Retry(attempts=1)


def describe(exc: BaseException) -> str:
    """A short human reason for a transport error ("connection refused", "timed out")."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError) or (
            isinstance(cause, OSError) and cause.errno == errno.ECONNREFUSED
        ):
            return "connection refused"
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, httpx.TimeoutException):
        return "timed out"
    text = str(exc).strip()
    return text or type(exc).__name__


@dataclass
class Follow:
    """The state of one job's event stream across reconnections.

    ``last`` is the seq of the last event handed out; a reconnection sends
    it as ``Last-Event-ID`` so the server resumes right after it.
    """

    job_id: str
    url: str
    retry: Retry
    last: int = 0
    idle_timeout: float | None = None  # stop quietly after this long without an event
    kinds: tuple[str, ...] = ()  # only events of these kinds (the server filters); () = all
    deadline: float | None = None  # monotonic time; past it, raise WaitTimeout
    timeout: float | None = None  # the caller's timeout, for the WaitTimeout message
    stream_timeout: float = 60.0  # no byte for this long (keep-alives come every 15 s): dead
    failures: int = 0
    reconnects: int = 0
    _slice: float = field(default=60.0, repr=False)

    def headers(self) -> dict[str, str]:
        return {"Last-Event-ID": str(self.last)} if self.last else {}

    def params(self) -> dict[str, list[str]]:
        return {"kind": list(self.kinds)} if self.kinds else {}

    def read_timeout(self, now: float) -> float:
        """How long one read may block before the client must decide again.

        With a deadline, reads block at most ``DEADLINE_SLICE`` so a blocking
        client notices the deadline promptly; such a timeout is not a failure.
        """
        limit = self.stream_timeout
        if self.idle_timeout is not None:
            limit = min(limit, self.idle_timeout)
        if self.deadline is not None:
            limit = min(limit, DEADLINE_SLICE, max(0.01, self.deadline - now))
        self._slice = limit
        return limit

    def seen(self, seq: int, now: float) -> None:
        """An event arrived: remember it; raise ``WaitTimeout`` if the deadline passed."""
        self.last = max(self.last, seq)
        self.failures = 0
        self._check_deadline(now)

    def broken(self, exc: BaseException, now: float) -> float | None:
        """The stream failed with ``exc``. Returns seconds to wait before reconnecting,
        None to end the stream quietly (idle), or raises (deadline, gave up)."""
        if isinstance(exc, httpx.ReadTimeout):
            if self.idle_timeout is not None:
                return None
            self._check_deadline(now)
            if self._slice < self.stream_timeout:
                self.reconnects += 1
                return 0.0  # a short read slice ended, nothing broke
        self.failures += 1
        delay = self.retry.delay(self.failures)
        if delay is None:
            raise ServerUnreachable(
                self.url, f"event stream broke: {describe(exc)}", attempts=self.failures
            ) from exc
        self.reconnects += 1
        return delay

    def ended_early(self) -> float:
        """The server closed the stream before the job's final event: reconnect soon."""
        self.failures += 1
        self.reconnects += 1
        return min(self.retry.max_s, self.retry.base_s * self.failures)

    def _check_deadline(self, now: float) -> None:
        if self.deadline is not None and now >= self.deadline:
            raise WaitTimeout(self.job_id, self.timeout or 0.0, None)
