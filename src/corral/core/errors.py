"""The one exception tree of corral.

Exceptions are for bugs and infrastructure. "Cannot place" is never an
exception: the scheduler returns it as data with reasons (see
``corral.scheduler.api.Unplaced``).

::

    CorralError                  base of everything corral raises on purpose
    ├── InvalidSpec              bad input; ``field`` names what is wrong (HTTP 422)
    ├── IllegalTransition        a lifecycle edge that the table does not allow (a bug)
    ├── NotFound                 an id that does not exist (HTTP 404)
    ├── Conflict                 a stale version or a clashing idempotency key (HTTP 409)
    ├── AuthError                credentials (HTTP 401 / 403)
    │   ├── Unauthenticated      no or unknown token
    │   └── Forbidden            a valid token that may not do this
    │       └── QuotaExceeded    a team holds all it may (bytes stored); waiting will not help
    ├── LimitReached             too much at once: a rate, a stream cap, a queue cap (HTTP 429)
    ├── TooLarge                 an upload bigger than its limit (HTTP 413)
    ├── Unavailable              a store, server or backend that cannot be reached now
    ├── LinkError                the agent link broke or spoke out of turn
    └── ExecutorError            work failed on the agent; ``retryable`` says whether
                                 another attempt (maybe elsewhere) could succeed
"""

from __future__ import annotations


class CorralError(Exception):
    """Base class of every error corral raises on purpose."""


class InvalidSpec(CorralError, ValueError):
    """Input that cannot be accepted. ``field`` is a dotted path to the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class IllegalTransition(CorralError):
    """A state change that the lifecycle table does not allow."""

    def __init__(self, lifecycle: str, current: str, target: str) -> None:
        super().__init__(f"{lifecycle}: no transition {current} -> {target}")
        self.lifecycle = lifecycle
        self.current = current
        self.target = target


class NotFound(CorralError, LookupError):
    """Something looked up by id does not exist."""


class Conflict(CorralError):
    """A write lost a race (stale row version) or clashes with existing state."""


class AuthError(CorralError):
    """Authentication or authorization failed."""


class Unauthenticated(AuthError):
    """No credentials, or credentials that match no token."""


class Forbidden(AuthError):
    """Valid credentials that are not allowed to do this."""


class QuotaExceeded(Forbidden):
    """A team already holds as much as its quota allows; only deleting something helps."""


class LimitReached(CorralError):
    """Too much at once from one caller or team: a rate limit, a cap on open streams or on
    queued jobs. Waiting helps: ``retry_after`` is how many seconds (HTTP ``Retry-After``)."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TooLarge(CorralError):
    """An uploaded file (an input file) is bigger than its limit allows."""


class Unavailable(CorralError):
    """A dependency (store, server, backend) cannot be reached right now."""


class LinkError(CorralError):
    """The agent link failed or a peer sent something out of protocol."""


class ExecutorError(CorralError):
    """Work failed on the agent. ``retryable`` tells the server whether to requeue."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable
