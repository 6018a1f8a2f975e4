"""Fixtures for the CLI tests: the same server processes as the SDK tests, and a runner.

The server helpers live in ``tests/sdk`` (``live_server.py``, ``stub_server.py``);
they are imported from there, not copied. Commands run in-process through
typer's ``CliRunner`` (fast), with ``CORRAL_CONFIG`` pointing into a temp dir
so no test ever reads or writes the real ``~/.corral``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sdk"))

import live_fixtures
from cli_runner import Cli


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    """No server configured: only a private config file path and a wide terminal."""
    return Cli(
        {
            "CORRAL_CONFIG": str(tmp_path / "home" / "config.toml"),
            "CORRAL_URL": None,
            "CORRAL_TOKEN": None,
            "COLUMNS": "200",
        }
    )


server, stub, team = live_fixtures.server, live_fixtures.stub, live_fixtures.team  # shared fixtures
