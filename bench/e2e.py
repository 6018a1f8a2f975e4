"""End-to-end: corral against Celery + Redis on this machine, in one run (issue 9).

    python bench/e2e.py [--jobs N] [--agents K] [--clients C] [--idle N] [--postgres URL]
                        [--rounds R] [--client stdlib|httpx]

Each system gets K worker processes doing no-op work and the same three
loads (see ``workload.py``): idle round trips, C concurrent clients, and
everything submitted in batches. corral runs on SQLite and on PostgreSQL.
Every system is started first; then each shape's jobs run in R parts, the
systems taking turns, so a machine whose speed drifts over the minutes of a
run weighs on all of them alike. Prints a table, the ratios corral/Celery,
and on a line of its own ``throughput ratio corral/celery: X.XX`` (the
concurrent shape on SQLite).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import busy
from corral_peer import CLIENTS, CorralPeer
from workload import Figures, Peer, median, round_ratios, run_interleaved

PG = "postgresql://postgres@127.0.0.1:5432/test?schema=bench_e2e"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--idle", type=int, default=200, help="sequential round trips")
    ap.add_argument("--postgres", default=PG, help="PostgreSQL URL, or 'none' to skip")
    ap.add_argument("--skip-celery", action="store_true")
    ap.add_argument(
        "--sqlite-sync",
        default="",
        choices=("", "FULL", "NORMAL"),
        help="the server's SQLite synchronous (default FULL: an accepted job survives power "
        "loss; NORMAL: it survives kill -9 of the server, not a power loss)",
    )
    ap.add_argument(
        "--server-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting for corral's server, e.g. CORRAL_SCHEDULING__DEBOUNCE_S=0.002 (A/B runs)",
    )
    ap.add_argument(
        "--client",
        default="stdlib",
        choices=CLIENTS,
        help="the HTTP client corral's load generator uses: the standard library's "
        "http.client (default; see plain_http.py) or httpx (what the SDK uses)",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="each shape's jobs run in this many parts, system after system in turn, so a "
        "machine whose speed drifts weighs on every system alike (1: one system after another)",
    )
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    server_env = dict(kv.split("=", 1) for kv in args.server_env)
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731

    results: dict[str, list[Figures]]
    systems: list[tuple[str, Callable[[], Peer]]] = [
        (
            "corral/sqlite",
            lambda: CorralPeer(
                args.agents, None, "corral/sqlite", args.sqlite_sync, server_env, args.client
            ),
        )
    ]
    if args.postgres != "none":
        systems.append(
            (
                "corral/postgres",
                lambda: CorralPeer(
                    args.agents,
                    args.postgres,
                    "corral/postgres",
                    server_env=server_env,
                    client=args.client,
                ),
            )
        )
    if not args.skip_celery:
        from celery_peer import CeleryPeer

        systems.append(("celery", lambda: CeleryPeer(args.agents)))
    warnings = [busy.warning("before", busy.sample())]
    for line in filter(None, warnings):
        log(line)
    peers: list[Peer] = []
    try:
        for label, make in systems:
            log(f"starting {label} with {args.agents} workers ...")
            peers.append(make())
        results = run_interleaved(peers, args.jobs, args.clients, args.idle, args.rounds, log)
    finally:
        for peer in peers:
            peer.close()  # type: ignore[attr-defined]
    warnings.append(busy.warning("after", busy.sample()))
    report(results, args)
    for line in filter(None, warnings):  # where the ratio is read, not only at the start
        print(line)
    return 0


def report(results: dict[str, list[Figures]], args: argparse.Namespace) -> None:
    print(
        f"\nend to end: {args.jobs} no-op jobs, {args.agents} workers, {args.clients} clients "
        f"(corral's HTTP client: {args.client}; {args.rounds} rounds, systems in turn)\n"
    )
    cols = ("jobs/s", "start p50", "start p99", "done p50", "done p99")
    head = f"{'system':16} {'shape':11} " + " ".join(f"{c:>10}" for c in cols)
    print(head + "\n" + "-" * len(head))
    for label, figs in results.items():
        for f in figs:
            ms = (f.start_p50_ms, f.start_p99_ms, f.done_p50_ms, f.done_p99_ms)
            cells = [f"{f.jobs_per_s:10.0f}", *(f"{m:8.1f}ms" for m in ms)]
            print(f"{label:16} {f.shape:11} " + " ".join(cells))
    celery = {f.shape: f for f in results.get("celery", [])}
    if not celery:
        return
    print()
    for label, figs in results.items():
        for f in figs if label != "celery" else ():
            c = celery[f.shape]
            thr, done = f.jobs_per_s / c.jobs_per_s, f.done_p50_ms / c.done_p50_ms
            start = f.start_p50_ms / c.start_p50_ms
            print(f"ratio {label}/celery {f.shape:11} throughput {thr:5.2f}  ", end="")
            print(f"done p50 {done:5.2f}  start p50 {start:5.2f}")
    ours = {f.shape: f for f in results["corral/sqlite"]}
    ratio = ours["concurrent"].jobs_per_s / celery["concurrent"].jobs_per_s
    print(f"\nthroughput ratio corral/celery: {ratio:.2f}")
    corral_ms, celery_ms = ours["idle"].done_p50_ms, celery["idle"].done_p50_ms
    print(
        f"idle submit->completion p50: corral {corral_ms:.2f} ms, celery {celery_ms:.2f} ms"
        f" ({corral_ms / celery_ms:.2f}x)"
    )
    per_round = round_ratios(ours["concurrent"], celery["concurrent"])
    if len(per_round) > 1:  # how much the machine moved the figures during the run
        listed = " ".join(f"{r:.2f}" for r in per_round)
        print(f"  concurrent ratio by round: {listed} (median {median(per_round):.2f})")
        idle_rounds = zip(ours["idle"].parts, celery["idle"].parts, strict=False)
        listed = " ".join(f"{a.done_p50_ms:.2f}/{b.done_p50_ms:.2f}" for a, b in idle_rounds)
        print(f"  idle p50 by round, corral/celery ms: {listed}")


if __name__ == "__main__":
    sys.exit(main())
