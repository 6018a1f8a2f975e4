"""Who is calling on the agent link: the call metadata every agent call carries.

The join token (``authorization: Bearer <token>``) says that the caller is an agent of
this cluster; a fleet shares it. Calls that touch one node's work (``UploadBlob``) also
say which node they come from, and prove it with the node's key, the secret its hello
bound the name to: ``corral-node-bin`` (the name, UTF-8: binary metadata carries any
name) and ``corral-node-key``. A refusal that waiting cures carries ``RETRY_AFTER``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

NODE = "corral-node-bin"
KEY = "corral-node-key"
RETRY_AFTER = "corral-retry-after-s"
"""Trailer of a refusal that time cures (a cap on unfinished uploads): seconds to wait."""


def metadata(token: str, node: str, key: str) -> tuple[tuple[str, str | bytes], ...]:
    """The metadata of an agent's calls: its token, its node and the node's key."""
    pairs: list[tuple[str, str | bytes]] = [
        ("authorization", f"Bearer {token}"),
        (NODE, node.encode()),
    ]
    if key:
        pairs.append((KEY, key))
    return tuple(pairs)


def node_of(received: Iterable[Any] | None) -> tuple[str, str]:
    """``(node, key)`` as a call's metadata names them; ``""`` for what it leaves out."""
    node, key = "", ""
    for name, value in received or ():
        if name == NODE:
            node = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
        elif name == KEY:
            key = str(value)
    return node, key
