"""Where an idle round trip's time goes, step by step (issue 9's idle latency).

    python bench/e2e_steps.py [--jobs N] [--agents K] [--db POSTGRES_URL]
    python bench/e2e_steps.py --concurrent N [--clients C] [--agents K] [--db POSTGRES_URL]

Starts a real server and K agents as ``bench/e2e.py`` does, with
``bench/stamps`` on their ``PYTHONPATH``: each step of a job (the submission,
its group commit, fsyncs, the scheduling cycle, the assignment, the agent
reading it and writing its updates, the events published and framed for SSE)
writes a time stamp. Then N jobs run one at a time, and for each step this
prints the median time from the client's submit to that step's first stamp
within the job's round trip, ending with the client seeing it done.

``--timeline K`` also prints K whole round trips (those nearest the median
length) as timelines: every stamp, and every callback the server's event loop
ran with how long it took (``bench/stamps``, ``BENCH_LOOP_TRACE``). The server
then runs on asyncio's own loop, slowed by the tracing: the order of what
runs, and what waits behind what, is what a timeline shows, not uvloop's times.

``--concurrent N`` measures the concurrent shape instead (C clients, each
submitting a job and waiting for it, as ``bench/e2e.py`` runs it; 4 agents
unless ``--agents`` says otherwise), with nothing stamped inside the
processes: each job's round trip is cut into stages by the client's clock
(its submit, the submission's answer, the end seen) and the times of the
job's events in the server's log (``GET /v1/events/export``; an event's time
is when its transaction began). Printed per stage: p50 and p90 over the jobs,
so the stages' p50s need not add up to the whole.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from corral_peer import CorralPeer

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=200, help="idle round trips stamped")
    ap.add_argument("--agents", type=int, default=1)
    ap.add_argument("--db", default=None, help="a PostgreSQL URL (default: SQLite in a temp dir)")
    ap.add_argument(
        "--timeline", type=int, default=0, metavar="K", help="print K round trips in full"
    )
    ap.add_argument(
        "--concurrent", type=int, default=0, metavar="N", help="cut N concurrent trips into stages"
    )
    ap.add_argument("--clients", type=int, default=16, help="clients of --concurrent")
    args = ap.parse_args(argv)
    if args.concurrent:
        agents = args.agents if "--agents" in (argv if argv is not None else sys.argv) else 4
        return concurrent_stages(args.concurrent, args.clients, agents, args.db)
    with tempfile.TemporaryDirectory(prefix="corral-steps-") as tmp:
        prefix = str(Path(tmp) / "stamps")
        os.environ["BENCH_STAMPS"] = prefix
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, (str(HERE / "stamps"), os.environ.get("PYTHONPATH")))
        )
        server_env = {}
        if args.timeline:
            os.environ["BENCH_LOOP_TRACE"] = "1"
            server_env["CORRAL_EVENT_LOOP"] = "asyncio"  # uvloop's callbacks cannot be traced
        print(f"starting a server and {args.agents} agent(s) ...", file=sys.stderr, flush=True)
        label = "corral/postgres" if args.db else "corral/sqlite"
        peer = CorralPeer(args.agents, args.db, label, server_env=server_env)
        try:
            for _ in range(20):  # warm connections, imports and the first cycles
                peer.round_trip()
            trips = []
            for i in range(args.jobs):
                submitted = time.time()
                peer.round_trip()
                trips.append((submitted, time.time()))
                if (i + 1) % 50 == 0:
                    print(f"  {i + 1}/{args.jobs} jobs", file=sys.stderr, flush=True)
        finally:
            peer.close()
        stamps = sorted(
            (float(at), step.strip())
            for f in Path(tmp).glob("stamps.*")
            for at, step in (line.split(" ", 1) for line in f.read_text().splitlines())
        )
    report(offsets([s for s in stamps if not s[1].startswith("loop ")], trips), args.jobs)
    if args.timeline:
        timelines(stamps, trips, args.timeline)
    return 0


# A concurrent trip's stages: (name, from, to), each point a client time or an event's.
STAGES = (
    ("client: POST -> the submission's transaction", "submit", "job.submitted"),
    ("server: submission -> placement", "job.submitted", "job.placed"),
    ("placement -> the agent's end handled", "job.placed", "job.succeeded"),
    ("the end -> the client saw it", "job.succeeded", "done"),
    ("client: POST -> its answer (201)", "submit", "answered"),
    ("client: the whole round trip", "submit", "done"),
)


def concurrent_stages(n: int, clients: int, agents: int, db: str | None) -> int:
    """Run ``n`` jobs with ``clients`` concurrent clients and print where their time went."""
    print(f"starting a server and {agents} agent(s) ...", file=sys.stderr, flush=True)
    peer = CorralPeer(agents, db, "corral/postgres" if db else "corral/sqlite")
    try:
        warm = max(clients, min(n, 400))  # connections, imports, the first cycles
        trips(peer, warm, clients)
        print(f"running {n} jobs with {clients} clients ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        stamped = trips(peer, n, clients)
        seconds = time.perf_counter() - started
        log = peer.events()
    finally:
        peer.close()
    points = {job_id: {"submit": s, "answered": a, "done": d} for job_id, s, a, d in stamped}
    for event in log:
        job = points.get(event.get("job_id") or "")
        if job is not None:
            job.setdefault(event["kind"], event["at"])
    shape = f"{n} jobs, {clients} clients, {agents} agents"
    print(f"\nconcurrent round trips, stage by stage ({shape})")
    print(f"{n / seconds:,.0f} jobs/s; ms from the client's clock and the events' times\n")
    print(f"{'stage':46} {'p50':>8} {'p90':>8} {'jobs':>6}")
    for name, start, end in STAGES:
        ms = sorted((p[end] - p[start]) * 1000 for p in points.values() if start in p and end in p)
        if ms:
            p90 = ms[min(len(ms) - 1, int(0.9 * len(ms)))]
            print(f"{name:46} {statistics.median(ms):8.2f} {p90:8.2f} {len(ms):6d}")
    return 0


def trips(peer: CorralPeer, n: int, clients: int) -> list[tuple[str, float, float, float]]:
    """``n`` stamped round trips from ``clients`` threads, each one job at a time."""
    per_client = [n // clients + (1 if i < n % clients else 0) for i in range(clients)]
    with ThreadPoolExecutor(clients) as pool:
        done = pool.map(lambda count: [peer.stamped_trip() for _ in range(count)], per_client)
        return [trip for client in done for trip in client]


def offsets(
    stamps: list[tuple[float, str]], trips: list[tuple[float, float]]
) -> dict[str, list[float]]:
    """Per step, the ms from each trip's submit to the step's stamps inside that trip: the
    first under the step's name, a later one of the same step as ``step (2)``, ``(3)`` ..."""
    out: dict[str, list[float]] = defaultdict(list)
    i = 0
    for submitted, done in trips:
        while i < len(stamps) and stamps[i][0] < submitted:
            i += 1
        seen: dict[str, int] = defaultdict(int)
        j = i
        while j < len(stamps) and stamps[j][0] <= done:
            at, step = stamps[j]
            seen[step] += 1
            name = step if seen[step] == 1 else f"{step} ({seen[step]})"
            out[name].append((at - submitted) * 1000)
            j += 1
        out["client: saw it done"].append((done - submitted) * 1000)
    return out


def timelines(stamps: list[tuple[float, str]], trips: list[tuple[float, float]], k: int) -> None:
    """The ``k`` trips nearest the median length, every stamp and loop callback in each."""
    median = statistics.median(done - submitted for submitted, done in trips)
    chosen = sorted(trips, key=lambda t: abs(t[1] - t[0] - median))[:k]
    for submitted, done in sorted(chosen):
        print(f"\nround trip of {(done - submitted) * 1000:.2f} ms (ms from the submit; loop")
        print("lines: loop <pid> <callback> <ms it ran>)")
        for at, step in stamps:
            if submitted <= at <= done:
                print(f"{(at - submitted) * 1000:8.3f}  {step}")


def report(steps: dict[str, list[float]], jobs: int) -> None:
    print(f"\nidle round trip, step by step ({jobs} jobs; ms from the client's submit)\n")
    print(f"{'step':40} {'p50':>8} {'p90':>8} {'jobs':>6}")
    for step, ms in sorted(steps.items(), key=lambda kv: statistics.median(kv[1])):
        ordered = sorted(ms)
        p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
        print(f"{step:40} {statistics.median(ms):8.2f} {p90:8.2f} {len(ms):6d}")


if __name__ == "__main__":
    sys.exit(main())
