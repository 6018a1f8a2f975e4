"""The sync SDK against a real ``corral server`` process with no agents (jobs stay queued)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from flaky_proxy import FlakyProxy
from live_server import FAST_RETRY, Running, eventually, free_port

from corral.core.states import JobState
from corral.sdk import (
    BadRequest,
    Client,
    Conflict,
    Eta,
    JobSpec,
    NotFound,
    PermissionDenied,
    Retry,
    ServerUnreachable,
    Unauthorized,
)


def test_a_submitted_job_can_be_read_listed_and_cancelled(admin: Client, team: str) -> None:
    job = admin.submit(kind="sample", payload={"prompt": "a fox"}, gpus=1, vram="8GiB", team=team)

    assert job.status.state is JobState.QUEUED
    assert job.status.resources.gpus == 1
    assert job.status.resources.vram_bytes == 8 * 2**30
    again = admin.job(job.id)
    assert again.status.payload == {"prompt": "a fox"}
    assert [j.id for j in admin.jobs(team=team)] == [job.id]

    cancelled = job.cancel()
    assert cancelled.state is JobState.CANCELLED
    assert job.cancel().state is JobState.CANCELLED  # twice is harmless
    assert admin.jobs(team=team, state="queued") == []
    assert [j.id for j in admin.jobs(team=team, state=["cancelled", "failed"])] == [job.id]


def test_a_finished_job_can_be_deleted_and_a_queued_one_cannot(admin: Client, team: str) -> None:
    job = admin.submit(kind="sample", payload={"prompt": "a fox"}, team=team)
    with pytest.raises(Conflict) as err:
        job.delete()
    assert "cancel it first" in str(err.value)
    job.cancel()
    job.delete()
    with pytest.raises(NotFound):
        admin.job(job.id)
    with pytest.raises(NotFound):
        admin.delete_job(job.id)  # twice: it is gone
    assert admin.jobs(team=team) == []


def test_listing_follows_pages_newest_first(admin: Client, team: str) -> None:
    jobs = admin.submit_many([{"team": team, "user": f"u{i}"} for i in range(7)])

    listed = admin.jobs(team=team, limit=7)
    assert [j.id for j in listed] == [j.id for j in reversed(jobs)]
    assert len(admin.jobs(team=team, limit=3)) == 3
    assert [j.user for j in admin.jobs(team=team, user="u4")] == ["u4"]
    assert len(list(admin.iter_jobs(team=team))) == 7


def test_submit_many_is_one_batch_and_chunks_are_all_or_nothing(admin: Client, team: str) -> None:
    specs = [JobSpec(team=team, payload={"i": i}) for i in range(5)]
    jobs = admin.submit_many(specs, chunk=2)
    assert [j.status.payload["i"] for j in jobs] == [0, 1, 2, 3, 4]

    bad = [{"team": team}, {"team": team, "priority": "vip"}]
    with pytest.raises(BadRequest) as err:
        admin.submit_many(bad)
    assert err.value.status == 422
    assert err.value.field == "jobs[1].priority"
    assert "vip" in err.value.message
    assert len(admin.jobs(team=team)) == 5  # the bad batch created nothing


def test_a_typo_is_caught_before_anything_is_sent(team: str) -> None:
    with Client(f"http://127.0.0.1:{free_port()}", "t", retry=Retry(attempts=1)) as nowhere:
        with pytest.raises(BadRequest) as err:
            nowhere.submit(gpu=1, team=team)
        assert err.value.field == "gpu"
        with pytest.raises(BadRequest) as batch_err:
            nowhere.submit_many([{}, {"replicas": "many"}])
        assert batch_err.value.field == "jobs[1].replicas"
        with pytest.raises(BadRequest, match=r"jobs\[2\]: a job is a JobSpec or a mapping"):
            nowhere.submit_many([{}, {}, ["not", "a", "job"]])


def test_the_server_names_the_bad_field(admin: Client, team: str) -> None:
    with pytest.raises(BadRequest) as err:
        admin.submit(gpus=-1, team=team)
    assert err.value.status == 422
    assert err.value.field == "resources.gpus"
    assert "greater than or equal to 0" in str(err.value)


def test_auth_errors_carry_the_servers_message(server: Running, admin: Client, team: str) -> None:
    with (
        Client(server.url, "corral_wrong", retry=FAST_RETRY) as stranger,
        pytest.raises(Unauthorized) as err,
    ):
        stranger.jobs()
    assert err.value.status == 401

    job = admin.submit(team=team)
    other = admin.create_token("team", "other-team-app", team=f"{team}-other")
    with Client(server.url, other.token, retry=FAST_RETRY) as outsider:
        with pytest.raises(NotFound, match=job.id):
            outsider.job(job.id)  # another team's job does not exist for this token
        with pytest.raises(PermissionDenied, match="admin"):
            outsider.set_team(team, quota=1)
    with pytest.raises(NotFound):
        admin.job("job_nope")


def test_an_unreachable_server_is_named_with_a_way_to_start_one() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with (
        Client(url, "t", retry=Retry(attempts=3, base_s=0.01)) as client,
        pytest.raises(ServerUnreachable) as err,
    ):
        client.jobs()
    text = str(err.value)
    assert url in text
    assert "connection refused" in text
    assert "after 3 attempts" in text
    assert "corral up" in text
    assert "corral server" in text


def test_a_lost_answer_is_retried_without_a_second_job(
    server: Running, make_proxy: Callable[[int], FlakyProxy], team: str
) -> None:
    proxy = make_proxy(server.port)
    with Client(proxy.url, server.token, retry=FAST_RETRY) as client:
        proxy.swallow(1)
        job = client.submit(team=team, payload={"n": 1})
        assert proxy.swallowed == 1
        assert [j.id for j in client.jobs(team=team)] == [job.id]

        proxy.swallow(1)
        batch = client.submit_many([{"team": team}, {"team": team}])
        assert proxy.swallowed == 2
        assert len(client.jobs(team=team)) == 3
        assert {j.id for j in batch} <= {j.id for j in client.jobs(team=team)}


def test_an_idempotency_key_returns_the_same_job(admin: Client, team: str) -> None:
    first = admin.submit(team=team, idempotency_key=f"{team}-order-1")
    again = admin.submit(team=team, idempotency_key=f"{team}-order-1")
    assert again.id == first.id
    with pytest.raises(Conflict) as err:
        admin.submit(team=team, gpus=2, idempotency_key=f"{team}-order-1")
    assert err.value.status == 409
    assert "Idempotency-Key" in err.value.message


def test_the_queue_says_why_each_job_waits(admin: Client, team: str) -> None:
    job = admin.submit(team=team, gpus=1)

    def reasons() -> list[str]:
        entry = next(e for e in admin.queue(limit=1000).entries if e.job.id == job.id)
        return [r.message for r in entry.queue.reasons]

    assert "no nodes in the cluster" in eventually(reasons)
    assert admin.queue().total >= 1
    assert admin.job(job.id).status.queue is not None


def test_teams_are_set_piecewise(admin: Client, team: str) -> None:
    made = admin.set_team(team, quota=2, weight=3)
    assert (made.quota_gpus, made.borrow_limit_gpus, made.weight) == (2, None, 3)
    changed = admin.set_team(team, borrow_limit=1)
    assert (changed.quota_gpus, changed.borrow_limit_gpus, changed.weight) == (2, 1, 3)
    cleared = admin.set_team(team, borrow_limit=None)
    assert cleared.borrow_limit_gpus is None
    assert next(t for t in admin.teams() if t.name == team).quota_gpus == 2
    with pytest.raises(BadRequest) as err:
        admin.set_team(team, weight=0)
    assert err.value.field == "weight"


def test_a_server_without_agents_has_no_nodes(admin: Client) -> None:
    assert admin.nodes() == []
    with pytest.raises(NotFound):
        admin.pause_node("nope")
    with pytest.raises(NotFound):
        admin.delete_node("nope")
    assert admin.health() == {"status": "ok"}


def test_a_job_no_node_can_run_has_an_eta_without_a_start(admin: Client, team: str) -> None:
    job = admin.submit(team=team, gpus=1)

    def eta() -> Eta | None:
        return admin.job(job.id).status.eta

    seen = eventually(eta)
    assert (seen.start_at, seen.end_at, seen.basis) == (None, None, "never")
    assert seen.describe(time.time()) == "no node can run it"
    entry = next(e for e in admin.queue(limit=1000).entries if e.job.id == job.id)
    assert entry.job.eta is not None


@pytest.mark.parametrize(
    ("eta", "running", "want"),
    [
        pytest.param(Eta(start_at=1240.0), False, "starts in ~4 min", id="minutes-away"),
        pytest.param(Eta(start_at=1010.0), False, "starts any moment", id="due"),
        pytest.param(Eta(start_at=900.0), False, "starts any moment", id="overdue"),
        pytest.param(Eta(start_at=1000.0 + 9000), False, "starts in ~2.5 h", id="hours"),
        pytest.param(Eta(end_at=1120.0), True, "ends in ~2 min", id="running"),
        pytest.param(Eta(basis="beyond"), False, "start not foreseen", id="past-horizon"),
    ],
)
def test_an_eta_reads_as_a_person_says_it(eta: Eta, running: bool, want: str) -> None:
    assert eta.describe(1000.0, running=running) == want


def test_memory_is_a_resource_shortcut_and_a_bad_one_names_the_field(
    admin: Client, team: str
) -> None:
    job = admin.submit(gpus=0, memory="16Gi", team=team)
    assert job.status.resources.memory_bytes == 16 * 2**30
    spec = admin.submit(JobSpec.model_validate({"team": team, "resources": {"memory": 2**20}}))
    assert spec.status.resources.memory_bytes == 2**20
    with pytest.raises(BadRequest) as info:
        admin.submit(memory="lots", team=team)
    assert info.value.field == "resources.memory"
