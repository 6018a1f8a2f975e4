"""Webhooks through a real server and real HTTP receivers (the example receiver in
``examples/webhooks``): a finished job is posted once, signed with its team's secret;
a receiver that is down for a while gets it when it comes back; one that answers 500 is
retried until the retry time is over; every attempt is visible in
``GET /v1/jobs/{id}/deliveries``. URLs into the server's own network are refused."""

from __future__ import annotations

import importlib.util
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from http_harness import Served, eventually, serve

from corral.server.agentlink.inprocess import StubAgent
from corral.server.loops.webhooks import WebhookLoop
from corral.server.services.webhooks import sign, verify

pytestmark = pytest.mark.anyio

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "webhooks" / "receiver.py"
FAST = {  # retries within a test's time: the policy is the same, its clock shorter
    "allow_private": True,
    "poll_s": 0.05,
    "first_retry_s": 0.1,
    "max_retry_s": 0.3,
    "timeout_s": 2.0,
}


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("webhook_receiver", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Running:
    """The example receiver serving on a thread: what it accepted, in order."""

    def __init__(self, port: int, secret: str, status: int = 200) -> None:
        self.events: list[dict[str, Any]] = []
        self.server = example().Receiver(("127.0.0.1", port), secret, self.events.append, status)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def served(db_url: str, tmp_path: Path) -> AsyncIterator[Served]:
    async with serve(db_url, tmp_path, sections={"webhooks": FAST}) as s:
        yield s


@pytest.fixture
def receivers() -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for r in started:
        r.stop()


async def secret(s: Served) -> str:
    r = await s.admin.get("/v1/webhooks/secret")
    assert r.status_code == 200, r.text
    return str(r.json()["secret"])


async def run_job(s: Served, url: str, events: str = "end", agent: StubAgent | None = None) -> str:
    """Submit a job naming ``url`` and run it to success on ``agent`` (a new one if None)."""
    r = await s.admin.post(
        "/v1/jobs", json={"resources": {"gpus": 1}, "webhook": {"url": url, "events": events}}
    )
    assert r.status_code == 201, r.text
    job_id = str(r.json()["id"])
    agent = agent or await s.agent("gpu-1")
    a = await agent.next_assignment()
    await agent.start(a)
    await agent.finish(a, {job_id: {"out.png": b"png"}})
    return job_id


async def deliveries(s: Served, job_id: str) -> list[dict[str, Any]]:
    r = await s.admin.get(f"/v1/jobs/{job_id}/deliveries")
    assert r.status_code == 200, r.text
    return list(r.json()["deliveries"])


async def test_a_finished_job_is_posted_once_signed_and_recorded(
    served: Served, port: int, receivers: list[Running]
) -> None:
    receiver = Running(port, await secret(served))
    receivers.append(receiver)
    job_id = await run_job(served, f"http://127.0.0.1:{port}/hook?k=1")

    async def delivered() -> list[dict[str, Any]]:
        got = await deliveries(served, job_id)
        return got if got and got[0]["state"] == "delivered" else []

    (d,) = await eventually(delivered)
    assert (d["kind"], d["attempts"], d["last_status"]) == ("job.succeeded", 1, 200)
    (event,) = receiver.events
    assert event["type"] == "job.succeeded"
    assert event["id"] == d["id"]
    assert event["job"]["id"] == job_id
    assert event["job"]["state"] == "succeeded"
    assert event["job"]["result"][0]["url"] == f"/v1/jobs/{job_id}/result/out.png"
    assert receiver.server.refused == 0  # the signature checked out


async def test_all_events_posts_each_state_change_in_order(
    served: Served, port: int, receivers: list[Running]
) -> None:
    receivers.append(Running(port, await secret(served)))
    job_id = await run_job(served, f"http://127.0.0.1:{port}/", events="all")

    async def all_delivered() -> list[str]:
        got = await deliveries(served, job_id)
        done = got and all(d["state"] == "delivered" for d in got) and len(got) >= 4
        return [d["kind"] for d in got] if done else []

    kinds = await eventually(all_delivered)
    assert kinds == ["job.submitted", "job.placed", "job.started", "job.succeeded"]


async def test_a_receiver_down_for_a_while_gets_the_call_when_it_is_back(
    served: Served, port: int, receivers: list[Running]
) -> None:
    key = await secret(served)
    job_id = await run_job(served, f"http://127.0.0.1:{port}/")  # nothing listens yet

    async def failed_twice() -> dict[str, Any] | None:
        got = await deliveries(served, job_id)
        return got[0] if got and got[0]["attempts"] >= 2 else None

    waiting = await eventually(failed_twice)
    assert waiting["state"] == "pending"
    assert waiting["last_status"] is None
    assert waiting["last_error"]
    assert waiting["next_at"] is not None
    receiver = Running(port, key)
    receivers.append(receiver)

    async def delivered() -> dict[str, Any] | None:
        got = await deliveries(served, job_id)
        return got[0] if got and got[0]["state"] == "delivered" else None

    done = await eventually(delivered)
    assert done["last_status"] == 200
    assert [h["status"] for h in done["history"]][-1] == 200
    assert all(h["status"] is None for h in done["history"][:-1])
    assert [e["type"] for e in receiver.events] == ["job.succeeded"]


async def test_a_receiver_answering_500_is_retried_until_the_retry_time_is_over(
    db_url: str, tmp_path: Path, port: int, receivers: list[Running]
) -> None:
    hooks = FAST | {"retry_for_s": 1.0}
    async with serve(db_url, tmp_path, sections={"webhooks": hooks}) as s:
        receivers.append(Running(port, await secret(s), status=500))
        job_id = await run_job(s, f"http://127.0.0.1:{port}/")

        async def failed() -> dict[str, Any] | None:
            got = await deliveries(s, job_id)
            return got[0] if got and got[0]["state"] == "failed" else None

        d = await eventually(failed)
        assert d["attempts"] >= 3
        assert d["last_status"] == 500
        assert d["last_error"].startswith("HTTP 500")
        assert {h["status"] for h in d["history"]} == {500}


async def test_urls_into_the_server_s_network_are_refused(tmp_path: Path) -> None:
    async with serve(str(tmp_path / "c.db"), tmp_path) as s:  # allow_private off
        for url, says in [
            ("http://127.0.0.1:8600/x", "not a public address"),
            ("http://[::1]/x", "not a public address"),
            ("http://169.254.169.254/latest", "not a public address"),
            ("http://localhost:8600/", "this machine"),
            ("ftp://example.com/x", "http:// or https://"),
            ("https://user:pw@example.com/x", "credentials"),
            ("https://example.com/x#frag", "fragment"),
        ]:
            r = await s.admin.post("/v1/jobs", json={"webhook": {"url": url}})
            assert r.status_code == 422, url
            assert r.json()["field"] == "webhook.url", r.text
            assert says in r.text, r.text
        # a name is checked when called, against the addresses it resolves to then
        loop = WebhookLoop(s.plane.rt)
        try:
            out = await loop.call("http://localhost:9/x", b"{}", "dlv_1", "job.succeeded", "k")
        finally:
            await loop.close()
        assert out.final
        assert out.status is None
        assert "not a public address" in (out.error or "")


def test_signatures_check_the_body_the_secret_and_the_time() -> None:
    body, now = b'{"type":"job.succeeded"}', time.time()
    header = sign("whsec_a", int(now), body)
    receiver_verify = example().verify
    for check in (verify, receiver_verify):
        assert check("whsec_a", header, body, now)
        assert not check("whsec_b", header, body, now)  # another team's secret
        assert not check("whsec_a", header, body + b" ", now)  # a changed body
        assert not check("whsec_a", header, body, now + 301)  # replayed after the window
        assert not check("whsec_a", "v1=00", body, now)


async def test_the_team_secret_is_kept_rotated_and_per_team(served: Served) -> None:
    first = await secret(served)
    assert first.startswith("whsec_")
    assert first == await secret(served)
    rotated = (await served.admin.post("/v1/webhooks/secret/rotate")).json()["secret"]
    assert rotated != first
    assert rotated == await secret(served)
    made = await served.admin.post("/v1/tokens", json={"kind": "team", "name": "b", "team": "b"})
    async with served.client(made.json()["token"]) as team_b:
        own = (await team_b.get("/v1/webhooks/secret")).json()
        assert own["team"] == "b"
        assert own["secret"] != rotated
        r = await team_b.get("/v1/webhooks/secret", params={"team": "default"})
        assert r.status_code == 403


async def test_pending_deliveries_are_bounded_per_team(
    db_url: str, tmp_path: Path, port: int
) -> None:
    hooks = FAST | {"max_pending_per_team": 1}
    async with serve(db_url, tmp_path, sections={"webhooks": hooks}) as s:
        agent = await s.agent("gpu-1")
        jobs = [await run_job(s, f"http://127.0.0.1:{port}/", agent=agent) for _ in range(2)]

        async def both_made() -> list[dict[str, Any]]:
            got = [await deliveries(s, j) for j in jobs]
            return [d[0] for d in got] if all(got) else []

        first, second = await eventually(both_made)
        assert first["state"] == "pending"
        assert second["state"] == "failed"
        assert "max_pending_per_team" in second["last_error"]
        assert second["attempts"] == 0


class Hanging:
    """A receiver that accepts connections and never answers."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_server(("127.0.0.1", port))
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        try:
            while True:
                conn, _ = self.sock.accept()
                self.held.append(conn)
        except OSError:  # closed: the test is over
            return

    def stop(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


async def test_a_receiver_that_never_answers_holds_up_neither_scheduling_nor_others(
    tmp_path: Path, port: int
) -> None:
    hooks = FAST | {"timeout_s": 60.0, "per_team_concurrency": 1}
    hanging = Hanging(port)
    try:
        async with serve(str(tmp_path / "c.db"), tmp_path, sections={"webhooks": hooks}) as s:
            agent = await s.agent("gpu-1")
            url = f"http://127.0.0.1:{port}/"
            first = await run_job(s, url, agent=agent)

            async def calling() -> bool:  # its call is in flight, and stays so
                return bool(hanging.held)

            await eventually(calling)
            later = [await run_job(s, url, agent=agent) for _ in range(3)]  # placed and run
            for job_id in later:
                got = (await s.admin.get(f"/v1/jobs/{job_id}")).json()
                assert got["state"] == "succeeded"

            async def made() -> list[dict[str, Any]]:
                found = [d for j in later for d in await deliveries(s, j)]
                return found if len(found) == 3 else []

            for d in await eventually(made):  # the team's one call at a time is taken
                assert (d["state"], d["attempts"]) == ("pending", 0)
            (d,) = await deliveries(s, first)
            assert (d["state"], d["attempts"]) == ("pending", 0)  # still waiting for an answer
            assert len(hanging.held) == 1
    finally:
        hanging.stop()
