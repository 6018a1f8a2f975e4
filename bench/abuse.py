"""The server under attack: resource attacks at full size while well-behaved clients work.

Usage: ``python bench/abuse.py [--db sqlite|postgres] [--scale 1.0] [--seconds 20]
[--attacks uploads,options,sse,flood,slow]``

Starts a real ``corral server`` process (SQLite in a temporary directory, or
PostgreSQL on 127.0.0.1:5432 database ``test`` in a fresh schema), makes a
leaked team token, a leaked agent token and a well-behaved team's token, then
runs each attack of issue 45 in turn (``bench/abuse_attacks.py``: unfinished
uploads, 3.5 MB A1111 options, SSE streams replaying history, a submission
flood, slow headers and bodies) at the size reported there times ``--scale``,
for at most ``--seconds`` each, from the attacker's own address (127.0.0.2; the
uploads from 127.0.0.1). Meanwhile a well-behaved client polls
``/healthz`` every 20 ms and another team submits and reads a job every
200 ms. A first phase with no attack measures the same clients as the peer.

Prints a line per phase, then::

    healthz p99 idle: X ms
    healthz p99 under attack: X ms (Nx idle; goal under 50 ms)
    5xx to well-behaved clients: N (goal 0); transport errors: N
    server peak descriptors: N, peak RSS: N MB (idle: N, N MB)

All traffic stays on loopback; every loop is bounded in count and time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import resource
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "server"))
from abuse_attacks import ATTACKS, Target
from pg_schema import drop_schema
from process_harness import ServerProcess

PG = "postgresql://postgres@127.0.0.1:5432/test"
_AGENTS = re.compile(r"--server \w+://(\S+)")


@dataclass
class Phase:
    """What the well-behaved clients and the sampler saw during one phase."""

    healthz_ms: list[float] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)
    peak_fds: int = 0
    peak_rss_mb: float = 0.0

    def p99(self) -> float:
        ordered = sorted(self.healthz_ms)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0

    @property
    def server_errors(self) -> int:
        return sum(n for code, n in self.statuses.items() if code.startswith("5"))

    @property
    def transport_errors(self) -> int:
        return sum(n for code, n in self.statuses.items() if not code[:1].isdigit())


async def run_phase(
    name: str, target: Target, good_token: str, pid: int, count: int, seconds: float
) -> Phase:
    """Run one attack (or none, for ``idle``) while the well-behaved clients and the
    sampler run; stop them when the attack has finished or its time is up."""
    phase = Phase()
    deadline = time.monotonic() + seconds
    stop = asyncio.Event()
    watchers = [
        asyncio.create_task(_healthz(target.url, phase, stop)),
        asyncio.create_task(_good_team(target.url, good_token, phase, stop)),
        asyncio.create_task(_sample(pid, phase, stop)),
    ]
    started = time.monotonic()
    if name == "idle":
        await asyncio.sleep(seconds)
        outcome: Counter[str] = Counter()
    else:
        attack, _ = ATTACKS[name]
        outcome = await attack(target, count, deadline)
    took = time.monotonic() - started
    stop.set()
    await asyncio.gather(*watchers)
    shown = ", ".join(f"{k} {v}" for k, v in sorted(outcome.items())) or "-"
    print(
        f"{name:8} {count:>6} in {took:5.1f} s [{shown}]; healthz p99 {phase.p99():.1f} ms; "
        f"5xx {phase.server_errors}, transport errors {phase.transport_errors}; "
        f"descriptors {phase.peak_fds}, RSS {phase.peak_rss_mb:.0f} MB",
        flush=True,
    )
    return phase


async def _healthz(url: str, phase: Phase, stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                r = await client.get("/healthz")
                phase.statuses[str(r.status_code)] += 1
            except httpx.HTTPError as exc:
                phase.statuses[type(exc).__name__] += 1
            phase.healthz_ms.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(0.02)


async def _good_team(url: str, token: str, phase: Phase, stop: asyncio.Event) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=10) as client:
        while not stop.is_set():
            try:
                r = await client.post("/v1/jobs", json={"kind": "sample", "payload": {}})
                phase.statuses[str(r.status_code)] += 1
                if r.status_code == 201:
                    got = await client.get(f"/v1/jobs/{r.json()['id']}")
                    phase.statuses[str(got.status_code)] += 1
            except httpx.HTTPError as exc:
                phase.statuses[type(exc).__name__] += 1
            await asyncio.sleep(0.2)


async def _sample(pid: int, phase: Phase, stop: asyncio.Event) -> None:
    """The server's open descriptors and resident memory, ten times a second."""
    while not stop.is_set():
        try:
            phase.peak_fds = max(phase.peak_fds, len(os.listdir(f"/proc/{pid}/fd")))
            status = Path(f"/proc/{pid}/status").read_text()
            rss_kb = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
            phase.peak_rss_mb = max(phase.peak_rss_mb, rss_kb / 1024)
        except (OSError, AttributeError):
            pass
        await asyncio.sleep(0.1)


