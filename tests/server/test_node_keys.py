"""A node's name is bound to the key of the agent that joined under it (``Hello.node_key``).

Another agent (a cloned machine with the same hostname, or whoever holds the join token)
cannot take over a live node's name, its work and its results; the name is free again
once that agent has been lost. Agents without a key (older ones) bind nothing.
"""

from __future__ import annotations

import pytest
from server_harness import ADMIN, World

from corral.core.errors import Conflict, LinkError
from corral.core.model import Gpu
from corral.core.states import NodeState
from corral.server.agentlink.base import Inventory

pytestmark = pytest.mark.anyio

A, B = "a" * 64, "b" * 64


def inventory(name: str, key: str) -> Inventory:
    return Inventory(name, gpus=(Gpu(0, "RTX 4090", 24 << 30),), cpus=8, key=key)


async def test_a_live_nodes_name_is_refused_to_another_key_until_the_node_is_lost(
    world: World,
) -> None:
    agents = world.plane.agents
    await agents.claim("n1", A)  # a new name: anyone
    await agents.hello(inventory("n1", A), [])
    await agents.claim("n1", A)  # the same agent reconnecting
    for other in (B, ""):
        with pytest.raises(Conflict, match="held by another agent that is still connected"):
            await agents.claim("n1", other)
    with pytest.raises(LinkError, match="held by another agent"):  # raced past the claim
        await agents.hello(inventory("n1", B), [])

    await world.tick(after=31)  # silent past node_timeout_s: lost
    view = await world.plane.nodes.get(ADMIN, "n1")
    assert view.record.node.state is NodeState.LOST
    await agents.claim("n1", B)  # a re-imaged machine comes back under its name
    await agents.hello(inventory("n1", B), [])
    with pytest.raises(Conflict):  # now bound to the new agent
        await agents.claim("n1", A)


async def test_a_name_joined_without_a_key_binds_to_the_first_agent_that_has_one(
    world: World,
) -> None:
    agents = world.plane.agents
    await agents.hello(inventory("n2", ""), [])  # an older agent: nothing bound
    await agents.claim("n2", "")
    await agents.claim("n2", B)
    await agents.hello(inventory("n2", B), [])
    with pytest.raises(Conflict):
        await agents.claim("n2", "")
