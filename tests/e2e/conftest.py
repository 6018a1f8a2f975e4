"""Fixtures for the end-to-end tests: a cluster of real processes on loopback."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
        b.new_page = _traced(b.new_page)  # type: ignore[method-assign]
        try:
            yield b
        finally:
            b.close()


def _traced(new_page: Callable[..., Any]) -> Callable[..., Any]:
    """Pages that print what went wrong in them (a failed or refused request, a slow answer,
    a console error, an uncaught exception): pytest shows it when a test fails."""
    started = time.monotonic()

    def stamp() -> str:
        return f"[browser +{time.monotonic() - started:6.2f}s]"

    def new(*args: Any, **kwargs: Any) -> Any:
        page = new_page(*args, **kwargs)
        page.on("pageerror", lambda e: print(stamp(), "uncaught:", e))
        page.on("console", lambda m: m.type == "error" and print(stamp(), "console:", m.text))
        page.on("requestfailed", lambda r: print(stamp(), "failed:", r.method, r.url, r.failure))

        def answered(response: Any) -> None:
            timing = response.request.timing
            took = (timing["responseEnd"] - timing["requestStart"]) / 1000
            if response.status >= 400 or took > 1:
                request = response.request
                print(stamp(), response.status, request.method, response.url, f"{took:.2f}s")

        def finished(request: Any) -> None:
            response = request.response()
            if response is not None:
                answered(response)

        page.on("requestfinished", finished)
        return page

    return new