def _tokens(url: str, admin: str) -> tuple[str, str, str]:
    """A leaked team token, a leaked agent token and a well-behaved team's token."""
    headers = {"Authorization": f"Bearer {admin}"}
    made = []
    for body in (
        {"kind": "team", "name": "leaked", "team": "evil"},
        {"kind": "agent", "name": "leaked-agent"},
        {"kind": "team", "name": "good", "team": "good"},
    ):
        r = httpx.post(f"{url}/v1/tokens", json=body, headers=headers, timeout=10)
        r.raise_for_status()
        made.append(r.json()["token"])
    return made[0], made[1], made[2]


def run(db: str, home: Path, args: argparse.Namespace) -> int:
    server = ServerProcess(db, home).start()
    try:
        assert server.proc is not None
        assert server.admin_token
        found = next(m for line in server.output if (m := _AGENTS.search(line)))
        team, agent, good = _tokens(server.url, server.admin_token)
        target = Target(server.url, found.group(1), team, agent)
        pid = server.proc.pid
        idle = asyncio.run(run_phase("idle", target, good, pid, 0, min(args.seconds, 5.0)))
        phases = []
        for name in args.attacks:
            count = max(1, round(ATTACKS[name][1] * args.scale))
            phases.append(asyncio.run(run_phase(name, target, good, pid, count, args.seconds)))
        _summary(idle, phases)
        return 0
    finally:
        server.stop()


def _summary(idle: Phase, phases: list[Phase]) -> None:
    worst = max((p.p99() for p in phases), default=0.0)
    ratio = worst / idle.p99() if idle.p99() else float("nan")
    print(f"healthz p99 idle: {idle.p99():.1f} ms")
    print(f"healthz p99 under attack: {worst:.1f} ms ({ratio:.1f}x idle; goal under 50 ms)")
    errors = sum(p.server_errors for p in phases)
    transport = sum(p.transport_errors for p in phases)
    print(f"5xx to well-behaved clients: {errors} (goal 0); transport errors: {transport}")
    fds = max((p.peak_fds for p in phases), default=0)
    rss = max((p.peak_rss_mb for p in phases), default=0.0)
    print(
        f"server peak descriptors: {fds}, peak RSS: {rss:.0f} MB "
        f"(idle: {idle.peak_fds}, {idle.peak_rss_mb:.0f} MB)",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--scale", type=float, default=1.0, help="times issue 45's sizes")
    parser.add_argument("--seconds", type=float, default=20.0, help="longest phase")
    parser.add_argument(
        "--attacks",
        type=lambda s: [a for a in s.split(",") if a],
        default=list(ATTACKS),
        help=f"comma-separated, of {','.join(ATTACKS)}",
    )
    args = parser.parse_args(argv)
    unknown = [a for a in args.attacks if a not in ATTACKS]
    if unknown:
        parser.error(f"unknown attacks: {', '.join(unknown)}")
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # 2,000 slow sockets and more
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    os.environ.pop("CORRAL_ADMIN_TOKEN", None)
    with tempfile.TemporaryDirectory(prefix="corral-abuse-") as tmp:
        if args.db == "sqlite":
            home = Path(tmp) / "sqlite"
            return run(str(home / "corral.db"), home, args)
        schema = f"abuse_{uuid.uuid4().hex[:10]}"
        try:
            return run(f"{PG}?schema={schema}", Path(tmp) / "pg", args)
        finally:
            drop_schema(schema)


if __name__ == "__main__":
    sys.exit(main())
