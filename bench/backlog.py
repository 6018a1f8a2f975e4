"""How a deep backlog drains: does a server with 40,000 jobs waiting place each job as
cheaply as one with 2,000?

    python bench/backlog.py [--depths 2000,10000,40000] [--agents 4] [--postgres URL]

For each depth N, a fresh real server (SQLite, and PostgreSQL when ``--postgres`` is
given) and K real agents with no-op handlers (as ``e2e.py`` starts them): N jobs are
submitted in batches of 500 as fast as the server takes them, then every one is
awaited on the SSE stream. Prints, per depth, the drain rate (first submit to last
completion), the server's CPU per job, and its scheduling cycles (count, mean
length), then the rate and CPU per job of the deepest backlog against the shallowest,
measured in the same run::

    sqlite   depth  2,000:  1,100 jobs/s  server 0.80 ms CPU/job  cycles 20 x 60.0 ms
    ...
    sqlite   depth 40,000 / 2,000:  rate 0.85x  server CPU per job 1.10x
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from corral_peer import CorralPeer


def cycles(peer: CorralPeer) -> tuple[int, float]:
    """How many scheduling cycles the server ran, and their mean length (s)."""
    text = peer.metrics()
    count = total = 0.0
    for line in text.splitlines():
        if line.startswith("corral_schedule_cycle_seconds_count"):
            count = float(line.split()[-1])
        elif line.startswith("corral_schedule_cycle_seconds_sum"):
            total = float(line.split()[-1])
    return int(count), (total / count if count else 0.0)


def drain(depth: int, agents: int, db: str | None, label: str) -> tuple[float, float]:
    """One backlog on a fresh server: (jobs/s, server CPU ms per job); prints a line."""
    peer = CorralPeer(agents, db=db, label=label)
    try:
        cpu0, t0 = peer.cpu_s().get("server", 0.0), time.perf_counter()
        peer.submit_all_then_wait(depth)
        seconds = time.perf_counter() - t0
        cpu_ms = 1000 * (peer.cpu_s().get("server", 0.0) - cpu0) / depth
        count, mean = cycles(peer)
    finally:
        peer.close()
    rate = depth / seconds
    print(
        f"{label:8} depth {depth:>7,}: {rate:>7,.0f} jobs/s  server {cpu_ms:.2f} ms CPU/job"
        f"  cycles {count} x {1000 * mean:.1f} ms",
        flush=True,
    )
    return rate, cpu_ms


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    depths = sorted(int(d) for d in args.depths.split(","))
    stores: list[tuple[str, str | None]] = [("sqlite", None)]
    if args.postgres:
        stores.append(("postgres", args.postgres))
    for label, db in stores:
        figures = {d: drain(d, args.agents, db, label) for d in depths}
        (low_rate, low_cpu), (high_rate, high_cpu) = figures[depths[0]], figures[depths[-1]]
        # /proc counts CPU in clock ticks (10 ms): a tiny backlog may show none at all.
        cpu_ratio = f"{high_cpu / low_cpu:.2f}x" if low_cpu > 0 else "n/a (too little to count)"
        print(
            f"{label:8} depth {depths[-1]:,} / {depths[0]:,}:  rate {high_rate / low_rate:.2f}x"
            f"  server CPU per job {cpu_ratio}",
            flush=True,
        )
    return 0


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", default="2000,10000,40000", help="comma-separated")
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--postgres", default="", help="a PostgreSQL URL to drain on as well")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
