"""bench/e2e.py with tiny sizes, so the benchmark cannot rot (figures are not checked)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
PG_HOST, PG_PORT = "127.0.0.1", 5432
PG_BASE = f"postgresql://postgres@{PG_HOST}:{PG_PORT}/test"
pytestmark = pytest.mark.slow


def _up(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def require_postgres() -> None:
    if _up(PG_PORT):
        return
    if os.environ.get("CORRAL_REQUIRE_SERVICES") == "1":
        pytest.fail("PostgreSQL is required (CORRAL_REQUIRE_SERVICES=1) but 127.0.0.1:5432 is down")
    pytest.skip("PostgreSQL not running on 127.0.0.1:5432")


async def _pg(sql: str, *args: object) -> object:
    import asyncpg

    conn = await asyncpg.connect(host=PG_HOST, port=PG_PORT, user="postgres", database="test")
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


def drop_schema(schema: str) -> None:
    asyncio.run(_pg(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))


def _tables(schema: str) -> int:
    sql = "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1"
    return int(asyncio.run(_pg(sql, schema)))  # type: ignore[call-overload]


def test_e2e_benchmark_runs_corral_and_celery_and_prints_the_ratio() -> None:
    if not _up(6379):
        if os.environ.get("CORRAL_REQUIRE_SERVICES") == "1":
            pytest.fail("Redis is required (CORRAL_REQUIRE_SERVICES=1) but 127.0.0.1:6379 is down")
        pytest.skip("Redis not running on 127.0.0.1:6379")
    argv = [sys.executable, "e2e.py", "--jobs", "30", "--idle", "5", "--agents", "1"]
    argv += ["--clients", "3", "--postgres", "none"]
    out = subprocess.run(argv, cwd=BENCH, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert any(line.startswith("corral/sqlite    concurrent") for line in lines), out.stdout
    assert any(line.startswith("celery           batch") for line in lines), out.stdout
    [ratio] = [line for line in lines if line.startswith("throughput ratio corral/celery: ")]
    assert float(ratio.rsplit(" ", 1)[1]) > 0


def test_e2e_benchmark_measures_corral_with_httpx_as_its_client_too() -> None:
    argv = [sys.executable, "e2e.py", "--jobs", "20", "--idle", "3", "--agents", "1"]
    argv += ["--clients", "2", "--postgres", "none", "--skip-celery", "--client", "httpx"]
    out = subprocess.run(argv, cwd=BENCH, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "corral's HTTP client: httpx" in out.stdout
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("corral/sqlite")]
    assert [r[1] for r in rows] == ["idle", "concurrent", "batch"], out.stdout
    assert all(float(r[2]) > 0 for r in rows), out.stdout


def test_the_idle_steps_benchmark_stamps_each_step_of_a_job() -> None:
    argv = [sys.executable, "e2e_steps.py", "--jobs", "5", "--timeline", "1"]
    out = subprocess.run(argv, cwd=BENCH, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    steps, _, timeline = out.stdout.partition("round trip of")
    rows = {line[:40].strip(): line.split()[-1] for line in steps.splitlines()[3:] if line}
    # Stamps came from the server and the agent processes, for every job.
    for step in ("server: schedule", "agent: assignment read", "server: SSE event framed"):
        assert rows.get(step) == "5", out.stdout
    assert rows["client: saw it done"] == "5"
    # --timeline: one whole trip, with the server loop's callbacks among the stamps.
    assert "server: schedule" in timeline, out.stdout
    assert any(" loop " in ln and "GroupCommitter" in ln for ln in timeline.splitlines()), timeline


def test_the_steps_benchmark_cuts_concurrent_trips_into_stages() -> None:
    argv = [sys.executable, "e2e_steps.py", "--concurrent", "12", "--clients", "3"]
    argv += ["--agents", "1"]
    out = subprocess.run(argv, cwd=BENCH, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "12 jobs, 3 clients, 1 agents" in out.stdout, out.stdout
    rows = {line[:46].strip(): line.split()[-3:] for line in out.stdout.splitlines()[4:] if line}
    # Every job's events were found in the server's log and its stages measured.
    stages = [
        "client: POST -> the submission's transaction",
        "server: submission -> placement",
        "placement -> the agent's end handled",
        "the end -> the client saw it",
        "client: the whole round trip",
    ]
    for stage in stages:
        assert rows[stage][-1] == "12", out.stdout
    whole = float(rows["client: the whole round trip"][0])
    parts = [float(rows[stage][0]) for stage in stages[:4]]
    assert all(p >= 0 for p in parts), out.stdout
    assert 0 < whole < 60_000, out.stdout


def test_the_ab_benchmark_runs_peers_in_turn_and_prints_their_medians() -> None:
    argv = [sys.executable, "ab.py", "--rounds", "2", "--jobs", "10", "--idle", "3"]
    argv += ["--agents", "1", "--clients", "2"]
    argv += ["as-is=-", "d1=-,CORRAL_SCHEDULING__DEBOUNCE_S=0.001"]
    out = subprocess.run(argv, cwd=BENCH, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    rounds = [line.split(":")[0] for line in out.stdout.splitlines() if line.startswith("round")]
    # The second round runs the peers in the other order.
    assert rounds == ["round 1/2 as-is", "round 1/2 d1", "round 2/2 d1", "round 2/2 as-is"]
    _, _, medians = out.stdout.partition("medians of the rounds\n")
    assert [line.split(":")[0] for line in medians.splitlines()] == ["as-is", "d1"], out.stdout
    assert "jobs/s" in medians
    assert "against as-is round by round: idle lower in " in medians.splitlines()[1]


def test_the_ab_benchmark_runs_its_peers_on_postgresql_each_in_a_schema_of_its_own() -> None:
    require_postgres()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    argv = [sys.executable, "ab.py", "--rounds", "1", "--jobs", "6", "--idle", "2"]
    argv += ["--agents", "1", "--clients", "2", "--db", f"{PG_BASE}?schema={schema}"]
    argv += ["a=-", "b=-"]
    try:
        out = subprocess.run(argv, cwd=BENCH, capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "medians of the rounds" in out.stdout
        assert _tables(f"{schema}_p1") > 0, "a schema per peer"
        assert _tables(f"{schema}_p2") > 0, "a schema per peer"
    finally:
        drop_schema(f"{schema}_p1")
        drop_schema(f"{schema}_p2")


def test_the_ab_benchmark_refuses_a_db_that_is_not_postgresql() -> None:
    argv = [sys.executable, "ab.py", "--db", "sqlite:///x.db", "a=-"]
    out = subprocess.run(argv, cwd=BENCH, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "expected a postgresql:// URL" in out.stderr


def test_the_ab_benchmark_names_a_bad_spec() -> None:
    argv = [sys.executable, "ab.py", "a=/nonexistent", "b=-,DEBOUNCE"]
    out = subprocess.run(argv, cwd=BENCH, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "'/nonexistent' holds no corral package" in out.stderr


def test_the_corral_peer_runs_every_shape_and_closes_what_it_opened() -> None:
    """In this process, where an unclosed socket or pipe fails the test (ResourceWarning):
    every job of every shape is seen once, started before it is done."""
    sys.path.insert(0, str(BENCH))
    try:
        from corral_peer import CorralPeer
        from workload import batch, concurrent, idle
    finally:
        sys.path.remove(str(BENCH))
    peer = CorralPeer(1)
    try:
        shapes = [idle(peer, 5), concurrent(peer, 60, 8), batch(peer, 30), idle(peer, 3)]
    finally:
        peer.close()
    assert [f.jobs for f in shapes] == [5, 60, 30, 3]
    for f in shapes:
        assert all(0 < t.to_start <= t.to_done < 60 for t in f.timings), f
