"""Benchmark of the HTTP API: job submissions per second, single and batch, SQLite and PostgreSQL.

Usage: ``python bench/api.py [--jobs 3000] [--concurrency 16] [--batch-size 100] [--db both]``

Starts a real ``corral server`` process per database (SQLite in a temporary
directory; PostgreSQL on 127.0.0.1:5432 database ``test``, in a fresh schema
dropped afterwards), with no agents: jobs stay queued, so what is measured is
accepting work durably (every 201 is committed) while the scheduling loop runs.

* single: ``--concurrency`` clients, each posting one job per request;
* batch: the same number of jobs in ``POST /v1/jobs/batch`` requests of
  ``--batch-size`` jobs, ``--concurrency`` requests in flight.

Prints, per database::

    sqlite     single: N submissions/s (p50 X ms, p99 Y ms per request, J jobs)
    sqlite     batch:  N submissions/s (p50 X ms, p99 Y ms per request of B, J jobs)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "server"))
from pg_schema import drop_schema
from process_harness import ServerProcess

PG = "postgresql://postgres@127.0.0.1:5432/test"


@dataclass(frozen=True)
class Result:
    jobs: int
    seconds: float
    latencies_ms: list[float]

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def submit_single(url: str, token: str, jobs: int, concurrency: int) -> Result:
    """``jobs`` POST /v1/jobs requests from ``concurrency`` concurrent clients."""
    latencies: list[float] = []
    next_job = iter(range(jobs))
    limits = httpx.Limits(max_connections=concurrency)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as c:

        async def worker() -> None:
            for i in next_job:
                t0 = time.perf_counter()
                r = await c.post("/v1/jobs", json={"kind": "sample", "payload": {"i": i}})
                latencies.append((time.perf_counter() - t0) * 1000)
                if r.status_code != 201:
                    raise RuntimeError(f"submit failed: {r.status_code} {r.text[:200]}")

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return Result(jobs, time.perf_counter() - start, latencies)


async def submit_batches(
    url: str, token: str, jobs: int, concurrency: int, batch_size: int
) -> Result:
    """The same number of jobs in batches of ``batch_size``."""
    latencies: list[float] = []
    batches = iter(range(0, jobs, batch_size))
    limits = httpx.Limits(max_connections=concurrency)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=120) as c:

        async def worker() -> None:
            for first in batches:
                size = min(batch_size, jobs - first)
                jobs_in = [{"kind": "sample", "payload": {"i": first + k}} for k in range(size)]
                body = {"jobs": jobs_in}
                t0 = time.perf_counter()
                r = await c.post("/v1/jobs/batch", json=body)
                latencies.append((time.perf_counter() - t0) * 1000)
                if r.status_code != 201:
                    raise RuntimeError(f"batch failed: {r.status_code} {r.text[:200]}")

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return Result(jobs, time.perf_counter() - start, latencies)


def run_one(label: str, db: str, home: Path, args: argparse.Namespace) -> None:
    server = ServerProcess(db, home).start()
    try:
        token = server.admin_token or ""
        single = asyncio.run(submit_single(server.url, token, args.jobs, args.concurrency))
        print(
            f"{label:10} single: {single.rate:,.0f} submissions/s "
            f"(p50 {single.pct(0.5):.1f} ms, p99 {single.pct(0.99):.1f} ms per request, "
            f"{single.jobs} jobs)",
            flush=True,
        )
        batch = asyncio.run(
            submit_batches(server.url, token, args.jobs, args.concurrency, args.batch_size)
        )
        print(
            f"{label:10} batch:  {batch.rate:,.0f} submissions/s "
            f"(p50 {batch.pct(0.5):.1f} ms, p99 {batch.pct(0.99):.1f} ms per request of "
            f"{args.batch_size}, {batch.jobs} jobs)",
            flush=True,
        )
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3000, help="jobs per shape")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    parser.add_argument("--batch-size", type=int, default=100, help="jobs per batch request")
    parser.add_argument("--db", choices=("sqlite", "postgres", "both"), default="both")
    args = parser.parse_args(argv)
    os.environ.pop("CORRAL_ADMIN_TOKEN", None)
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        if args.db in ("sqlite", "both"):
            home = Path(tmp) / "sqlite"
            run_one("sqlite", str(home / "corral.db"), home, args)
        if args.db in ("postgres", "both"):
            schema = f"bench_{uuid.uuid4().hex[:10]}"
            try:
                run_one("postgresql", f"{PG}?schema={schema}", Path(tmp) / "pg", args)
            finally:
                drop_schema(schema)
    return 0


if __name__ == "__main__":
    sys.exit(main())
