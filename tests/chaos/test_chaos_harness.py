"""The chaos harness, small: real servers, agents and proxies dying while jobs run.

``bench/chaos.py`` as the bench runs it, sized to finish in about a minute:
two replicas on PostgreSQL, four agents, a few hundred jobs; agents are
killed with ``kill -9`` and restarted, their connections cut, and the
scheduling leader killed once. Nothing may be lost and nothing completed
twice. (Timings are printed, never asserted.)
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

BENCH = Path(__file__).resolve().parents[2] / "bench"


def postgres_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=1):
            return True
    except OSError:
        return False


def figures(output: str) -> dict[str, str]:
    return dict(re.findall(r"^([a-z][a-z ]+): (.+)$", output, re.MULTILINE))


def test_nothing_is_lost_or_completed_twice_under_chaos() -> None:
    if not postgres_up():
        if os.environ.get("CORRAL_REQUIRE_SERVICES") == "1":
            pytest.fail("PostgreSQL is required (CORRAL_REQUIRE_SERVICES=1) but is not running")
        pytest.skip("PostgreSQL not running on 127.0.0.1:5432")
    args = ["--jobs", "250", "--agents", "4", "--replicas", "2", "--kill-every", "4"]
    args += ["--drop-every", "3", "--leader-kills", "1", "--chaos-until", "0.85"]
    args += ["--drain-timeout", "120", "--seed", "7"]
    run = subprocess.run(
        [sys.executable, str(BENCH / "chaos.py"), *args],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=BENCH,
    )
    print(run.stdout, run.stderr[-3000:], sep="\n")
    got = figures(run.stdout)
    assert run.returncode == 0, run.stderr[-3000:]
    assert got["jobs submitted"] == "250"
    assert got["lost"] == "0"
    assert got["completed twice"] == "0"
    assert got["wrong results"] == "0"
    assert got["completed"] == "250"
    assert int(got["agent kills"]) >= 1
    assert int(got["connection drops"]) >= 1
    assert got["leader kills"] == "1"
    assert re.fullmatch(r"\d+\.\d\d s", got["leader failover times"])
    assert int(got["total attempts"]) >= 250
