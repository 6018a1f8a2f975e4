"""The SDK's exception tree: every failure a client can see, with the server's own words.

::

    ClientError                   base of everything the SDK raises (a core ``CorralError``)
    ├── ServerUnreachable         no answer from the URL (after the retries); says how to start one
    ├── UntrustedServer           an https server other than the pinned one (``trust.py``)
    ├── ApiError                  the server answered with an error status
    │   ├── BadRequest            400/413/422: bad input; ``field`` names the culprit
    │   ├── Unauthorized          401: no token, or a token the server does not know
    │   ├── PermissionDenied      403: a valid token that may not do this
    │   ├── NotFound              404: no such job/node (or not visible to this token)
    │   ├── Conflict              409: e.g. an Idempotency-Key reused for a different request
    │   ├── TooManyRequests       429: a rate limit, stream cap or queue cap; ``retry_after``
    │   └── ServerError           5xx
    ├── WaitTimeout               ``wait``/``result`` ran out of time; the job goes on
    ├── JobFailed                 ``result`` of a job that failed or was cancelled
    └── StreamError               an event stream could not be resumed

Connection failures are retried with backoff before ``ServerUnreachable`` is
raised; an ``ApiError`` never is (except 502/503/504, which mean "try again").
"""

from __future__ import annotations

from typing import Any

import httpx

from corral.core.errors import CorralError

START_HINT = (
    "Is a server running there? Start one with `corral up` (server and a local agent) "
    "or `corral server`, or point the client at yours (CORRAL_URL, or `corral login URL`)."
)


class ClientError(CorralError):
    """Base class of every error the SDK raises on purpose."""


class ServerUnreachable(ClientError):
    """The server at ``url`` did not answer (refused, timed out, connection dropped)."""

    def __init__(self, url: str, reason: str, *, attempts: int = 1) -> None:
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        super().__init__(f"cannot reach the corral server at {url}{tries}: {reason}. {START_HINT}")
        self.url = url
        self.reason = reason
        self.attempts = attempts


class UntrustedServer(ClientError):
    """The server's certificate is not the pinned one: nothing was sent to it."""


class ApiError(ClientError):
    """An error answer. ``code`` is the server's short code (``invalid``, ``not_found``, ...)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str | None = None,
        fields: list[dict[str, str]] | None = None,
        method: str = "",
        url: str = "",
    ) -> None:
        super().__init__(f"{message} (HTTP {status} {code})")
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.fields = fields or []
        self.method = method
        self.url = url


class BadRequest(ApiError):
    """400, 413 or 422: the request was wrong; ``field`` (and ``fields``) say where."""


class Unauthorized(ApiError):
    """401: no token, or one the server does not know (or revoked)."""


class PermissionDenied(ApiError):
    """403: the token is valid but may not do this (e.g. a team token changing a node)."""


class NotFound(ApiError):
    """404: no such thing, or not visible to this token."""


class Conflict(ApiError):
    """409: the request clashes with the server's state."""


class TooManyRequests(ApiError):
    """429: a rate limit, a cap on open streams or on a team's queued jobs was reached;
    ``retry_after`` is how many seconds the server asked to wait (the message names the
    limit and its setting)."""

    retry_after: float | None = None


class ServerError(ApiError):
    """5xx: the server failed; 502/503/504 are retried first."""


class WaitTimeout(ClientError, TimeoutError):
    """A wait ran out of time. The job is not affected; wait again or cancel it."""

    def __init__(self, job_id: str, timeout: float, state: str | None) -> None:
        now = f" (it is {state})" if state else ""
        super().__init__(f"job {job_id} did not finish within {timeout:g}s{now}")
        self.job_id = job_id
        self.timeout = timeout
        self.state = state


class JobFailed(ClientError):
    """The job ended without a result: ``state`` is ``failed`` or ``cancelled``."""

    def __init__(self, job_id: str, state: str, error: str | None) -> None:
        why = f": {error}" if error else ""
        super().__init__(f"job {job_id} {state}{why}")
        self.job_id = job_id
        self.state = state
        self.error = error


class StreamError(ClientError):
    """An event stream broke and could not be resumed."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    429: TooManyRequests,
    413: BadRequest,
    422: BadRequest,
}
RETRY_STATUSES = frozenset({502, 503, 504})


def api_error(response: httpx.Response) -> ApiError:
    """The exception for an error ``response``, carrying the server's code, message and field."""
    body = _json_body(response)
    status = response.status_code
    kind = _BY_STATUS.get(status, ServerError if status >= 500 else ApiError)
    message = str(body.get("message") or response.reason_phrase or "error")
    field = body.get("field")
    fields = body.get("fields")
    error = kind(
        status,
        str(body.get("error") or _default_code(status)),
        message,
        field=str(field) if field else None,
        fields=fields if isinstance(fields, list) else None,
        method=response.request.method,
        url=str(response.request.url),
    )
    if isinstance(error, TooManyRequests):
        wait = response.headers.get("Retry-After", "")
        error.retry_after = float(wait) if wait.isdigit() else None
    return error


def _json_body(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()[:300]
        return {"message": text} if text else {}
    return body if isinstance(body, dict) else {"message": str(body)}


def _default_code(status: int) -> str:
    return {401: "unauthenticated", 403: "forbidden", 404: "not_found"}.get(status, "error")
