"""Session fixtures shared by the SDK and CLI tests: the two server processes and a team.

Both ``conftest.py`` files import these by name, so the servers are defined once.
The servers start once per session (about a second each); tests keep out of each
other's way by submitting under a team of their own.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from live_server import Running, corral_server, stub_server


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """``corral server`` with no agents: jobs stay queued."""
    with corral_server(tmp_path_factory.mktemp("corral-server")) as running:
        yield running


@pytest.fixture(scope="session")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """A server process with two stub agents that run jobs as their payload says."""
    with stub_server(tmp_path_factory.mktemp("stub-server")) as running:
        yield running


@pytest.fixture
def team() -> str:
    """A team of this test's own, so shared servers do not mix tests' jobs."""
    return f"t-{uuid.uuid4().hex[:10]}"
