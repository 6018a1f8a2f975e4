"""bench/job_list.py with a small table, so the benchmark cannot rot (figures are not checked)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
PG = "postgresql://postgres@127.0.0.1:5432/test"


def _run(*args: str) -> str:
    argv = [sys.executable, str(BENCH / "job_list.py"), "--jobs", "3000", "--small", "300"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    done = subprocess.run(
        [*argv, "--repeat", "1", *args],
        capture_output=True, text=True, timeout=240, env=env, cwd=BENCH, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _cases(out: str, label: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(label) and " jobs  " in line]


def test_the_list_benchmark_times_every_filter_on_sqlite() -> None:
    out = _run()
    lines = _cases(out, "sqlite")
    assert len(lines) == 18, out
    assert any("model rare-lora" in line for line in lines)
    assert "sqlite   slowest at 3,000:" in out


@pytest.mark.postgres
def test_the_list_benchmark_runs_on_postgresql_in_a_schema_of_its_own() -> None:
    try:
        socket.create_connection(("127.0.0.1", 5432), timeout=1).close()
    except OSError:
        pytest.skip("PostgreSQL not running on 127.0.0.1:5432")
    out = _run("--postgres", PG, "--schema", f"bench_list_{uuid.uuid4().hex[:8]}")
    assert len(_cases(out, "postgres")) == 18, out
