"""What each node's ComfyUI offers (its ``/object_info``), as the node's agent reported it.

Agents send their ComfyUI's ``/object_info`` with their model reports
(``ModelStatus.backend_info``: a digest, and the zlib-compressed JSON once per
connection and change, ``agent/backend_info.py``). The body is kept in the
blob store under its digest, so nodes with the same install share one copy and
every replica can read what any agent reported; a small blob per node names
its current digest. ``object_infos(nodes)`` gives the distinct descriptions of
the given nodes, and says which nodes reported none (agents older than this,
or whose ComfyUI did not answer yet).

Bounds: a description is at most ``MAX_JSON`` bytes (checked while inflating),
at most ``MAX_DISTINCT`` distinct ones are merged per answer (nodes beyond that
count as unreported), and only the last merge's inputs are kept parsed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from corral.core import Clock
from corral.core.errors import NotFound
from corral.server.blobs import BlobStore

log = logging.getLogger("corral.server.compat")

BACKENDS = ("comfyui",)  # the backends whose description the server keeps
MAX_JSON = 32 * 1024 * 1024  # as the agent's cap: a ComfyUI with hundreds of custom nodes
MAX_DISTINCT = 16
"""Distinct descriptions merged into one answer: a fleet is a few installs, not hundreds."""
NODE_TTL_S = 30.0  # how long another replica's record of a node's digest is trusted
_SHA = re.compile(r"^[0-9a-f]{64}$")

Reported = Mapping[str, tuple[str, bytes]]  # backend -> (sha256, zlib JSON or b"")


@dataclass(frozen=True, slots=True)
class Described:
    """The distinct descriptions of some nodes, and the nodes without one."""

    infos: list[Mapping[str, Any]]
    unreported: list[str]


class BackendInfoStore:
    """Agents' reports of what their backends offer, in; descriptions by node, out."""

    def __init__(self, blobs: BlobStore, clock: Clock) -> None:
        self.blobs = blobs
        self.clock = clock
        self._digest: dict[str, tuple[str, float]] = {}  # node -> (digest, when learnt)
        self._parsed: dict[str, Mapping[str, Any]] = {}  # digest -> JSON, the last answer's

    async def record(self, node: str, reported: Reported) -> None:
        """Keep a node's report; a body that does not match its digest is dropped."""
        for backend, (digest, body) in reported.items():
            if backend not in BACKENDS or not _SHA.match(digest):
                continue
            if body:
                text = _inflate(body)
                if text is None or hashlib.sha256(text).hexdigest() != digest:
                    log.warning("node %s sent a %s description that does not match", node, backend)
                    continue
                await self.blobs.put(_body_key(digest), body)
            old = self._digest.get(node, ("", 0.0))[0]
            if old != digest:
                await self.blobs.put(_node_key(node), digest.encode())
                await self._forget(old)
            self._digest[node] = (digest, self.clock.now())

    async def _forget(self, digest: str) -> None:
        """Drop a description no node known here uses any more (another replica's node
        that still did would report it again within its refresh)."""
        if digest and all(d != digest for d, _ in self._digest.values()):
            await self.blobs.delete(_body_key(digest))

    async def object_infos(self, nodes: Iterable[str]) -> Described:
        """The distinct ``object_info`` of these nodes' ComfyUI, and who reported none."""
        digests: dict[str, list[str]] = {}
        unreported: list[str] = []
        for node in nodes:
            digest = await self._node_digest(node)
            if digest is None:
                unreported.append(node)
            else:
                digests.setdefault(digest, []).append(node)
        kept: dict[str, Mapping[str, Any]] = {}
        for digest in sorted(digests, key=lambda d: (-len(digests[d]), d)):
            info = await self._info(digest) if len(kept) < MAX_DISTINCT else None
            if info is None:
                unreported.extend(digests[digest])
            else:
                kept[digest] = info
        self._parsed = kept
        return Described(list(kept.values()), unreported)

    async def _node_digest(self, node: str) -> str | None:
        known = self._digest.get(node)
        if known is not None and self.clock.now() - known[1] < NODE_TTL_S:
            return known[0]
        try:
            digest = (await self.blobs.get(_node_key(node))).decode()
        except NotFound:
            return None
        self._digest[node] = (digest, self.clock.now())
        return digest if _SHA.match(digest) else None

    async def _info(self, digest: str) -> Mapping[str, Any] | None:
        if digest in self._parsed:
            return self._parsed[digest]
        try:
            text = _inflate(await self.blobs.get(_body_key(digest)))
        except NotFound:
            return None
        try:
            info = json.loads(text) if text is not None else None
        except ValueError:
            return None
        return info if isinstance(info, dict) else None


def _inflate(body: bytes) -> bytes | None:
    """The JSON text, or None when it is not zlib data or inflates past ``MAX_JSON``."""
    inflater = zlib.decompressobj()
    try:
        text = inflater.decompress(body, MAX_JSON + 1)
    except zlib.error:
        return None
    return text if len(text) <= MAX_JSON and not inflater.unconsumed_tail else None


def _body_key(digest: str) -> str:
    return f"backend-info/{digest}.json.z"


def _node_key(node: str) -> str:
    """A node's pointer blob, named by a hash: node names are not file names."""
    return f"backend-info/nodes/{hashlib.sha256(node.encode()).hexdigest()}"
