"""Fixtures for the simulator tests: run ``corral sim`` in-process, write scenario files.

Scenario files shared by these tests live in ``tests/sim/scenarios/``; tests
that need a variation write a small file into ``tmp_path`` instead. Helpers
are in ``simtest.py``.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from simtest import SimRun, run_cli


@pytest.fixture
def run_sim() -> Callable[..., SimRun]:
    """``run_sim(path, *options)``: run ``corral sim PATH --json OPTIONS``; must succeed."""
    return run_cli


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str], Path]:
    """``write(name, text)``: a file in tmp_path with ``text`` dedented."""

    def make(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
        return path

    return make
