"""``AgentLink`` across replicas: send locally, else tell the replica holding the agent.

With several replicas on PostgreSQL, the node an assignment is for may hold
its stream to another replica. ``RelayLink`` wraps this replica's transport
(gRPC): when the node is connected here the message goes straight out;
otherwise it publishes a ``Note`` (ids only) and the replica that holds the
node reads the intent from the store and sends it (``services.delivery``).
No ``LinkError`` escapes for a node held elsewhere: the intent is stored and
on its way. A node connected nowhere gets it at its next hello, as before.
"""

from __future__ import annotations

from corral.core.errors import LinkError
from corral.server.agentlink.base import AgentLink, Assignment, StopOrder
from corral.server.store.notify import Note, Notifier


def holds(link: AgentLink, node: str) -> bool:
    """Whether ``node`` has its stream on this replica's transport (gRPC or in-process)."""
    for attribute in ("sessions", "agents"):
        connected = getattr(link, attribute, None)
        if connected is not None:
            return node in connected
    return True  # a transport that cannot say: try it


class RelayLink:
    """Implements ``AgentLink``: the local ``transport``, then the other replicas."""

    def __init__(self, transport: AgentLink, notifier: Notifier) -> None:
        self.transport = transport
        self.notifier = notifier
        self.relayed = 0  # messages handed to other replicas (for tests and figures)

    async def assign(self, node: str, assignment: Assignment) -> None:
        try:
            await self.transport.assign(node, assignment)
        except LinkError:
            self._relay(Note("assign", node, assignment.allocation_id))

    async def stop(self, node: str, order: StopOrder) -> None:
        try:
            await self.transport.stop(node, order)
        except LinkError:
            self._relay(Note("stop", node, order.allocation_id))

    async def set_intake(self, node: str, *, open: bool) -> None:
        try:
            await self.transport.set_intake(node, open=open)
        except LinkError:
            self._relay(Note("intake", node))

    async def go(self, node: str, allocation_id: str, attempt: int) -> None:
        try:
            await self.transport.go(node, allocation_id, attempt)
        except LinkError:
            self._relay(Note("go", node, allocation_id))

    def _relay(self, note: Note) -> None:
        self.relayed += 1
        self.notifier.publish(note)
