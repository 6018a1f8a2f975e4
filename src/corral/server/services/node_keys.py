"""A node's name is bound to the key of the agent that joined under it (``Hello.node_key``).

The agent makes the key on first start and keeps it in its work dir; the server keeps
its SHA-256 with the node. Another agent (a cloned machine with the same hostname, or
whoever holds the join token) cannot take over a live node's name, and with it the
node's assignments and results; once the node is lost the name is free again, and the
next agent to join binds it. An agent without a key (an older one) binds nothing.
"""

from __future__ import annotations

import hashlib
import secrets

from corral.core.states import NodeState
from corral.server.store.records import NodeRecord


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def may_hold(rec: NodeRecord, key: str) -> bool:
    """An agent may hold a node's name when the name is bound to its key, bound to no key
    yet, or the agent bound to it is lost (a re-imaged machine comes back as itself)."""
    if rec.key_hash is None or rec.node.state is NodeState.LOST:
        return True
    return bool(key) and secrets.compare_digest(rec.key_hash, key_hash(key))


def taken(node: str) -> str:
    """What an agent refused the name ``node`` is told."""
    return (
        f"node name {node!r} is held by another agent that is still connected (another "
        "machine with this name, or an agent started with another --work-dir); start this "
        "one with a different --name. The name is free again once that agent has been "
        "lost (silent for scheduling.node_timeout_s)"
    )


def proves(rec: NodeRecord, key: str) -> bool:
    """Whether ``key`` is the key the node's name is bound to (or the name is bound to no
    key: an agent without one). Unlike ``may_hold``, a lost node's name is not free here:
    this asks who a caller is, not whether it may take the name."""
    if rec.key_hash is None:
        return True
    return bool(key) and secrets.compare_digest(rec.key_hash, key_hash(key))
