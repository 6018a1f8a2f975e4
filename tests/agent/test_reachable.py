"""The address an agent reports for a gang's rendezvous (``corral.address``)."""

from __future__ import annotations

import socket

from corral.agent.main import Agent, AgentOptions, reachable
from corral.core.rendezvous import ADDRESS_LABEL


def test_the_address_is_the_one_on_the_route_to_the_server() -> None:
    assert reachable("127.0.0.1:50051") == "127.0.0.1"
    assert reachable("localhost:50051") == "127.0.0.1"


def test_without_a_route_the_host_name_stands_in() -> None:
    assert reachable("no-such-host.invalid:50051") == socket.gethostname()


def test_the_agent_reports_its_address_as_a_label_and_takes_a_given_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    base = AgentOptions(servers=("grpc://127.0.0.1:1",), token="t", work_dir=tmp_path)
    assert Agent(base).identity.labels[ADDRESS_LABEL] == "127.0.0.1"
    given = AgentOptions(
        servers=("grpc://127.0.0.1:1",), token="t", work_dir=tmp_path, address="10.9.8.7"
    )
    assert Agent(given).identity.labels[ADDRESS_LABEL] == "10.9.8.7"
