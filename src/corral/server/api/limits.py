"""Refuse oversize request bodies (413) and NUL characters in URLs (422) before any parsing."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.server.api.errors import error_response

MULTIPART_SLACK = 64 * 1024
"""What a multipart form adds around its file (boundaries, part headers, small fields)."""


def upload_limits(max_file_bytes: int) -> dict[str, int]:
    """The routes that take a whole file in one request (input files, ComfyUI's uploads),
    and their body limit: one file of ``inputs.max_bytes`` (their own check refuses a
    larger file exactly; this only keeps the body from running on)."""
    limit = max_file_bytes + MULTIPART_SLACK
    return {"/v1/inputs": limit, "/upload/image": limit, "/upload/mask": limit}


class BodyLimit:
    """ASGI middleware: a Content-Length over the limit is refused at once; a chunked
    body is counted as it arrives and refused as soon as it passes the limit. ``larger``
    gives some paths a limit of their own."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, larger: Mapping[str, int] | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.larger = dict(larger or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if "\x00" in scope["path"] or b"%00" in scope.get("query_string", b""):
            message = "NUL characters are not allowed in URLs"
            await error_response(422, "invalid", message, field="url")(scope, receive, send)
            return
        limit = self.larger.get(scope["path"], self.max_bytes)
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await error_response(413, "too_large", self._message(limit))(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise HTTPException(413, self._message(limit))
            return message

        await self.app(scope, counted, send)

    def _message(self, limit: int) -> str:
        setting = "api.max_body_bytes" if limit == self.max_bytes else "inputs.max_bytes"
        return f"request body over the limit of {limit} bytes ({setting})"
