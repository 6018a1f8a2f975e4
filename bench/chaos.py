"""Chaos harness (issue 8): nothing lost while agents, connections and servers die.

Usage::

    python bench/chaos.py [--jobs 10000] [--agents 10] [--replicas 2] [--db postgres]
                          [--kill-every 8] [--drop-every 6] [--leader-kills 2] [--seed 1]

Real processes on this machine: ``--replicas`` ``corral server`` processes on
one PostgreSQL schema (or one server on SQLite: ``--db sqlite``), sharing a
blob directory; ``--agents`` ``corral agent`` processes (fake GPUs, the
``chaos_work`` handler: short sample jobs, and train jobs that checkpoint),
each dialling every replica through its own small TCP proxy. A client
submits ``--jobs`` jobs of mixed priorities and teams in batches (each with
an Idempotency-Key, retried on another replica when one dies) and follows
``/v1/events`` (resumed with Last-Event-ID). Meanwhile:

* every ``--kill-every`` s, ``kill -9`` a random 30% of the agents; they are
  started again ``--restart-after`` s later (same name, same disk);
* every ``--drop-every`` s, ``kill -9`` a random 30% of the proxies (the
  agents' connections drop, the agents live on); back ``--drop-for`` s later;
* ``--leader-kills`` times, ``kill -9`` the replica running the scheduling
  loop and time how long until another one runs it; restart it.

Then chaos stops, everything is brought back, and the harness waits for the
pile to drain and audits it. Each figure on its own line, ``name: value``::

    jobs submitted: 10000
    completed: 10000
    lost: 0
    completed twice: 0
    ...

Exit status 1 when a job is lost, completed twice, or has another job's result.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from chaos_client import (
    Client,
    Ledger,
    all_jobs,
    follow,
    submit_all,
    succeeded_events,
    workload,
    wrong_results,
)
from chaos_cluster import ADMIN, Cluster, Proc, Replica, leading, wait_healthy


@dataclass
class Chaos:
    """What the monkey did."""

    agent_kills: int = 0
    drops: int = 0
    leader_kills: int = 0
    failovers: list[float] = field(default_factory=list)
    pending: set[asyncio.Task[None]] = field(default_factory=set)

    def later(self, delay: float, proc: Proc) -> None:
        async def restart() -> None:
            await asyncio.sleep(delay)
            if not proc.alive:
                proc.start()

        task = asyncio.create_task(restart())
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--agents", type=int, default=10)
    p.add_argument("--gpus", type=int, default=2, help="fake GPUs per agent")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    p.add_argument("--batch", type=int, default=100, help="jobs per submission")
    p.add_argument("--backlog", type=int, default=300, help="most unfinished jobs at a time")
    p.add_argument("--train-share", type=float, default=0.1, help="share of checkpointing jobs")
    p.add_argument("--kill-every", type=float, default=8.0)
    p.add_argument("--kill-share", type=float, default=0.3)
    p.add_argument("--restart-after", type=float, default=1.0)
    p.add_argument("--drop-every", type=float, default=6.0)
    p.add_argument("--drop-for", type=float, default=2.0)
    p.add_argument(
        "--chaos-until", type=float, default=0.9, help="stop the chaos when this share is done"
    )
    p.add_argument("--leader-kills", type=int, default=2)
    p.add_argument("--leader-down", type=float, default=3.0, help="seconds before its restart")
    p.add_argument("--node-timeout", type=float, default=5.0)
    p.add_argument("--drain-timeout", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    args = p.parse_args(argv)
    if args.db == "sqlite" and args.replicas != 1:
        p.error("SQLite serves one server process: use --replicas 1, or --db postgres")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    tmp = Path(tempfile.mkdtemp(prefix="corral-chaos-"))
    cluster = Cluster.create(tmp, postgres=args.db == "postgres")
    cluster.add_replicas(args.replicas, args.node_timeout)
    cluster.add_agents(args.agents, args.gpus, tmp / "ledger")
    if args.keep:
        print(f"logs and state in {tmp}", file=sys.stderr)
    try:
        figures = asyncio.run(run(args, cluster, tmp))
    except BaseException:
        print(cluster.logs(), file=sys.stderr)
        raise
    finally:
        cluster.stop()
        if not args.keep:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    for name, value in figures.items():
        print(f"{name}: {value}", flush=True)
    bad = figures["lost"] or figures["completed twice"] or figures["wrong results"]
    return 1 if bad else 0


async def run(args: argparse.Namespace, cluster: Cluster, tmp: Path) -> dict[str, object]:
    await cluster.start()
    client = Client([r.http for r in cluster.replicas], ADMIN)
    ledger, chaos = Ledger(), Chaos()
    jobs = workload(args.jobs, args.seed, args.train_share)
    stop_following = asyncio.Event()
    started = time.monotonic()
    follower = asyncio.create_task(follow(client, ledger, stop_following))
    monkey = asyncio.create_task(unleash(args, cluster, ledger, chaos))
    reporter = asyncio.create_task(report_progress(args, ledger, chaos, started))
    run_id = f"chaos-{random.Random(args.seed).getrandbits(32):08x}-{int(time.time())}"
    try:
        await submit_all(client, jobs, ledger, run=run_id, batch=args.batch, backlog=args.backlog)
        await monkey  # it stops at --chaos-until, and brings everything back
        calm_at = time.monotonic()
        await drain(ledger, args.drain_timeout)
        drained_at = time.monotonic()
        stop_following.set()
        figures = await audit(client, ledger, tmp / "ledger")
    finally:
        for task in (follower, monkey, reporter):
            task.cancel()
        await client.close()
    return _figures(figures, chaos, client, started, calm_at, drained_at)


async def unleash(args: argparse.Namespace, cluster: Cluster, ledger: Ledger, chaos: Chaos) -> None:
    """Kill agents, cut connections and kill the leader until ``--chaos-until`` of the jobs
    are done (the leader kills evenly spread over that); then restore everything."""
    rng = random.Random(args.seed)
    until = args.chaos_until * args.jobs
    marks = [until * (i + 1) / (args.leader_kills + 1) for i in range(args.leader_kills)]
    now = time.monotonic()
    next_kill, next_drop = now + args.kill_every, now + args.drop_every
    seen, moved = 0, now
    async with httpx.AsyncClient() as http:
        while len(ledger.finished) < until or marks:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            if len(ledger.finished) != seen:
                seen, moved = len(ledger.finished), now
            elif now - moved > args.drain_timeout:
                print("chaos: no job finished for too long; stopping", file=sys.stderr)
                break
            if marks and len(ledger.finished) >= marks[0]:
                marks.pop(0)
                chaos.failovers.append(await kill_leader(http, cluster, args, chaos))
            if now >= next_kill:
                next_kill = now + args.kill_every
                for agent in sample(rng, cluster.agents, args.kill_share):
                    agent.kill9()
                    chaos.agent_kills += 1
                    chaos.later(args.restart_after, agent)
            if now >= next_drop:
                next_drop = now + args.drop_every
                for proxy in sample(rng, cluster.proxies, args.kill_share):
                    proxy.kill9()
                    chaos.drops += 1
                    chaos.later(args.drop_for, proxy)
    await restore(cluster, chaos)


def sample(rng: random.Random, procs: list[Proc], share: float) -> list[Proc]:
    alive = [p for p in procs if p.alive]
    return rng.sample(alive, min(len(alive), max(1, round(share * len(procs)))))


async def kill_leader(
    http: httpx.AsyncClient, cluster: Cluster, args: argparse.Namespace, chaos: Chaos
) -> float:
    """Kill -9 the replica that leads; seconds until a replica leads again. Restarts it."""
    leader = await find_leader(http, cluster.replicas, timeout=30)
    leader.proc.kill9()
    chaos.leader_kills += 1
    killed = time.monotonic()
    others = [r for r in cluster.replicas if r is not leader]
    if not others:  # one server: its own restart is the failover
        await asyncio.sleep(args.leader_down)
        leader.proc.start()
        await wait_healthy(leader, 60)
        await find_leader(http, [leader], timeout=60)
        return time.monotonic() - killed
    await find_leader(http, others, timeout=60)
    failover = time.monotonic() - killed
    await asyncio.sleep(max(0.0, args.leader_down - failover))
    leader.proc.start()
    await wait_healthy(leader, 60)
    return failover


async def find_leader(http: httpx.AsyncClient, replicas: list[Replica], timeout: float) -> Replica:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in replicas:
            if await leading(http, r):
                return r
        await asyncio.sleep(0.05)
    raise RuntimeError("no replica took over the scheduling loop")


async def restore(cluster: Cluster, chaos: Chaos) -> None:
    """Wait for the pending restarts, then start anything still down."""
    if chaos.pending:
        await asyncio.gather(*chaos.pending, return_exceptions=True)
    for r in cluster.replicas:
        if not r.proc.alive:
            r.proc.start()
            await wait_healthy(r, 60)
    for proc in [*cluster.proxies, *cluster.agents]:
        if not proc.alive:
            proc.start()


async def drain(ledger: Ledger, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(ledger.finished & set(ledger.by_key.values())) < len(ledger.by_key):
        if time.monotonic() > deadline:
            print(f"drain: gave up after {timeout:.0f}s", file=sys.stderr)
            return
        await asyncio.sleep(0.1)


async def report_progress(
    args: argparse.Namespace, ledger: Ledger, chaos: Chaos, started: float
) -> None:
    while True:
        await asyncio.sleep(10)
        print(
            f"[{time.monotonic() - started:5.0f}s] submitted {len(ledger.by_key)}/{args.jobs}, "
            f"finished {len(ledger.finished)}; agent kills {chaos.agent_kills}, "
            f"connection drops {chaos.drops}, leader kills {chaos.leader_kills}",
            file=sys.stderr,
            flush=True,
        )


async def audit(client: Client, ledger: Ledger, ledger_file: Path) -> dict[str, object]:
    """The end state, from the servers' side, against what the client was promised."""
    jobs = await all_jobs(client)
    mine = {job_id: key for key, job_id in ledger.by_key.items()}
    by_id = {j["id"]: j for j in jobs if j["id"] in mine}
    states = Counter(j["state"] for j in by_id.values())
    twice = {i for i, n in (await succeeded_events(client)).items() if n > 1}
    twice |= {i for i, n in ledger.succeeded_seen.items() if n > 1}
    extra = [j for j in jobs if j["id"] not in mine]  # a retried batch made new jobs?
    twice |= {j["id"] for j in extra if j["state"] == "succeeded"}
    for j in by_id.values():  # say why, for anything that did not succeed
        if j["state"] != "succeeded":
            print(f"not succeeded: {mine[j['id']]} {j['id']} {j['state']} attempt {j['attempt']}: "
                  f"{j.get('error')} {j.get('attempts')}", file=sys.stderr)  # fmt: skip
    executed = Counter(line.split()[0] for line in ledger_file.read_text().splitlines())
    work = sum(ledger.steps.values())
    redone = sum(max(0, executed[k] - n) for k, n in ledger.steps.items())
    return {
        "jobs submitted": len(ledger.by_key),
        "completed": states["succeeded"],
        "lost": len(ledger.by_key) - states["succeeded"] - states["failed"] - states["cancelled"],
        "completed twice": len(twice),
        "failed": states["failed"] + states["cancelled"],
        "wrong results": await wrong_results(client, list(by_id.values()), mine),
        "duplicate jobs": len(extra),
        "total attempts": sum(j["attempt"] for j in by_id.values()),
        "jobs resumed from a checkpoint": sum(
            1 for j in by_id.values() if j.get("resumed_from_step")
        ),
        "work redone after resumes": f"{redone / max(1, work):.1%} ({redone} of {work} steps)",
    }


def _figures(
    figures: dict[str, object],
    chaos: Chaos,
    client: Client,
    started: float,
    calm_at: float,
    drained_at: float,
) -> dict[str, object]:
    failovers = ", ".join(f"{s:.2f} s" for s in chaos.failovers) or "none"
    return figures | {
        "leader failover times": failovers,
        "time to drain": f"{drained_at - calm_at:.1f} s",
        "wall time": f"{drained_at - started:.1f} s",
        "agent kills": chaos.agent_kills,
        "connection drops": chaos.drops,
        "leader kills": chaos.leader_kills,
        "client requests retried": client.retries,
    }


if __name__ == "__main__":
    sys.exit(main())
