"""Fixtures for the end-to-end tests: a cluster of real processes on loopback."""

from __future__ import annotations

import shutil
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


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [  # no sandbox as root; no background calls to the closed network
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def browser() -> Iterator[object]:
    """Debian chromium driven by Playwright (the dashboard tests)."""
    if not Path(CHROMIUM).exists():
        pytest.fail("Debian chromium is required for the dashboard test (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield b
        finally:
            b.close()
