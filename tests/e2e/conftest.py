"""Fixtures for the end-to-end tests: a cluster of real processes on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_harness import Cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Start processes with ``cluster.start_server()`` / ``start_agent()``; all stop afterwards.

    The processes' output is printed at teardown, so pytest shows it when a test fails.
    """
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()
        print(c.logs())
