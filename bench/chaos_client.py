"""The chaos harness's client: submits the pile, follows events, and audits the end state.

It behaves as a careful client of a flaky service should: every batch carries
an ``Idempotency-Key`` and is retried on another replica until one answers
(a replay returns the same jobs); the event stream is resumed with
``Last-Event-ID`` on whichever replica is up. The audit then compares what the
client was promised with what the servers say: every accepted job must have
succeeded exactly once, with its own result.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

PRIORITIES = (("interactive", 0.1), ("paid", 0.3), ("free", 0.4), ("batch", 0.2))
TEAMS = ("vision", "audio", "research")


def workload(n: int, seed: int, train_share: float = 0.1) -> list[dict[str, Any]]:
    """``n`` job specs: short samples and longer checkpointing train jobs, mixed priorities."""
    rng = random.Random(seed)
    names, weights = zip(*PRIORITIES, strict=True)
    jobs = []
    for i in range(n):
        train = rng.random() < train_share
        payload: dict[str, Any] = {"key": f"k{i:06d}"}
        if train:
            payload |= {"steps": rng.randint(20, 40), "step_s": 0.1, "checkpoint_every": 5}
        else:
            payload |= {"steps": rng.randint(2, 4), "step_s": 0.05}
        team = rng.choice(TEAMS)
        jobs.append(
            {
                "kind": "train" if train else "sample",
                "payload": payload,
                "resources": {"gpus": 1},
                "priority": rng.choices(names, weights)[0],
                "team": team,
                "user": f"{team}-user-{rng.randint(1, 5)}",
                "max_attempts": 20,
            }
        )
    return jobs


@dataclass
class Client:
    """Talks to whichever replica answers."""

    urls: Sequence[str]
    token: str
    http: httpx.AsyncClient = field(init=False)
    turn: int = 0
    retries: int = 0  # requests sent again to another replica

    def __post_init__(self) -> None:
        self.http = httpx.AsyncClient(
            headers={"Authorization": f"Bearer {self.token}"}, timeout=httpx.Timeout(30, read=60)
        )

    def next_url(self) -> str:
        self.turn += 1
        return self.urls[self.turn % len(self.urls)]

    async def call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """The request on one replica after another until one answers (not 5xx)."""
        for attempt in range(400):
            try:
                reply = await self.http.request(method, self.next_url() + path, **kw)
                if reply.status_code < 500:
                    return reply
            except httpx.HTTPError:
                pass
            self.retries += 1
            await asyncio.sleep(min(1.0, 0.05 * (attempt + 1)))
        raise RuntimeError(f"{method} {path}: no replica answered")

    async def close(self) -> None:
        await self.http.aclose()


@dataclass
class Ledger:
    """What the client was promised and what it saw."""

    by_key: dict[str, str] = field(default_factory=dict)  # job key -> job id
    steps: dict[str, int] = field(default_factory=dict)  # job key -> steps of work
    finished: set[str] = field(default_factory=set)  # job ids seen ending on the stream
    succeeded_seen: Counter[str] = field(default_factory=Counter)  # job id -> job.succeeded
    replays: int = 0  # batches answered "already have it" after a retry
    last_seq: int = 0


async def submit_all(
    client: Client,
    jobs: list[dict[str, Any]],
    ledger: Ledger,
    *,
    run: str,
    batch: int,
    backlog: int,
) -> None:
    """Submit in batches, each with its own key, keeping at most ``backlog`` jobs unfinished."""
    for start in range(0, len(jobs), batch):
        while len(ledger.by_key) - len(ledger.finished) > backlog:
            await asyncio.sleep(0.05)
        part = jobs[start : start + batch]
        key = f"{run}-{start // batch}"
        reply = await client.call(
            "POST", "/v1/jobs/batch", json={"jobs": part}, headers={"Idempotency-Key": key}
        )
        if reply.status_code not in (200, 201):
            raise RuntimeError(f"batch {key}: {reply.status_code} {reply.text[:300]}")
        if reply.status_code == 200:
            ledger.replays += 1
        for spec, job in zip(part, reply.json()["jobs"], strict=True):
            ledger.by_key[spec["payload"]["key"]] = job["id"]
            ledger.steps[spec["payload"]["key"]] = spec["payload"]["steps"]


async def follow(client: Client, ledger: Ledger, stop: asyncio.Event) -> None:
    """Read ``/v1/events`` from any replica, resuming after the last event seen."""
    while not stop.is_set():
        url = client.next_url() + "/v1/events"
        headers = {"Last-Event-ID": str(ledger.last_seq)}
        try:
            async with client.http.stream("GET", url, headers=headers) as reply:
                if reply.status_code != 200:
                    raise httpx.HTTPError(f"{reply.status_code}")
                await _read_frames(reply, ledger, stop)
        except httpx.HTTPError:
            await asyncio.sleep(0.2)


async def _read_frames(reply: httpx.Response, ledger: Ledger, stop: asyncio.Event) -> None:
    async for line in reply.aiter_lines():
        if stop.is_set():
            return
        if not line.startswith("data: "):
            continue
        event = json.loads(line[6:])
        ledger.last_seq = max(ledger.last_seq, int(event["seq"]))
        kind, job_id = event["kind"], event.get("job_id")
        if kind == "job.succeeded":
            ledger.succeeded_seen[job_id] += 1
        if kind in ("job.succeeded", "job.failed", "job.cancelled"):
            ledger.finished.add(job_id)


async def all_jobs(client: Client) -> list[dict[str, Any]]:
    """Every job on the servers (newest first, paged)."""
    out: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 500} | ({"cursor": cursor} if cursor else {})
        page = (await client.call("GET", "/v1/jobs", params=params)).json()
        out += page["jobs"]
        cursor = page["next_cursor"]
        if not cursor:
            return out


async def succeeded_events(client: Client) -> Counter[str]:
    """job id -> how many ``job.succeeded`` events the server's log holds for it."""
    reply = await client.call("GET", "/v1/events/export")
    counts: Counter[str] = Counter()
    for line in reply.text.splitlines():
        event = json.loads(line)
        if event["kind"] == "job.succeeded":
            counts[event["job_id"]] += 1
    return counts


async def wrong_results(client: Client, jobs: list[dict[str, Any]], key_of: dict[str, str]) -> int:
    """Succeeded jobs whose ``result.json`` is missing or names another job."""
    gate = asyncio.Semaphore(8)

    async def check(job: dict[str, Any]) -> bool:
        async with gate:
            reply = await client.call("GET", f"/v1/jobs/{job['id']}/result/result.json")
        return reply.status_code != 200 or reply.json().get("key") != key_of.get(job["id"])

    done = [j for j in jobs if j["state"] == "succeeded"]
    return sum(await asyncio.gather(*(check(j) for j in done)))
