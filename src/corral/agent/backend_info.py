"""What this node's ComfyUI offers (its ``/object_info``), for the server to merge.

The server answers ComfyUI's ``/object_info`` for every connected node at once
(the union of their node types and model lists). A node behind NAT cannot be
asked, so the agent reads its backend's ``/object_info`` and sends it with its
model report (``ModelStatus.backend_info``): when it joins, when its models
change, and every ``REFRESH_S`` (custom nodes and model files appear without
corral's knowledge). The body goes once per connection and change; later
reports carry only its digest.
"""

from __future__ import annotations

import hashlib
import logging
import zlib

import httpx

from corral.proto.gen.corral.v1 import agent_pb2 as pb

log = logging.getLogger("corral.agent")

REFRESH_S = 300.0
"""How stale a backend's description may get when nothing else prompts a new read."""

FETCH_TIMEOUT_S = 10.0  # a ComfyUI with many custom nodes takes a second or two to describe them
MAX_BYTES = 32 * 1024 * 1024
"""Largest ``/object_info`` sent (ComfyUI with hundreds of custom nodes answers a few MB)."""
MAX_COMPRESSED = 4 * 1024 * 1024  # what one report may carry (the link's messages are 8 MiB)


class ObjectInfoProbe:
    """Reads one ComfyUI's ``/object_info`` and says what to send of it."""

    def __init__(self, base_url: str, refresh_s: float = REFRESH_S) -> None:
        self.base_url = base_url.rstrip("/")
        self.refresh_s = refresh_s
        self.sha256 = ""
        self._body = b""
        self._read_at: float | None = None
        self._sent = ""  # the digest whose body this connection was sent

    def due(self, now: float) -> bool:
        return self._read_at is None or now - self._read_at >= self.refresh_s

    async def refresh(self, now: float) -> None:
        """Read ``/object_info`` again; a backend that does not answer keeps the last one."""
        self._read_at = now
        try:
            async with httpx.AsyncClient(timeout=FETCH_TIMEOUT_S) as client:
                response = await client.get(f"{self.base_url}/object_info")
                response.raise_for_status()
        except httpx.HTTPError as exc:
            log.warning("could not read /object_info of %s: %s", self.base_url, exc)
            return
        text = response.content
        body = zlib.compress(text)
        if len(text) > MAX_BYTES or len(body) > MAX_COMPRESSED:
            log.warning(
                "/object_info of %s is too large to report (%d bytes)", self.base_url, len(text)
            )
            return
        self.sha256, self._body = hashlib.sha256(text).hexdigest(), body

    def reconnected(self) -> None:
        """A new connection: the next report carries the body again."""
        self._sent = ""

    def message(self) -> pb.BackendInfo | None:
        """What the next report says: the digest, and the body unless already sent."""
        if not self.sha256:
            return None
        body = self._body if self._sent != self.sha256 else b""
        self._sent = self.sha256
        return pb.BackendInfo(sha256=self.sha256, json_zlib=body)
