"""An event stream's HTTP response, which gives its place under the stream caps back however
it ends: finished, its client gone, or never started (docs/security/limits.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from corral.server.services.streams import StreamSlot


class HeldStream(StreamingResponse):
    """A ``StreamingResponse`` holding a ``StreamSlot`` until the response is over.

    Released here rather than in the body's ``finally``: a client that leaves before the
    first byte ends the response without ever starting the body."""

    def __init__(
        self, body: AsyncIterator[str], slot: StreamSlot, headers: Mapping[str, str]
    ) -> None:
        super().__init__(body, media_type="text/event-stream", headers=headers)
        self.slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slot.release()
