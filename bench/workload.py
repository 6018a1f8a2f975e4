"""The end-to-end workload shared by every system `bench/e2e.py` measures.

A *peer* (corral, Celery + Redis) only has to submit a no-op job and wait for
it; this module drives the same three shapes of load against each and turns
the timestamps into the figures printed side by side:

* ``idle``: one client, one job at a time: the round trip of a quiet system;
* ``concurrent``: C clients, each submitting one job and waiting for it;
* ``batch``: every job submitted up front (in batches where the peer can),
  then all awaited.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Timing:
    """One job as its client saw it: seconds from submit to start and to done."""

    to_start: float
    to_done: float


class Peer(Protocol):
    name: str

    def round_trip(self) -> Timing:
        """Submit one no-op job and wait until its result is visible."""
        ...

    def submit_all_then_wait(self, n: int) -> list[Timing]:
        """Submit ``n`` jobs as fast as the peer allows (batches if it can), wait for all."""
        ...


@dataclass(frozen=True)
class Figures:
    shape: str
    jobs: int
    seconds: float
    start_p50_ms: float
    start_p99_ms: float
    done_p50_ms: float
    done_p99_ms: float

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds if self.seconds else 0.0


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def figures(shape: str, timings: Sequence[Timing], seconds: float) -> Figures:
    starts = [t.to_start * 1000 for t in timings]
    dones = [t.to_done * 1000 for t in timings]
    return Figures(
        shape,
        len(timings),
        seconds,
        percentile(starts, 0.5),
        percentile(starts, 0.99),
        percentile(dones, 0.5),
        percentile(dones, 0.99),
    )


def idle(peer: Peer, n: int) -> Figures:
    """``n`` sequential round trips on an otherwise quiet system."""
    peer.round_trip()  # warm connections and imports
    t0 = time.perf_counter()
    timings = [peer.round_trip() for _ in range(n)]
    return figures("idle", timings, time.perf_counter() - t0)


def concurrent(peer: Peer, n: int, clients: int) -> Figures:
    """``clients`` threads, each submitting one job and waiting for it, ``n`` jobs in all."""
    per_client = [n // clients + (1 if i < n % clients else 0) for i in range(clients)]

    def client(count: int) -> list[Timing]:
        return [peer.round_trip() for _ in range(count)]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(client, per_client))
    seconds = time.perf_counter() - t0
    return figures("concurrent", [t for r in results for t in r], seconds)


def batch(peer: Peer, n: int) -> Figures:
    t0 = time.perf_counter()
    timings = peer.submit_all_then_wait(n)
    return figures("batch", timings, time.perf_counter() - t0)


def run_all(
    peer: Peer, n: int, clients: int, idle_n: int, log: Callable[[str], None]
) -> list[Figures]:
    out = []
    for label, run in (
        ("idle", lambda: idle(peer, idle_n)),
        ("concurrent", lambda: concurrent(peer, n, clients)),
        ("batch", lambda: batch(peer, n)),
    ):
        log(f"{peer.name}: {label} ...")
        cpu = getattr(peer, "cpu_s", dict)
        before = cpu()
        out.append(run())
        used = {k: (v - before[k]) * 1000 / out[-1].jobs for k, v in cpu().items()}
        costs = "".join(f", {k} {ms:.1f} ms CPU/job" for k, ms in used.items())
        log(f"{peer.name}: {label}: {out[-1].jobs_per_s:,.0f} jobs/s{costs}")
    return out


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")
