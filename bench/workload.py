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

import dataclasses
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
    timings: tuple[Timing, ...] = ()  # what they were computed from
    parts: tuple[Figures, ...] = ()  # the rounds these were joined from (run_interleaved)

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
        tuple(timings),
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


def run_interleaved(
    peers: Sequence[Peer],
    n: int,
    clients: int,
    idle_n: int,
    rounds: int,
    log: Callable[[str], None],
) -> dict[str, list[Figures]]:
    """Every shape on every peer, each shape's jobs split into ``rounds`` parts run peer after
    peer in turn: a machine whose speed drifts over minutes (shared hosts, turbo, other work)
    then weighs on every peer alike instead of on whichever ran in its slow spell. A shape's
    figures join its parts (their timings, and their seconds added up)."""
    out: dict[str, list[Figures]] = {p.name: [] for p in peers}
    for shape in ("idle", "concurrent", "batch"):
        parts: dict[str, list[Figures]] = {p.name: [] for p in peers}
        used: dict[str, dict[str, float]] = {p.name: {} for p in peers}
        total = idle_n if shape == "idle" else n
        for r in range(rounds):
            size = total // rounds + (1 if r < total % rounds else 0)
            for peer in peers:
                log(f"{peer.name}: {shape} ({r + 1}/{rounds}) ...")
                cpu = getattr(peer, "cpu_s", dict)
                before = cpu()
                parts[peer.name].append(_shape(peer, shape, size, clients))
                for k, v in cpu().items():
                    used[peer.name][k] = used[peer.name].get(k, 0.0) + v - before[k]
        for peer in peers:
            joined = join(shape, parts[peer.name])
            costs = "".join(
                f", {k} {s * 1000 / joined.jobs:.1f} ms CPU/job" for k, s in used[peer.name].items()
            )
            log(f"{peer.name}: {shape}: {joined.jobs_per_s:,.0f} jobs/s{costs}")
            out[peer.name].append(joined)
    return out


def _shape(peer: Peer, shape: str, size: int, clients: int) -> Figures:
    if shape == "idle":
        return idle(peer, size)
    if shape == "concurrent":
        return concurrent(peer, size, clients)
    return batch(peer, size)


def join(shape: str, parts: Sequence[Figures]) -> Figures:
    """Figures of ``parts`` taken together: jobs and seconds added, percentiles over all;
    the parts kept (``Figures.parts``) for per-round comparisons."""
    if len(parts) == 1:
        return parts[0]
    timings = [t for p in parts for t in p.timings]
    joined = figures(shape, timings, sum(p.seconds for p in parts))
    return dataclasses.replace(joined, parts=tuple(parts))


def round_ratios(ours: Figures, theirs: Figures) -> list[float]:
    """Throughput ratio ours/theirs of each round: the two ran one after the other in it, so
    a slow spell of the machine weighs on both (empty unless both were run in rounds)."""
    return [
        a.jobs_per_s / b.jobs_per_s
        for a, b in zip(ours.parts, theirs.parts, strict=False)
        if b.jobs_per_s
    ]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")
