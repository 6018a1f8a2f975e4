"""What the HTTP executors share: turning transport and HTTP errors into clear failures."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from corral.core import ExecutorError

BODY_QUOTE = 300
"""Characters of an error response body quoted in the failure message."""


@contextmanager
def backend_errors(backend: str, base_url: str) -> Iterator[None]:
    """Transport errors as ``ExecutorError``s that say what could not be reached."""
    try:
        yield
    except httpx.ConnectError as exc:
        raise ExecutorError(
            f"{backend} backend at {base_url} is unreachable ({exc}); is it running?",
            retryable=True,
        ) from exc
    except httpx.TimeoutException as exc:
        raise ExecutorError(
            f"{backend} backend at {base_url} did not answer in time ({type(exc).__name__})",
            retryable=True,
        ) from exc
    except httpx.HTTPError as exc:
        raise ExecutorError(
            f"{backend} backend at {base_url} failed: {type(exc).__name__}: {exc}", retryable=True
        ) from exc


def check_response(response: httpx.Response, backend: str, what: str) -> httpx.Response:
    """``response`` when it succeeded; else a failure quoting the backend's own message.

    5xx is retryable (a broken or overloaded backend; another node may do), 4xx is
    not (the request itself is wrong and will be wrong everywhere).
    """
    if response.is_success:
        return response
    detail = _detail(response)
    raise ExecutorError(
        f"{backend} answered HTTP {response.status_code} to {what}: {detail}",
        retryable=response.status_code >= 500,
    )


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:BODY_QUOTE] or response.reason_phrase
    if isinstance(body, dict):
        parts = [body.get(k) for k in ("error", "detail", "errors", "message") if body.get(k)]
        if isinstance(body.get("error"), dict):  # ComfyUI: {"error": {"type", "message"}}
            parts = [body["error"].get("message", ""), body["error"].get("details", "")]
        text = ": ".join(str(p) for p in parts if p)
        return text[:BODY_QUOTE] or str(body)[:BODY_QUOTE]
    return str(body)[:BODY_QUOTE]
