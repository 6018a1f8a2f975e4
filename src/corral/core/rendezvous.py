"""Where a gang's replicas meet: replica 0's node, at a port handed out there.

``torch.distributed`` (and ``torchrun``) start by every rank dialling one
address, the *master*, which rank 0 listens on. corral picks it: the address
is the one replica 0's agent reports as reachable by other nodes (the node
label ``corral.address``; the agent fills it in), and the port is drawn from
``PORTS`` by the id of replica 0's allocation. Every attempt of a gang has new
allocation ids, so a port that turns out busy is not drawn again on the retry.
"""

from __future__ import annotations

import zlib

ADDRESS_LABEL = "corral.address"
"""The node label that holds the address other nodes reach this one at."""

PORTS = range(29400, 29900)
"""Rendezvous ports: just above torch's default 29500-area, 500 of them, so two gangs
led from one node rarely draw the same one (and a clash only costs one retry)."""


def master_port(allocation_id: str) -> int:
    """The rendezvous port of the gang whose replica 0 is ``allocation_id``."""
    return PORTS[zlib.crc32(allocation_id.encode()) % len(PORTS)]
