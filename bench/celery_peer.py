"""Celery + Redis as a peer of the end-to-end benchmark: what most people build for GPU work."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from workload import Timing

HERE = Path(__file__).resolve().parent


class CeleryPeer:
    """K prefork worker processes on Redis; clients use ``apply_async`` and ``get``."""

    name = "celery"

    def __init__(self, workers: int) -> None:
        import redis
        from celery_app import REDIS, app, noop

        self._app, self._noop = app, noop
        redis.Redis.from_url(REDIS).flushdb()
        env = {**os.environ, "PYTHONPATH": str(HERE)}
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "celery_app",
                "worker",
                "--pool=prefork",
                f"--concurrency={workers}",
                "--loglevel=WARNING",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ],
            cwd=HERE,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    "celery worker exited: " + self._proc.stderr.read().decode()[-2000:]
                )  # type: ignore[union-attr]
            replies = self._app.control.ping(timeout=0.5)
            if replies:
                return
        raise RuntimeError("celery worker did not come up within 60 s")

    def round_trip(self) -> Timing:
        submitted = time.time()
        started, _ = self._noop.apply_async().get(timeout=60)
        done = time.time()
        return Timing(started - submitted, done - submitted)

    def submit_all_then_wait(self, n: int) -> list[Timing]:
        submitted: list[tuple[float, object]] = []
        for _ in range(n):
            submitted.append((time.time(), self._noop.apply_async()))
        # One deadline for the whole collection, not 300 s per result: on a loaded machine
        # 20,000 results queue for minutes behind 4 workers. In-order gets measured faster
        # here than ResultSet.join_native (about 650 vs 480 jobs/s at 4,000), so Celery
        # keeps its faster path.
        deadline = time.monotonic() + 300 + n * 0.05
        timings = []
        for at, result in submitted:
            left = max(1.0, deadline - time.monotonic())
            started, _ = result.get(timeout=left)  # type: ignore[attr-defined]
            timings.append(Timing(started - at, time.time() - at))
        return timings

    def close(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
