"""Ctrl-C on a real ``corral agent`` that cannot reach its server: it exits.

The in-process form of this (a cancel landing in the very loop turn of the
dead server's answer) is ``tests/agent/test_link_cancel.py``; here the whole
path runs: the signal handler, the supervisor's shutdown, the link's cancel.
"""

from __future__ import annotations

import socket

import pytest
from e2e_harness import Cluster

pytestmark = pytest.mark.slow


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("redials", [1, 3])
def test_ctrl_c_stops_an_agent_dialling_an_unreachable_server(
    cluster: Cluster, redials: int
) -> None:
    cluster.agents_url = f"grpc://127.0.0.1:{_dead_port()}"  # nothing listens there
    agent = cluster.start_agent("lonely", wait=False)
    for _ in range(redials):
        agent.wait_for(r"dialling again", after=len(agent.lines))
    assert agent.interrupt(timeout=30) == 0, agent.log()
    assert not any("connected to" in line for line in agent.lines)
