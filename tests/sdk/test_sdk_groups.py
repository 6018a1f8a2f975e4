"""Pipelines and arrays through the sync SDK, against a server process whose stub agents run
each job: a step reads the file the step before made, a failed step ends those after it,
an array's elements carry their index."""

from __future__ import annotations

import hashlib
import time

import pytest
from live_server import FAST_RETRY, Running

from corral.sdk import AsyncClient, BadRequest, Client


def test_a_pipeline_is_submitted_followed_and_its_file_passed_on(
    runner_client: Client, team: str
) -> None:
    group = runner_client.submit_pipeline(
        {
            "upscale": {
                "team": team,
                "payload": {"steps": 1},
                "inputs": [{"from": "txt2img", "file": "image.png", "as": "init.png"}],
            },
            "txt2img": {
                "team": team,
                "payload": {"steps": 2, "files": {"image.png": "pixels"}},
                "outputs": ["image.png"],
            },
        },
        team=team,
    )
    seen = list(group.follow(poll_s=0.05))
    assert seen[-1].state == "succeeded"
    assert seen[0].steps is not None
    assert [s.name for s in seen[0].steps] == ["txt2img", "upscale"]
    upscale = seen[-1].step("upscale")
    sha = hashlib.sha256(b"pixels").hexdigest()
    assert upscale.inputs == [{"blob": sha, "name": "init.png"}]
    assert upscale.after == [{"job": seen[-1].step("txt2img").id, "need": "ok"}]


def test_a_failed_step_ends_the_pipeline_and_says_why(runner_client: Client, team: str) -> None:
    hook = {"url": "https://hooks.invalid/corral", "events": "end"}  # .invalid: never resolves
    group = runner_client.submit_pipeline(
        {
            "train": {"team": team, "payload": {"fail": "loss is NaN"}, "max_attempts": 1},
            "evaluate": {"team": team, "after": ["train"]},
        },
        team=team,
        webhook=hook,
    )
    assert group.status.webhook == hook
    final = group.wait(timeout=20, poll_s=0.05)
    assert final.state == "failed"
    assert final.step("evaluate").state.value == "cancelled"
    assert "loss is NaN" in (final.step("evaluate").error or "")
    deadline = time.monotonic() + 20
    while not (made := group.deliveries()) and time.monotonic() < deadline:
        time.sleep(0.05)  # the webhook loop makes it on its next pass
    (d,) = made  # its end, made once (the receiver cannot be reached: it waits to retry)
    assert (d.kind, d.subject, d.subject_kind) == ("pipeline.failed", group.id, "pipeline")
    assert d.body["group"]["counts"] == {"cancelled": 1, "failed": 1}


def test_a_refused_pipeline_names_the_step_and_field(runner_client: Client, team: str) -> None:
    with pytest.raises(BadRequest) as refused:
        runner_client.submit_pipeline({"a": {"team": team, "after": ["b"]}}, team=team)
    assert refused.value.field == "steps.a.after[0]"
    with pytest.raises(BadRequest) as typo:
        runner_client.submit_pipeline({"a": {"gpu": 1}}, team=team)
    assert typo.value.field == "steps.a.gpu"


def test_an_array_of_seeds_runs_as_one(runner_client: Client, team: str) -> None:
    group = runner_client.submit_array(
        {"team": team, "payload": {"steps": 1}}, 5, index_key="seed", index_start=7
    )
    assert sorted(j.payload["seed"] for j in group.status.jobs) == [7, 8, 9, 10, 11]
    final = group.wait(timeout=20, poll_s=0.05)
    assert final.counts == {"succeeded": 5}
    assert final.progress == 1.0
    assert runner_client.group(group.id).status.size == 5
    assert group.refresh() is group.status
    assert repr(group) == f"Group({group.id!r}, state='succeeded')"
    job = runner_client.job(group.status.jobs[0].id)
    assert job.refresh() is job.status
    assert repr(job) == f"Job({job.id!r}, state='succeeded')"


@pytest.mark.anyio
async def test_the_async_client_follows_a_pipeline_and_cancels_an_array(
    stub: Running, team: str
) -> None:
    async with AsyncClient(stub.url, stub.token, retry=FAST_RETRY) as corral:
        group = await corral.submit_pipeline(
            {
                "a": {"team": team, "payload": {"files": {"x.txt": "x"}}},
                "b": {"team": team, "inputs": [{"from": "a", "file": "x.txt"}]},
            },
            team=team,
        )
        seen = [s async for s in group.follow(poll_s=0.05)]
        assert seen[-1].state == "succeeded"
        assert [f["name"] for f in seen[-1].step("b").inputs] == ["x.txt"]
        slow = {"team": team, "payload": {"steps": 100, "step_s": 0.2}}
        array = await corral.submit_array(slow, 3)
        cancelled = await array.cancel()
        assert cancelled.state == "cancelled"
        assert (await corral.group(array.id)).status.counts == {"cancelled": 3}
        assert (await array.refresh()).state == "cancelled"
        assert repr(array) == f"AsyncGroup({array.id!r}, state='cancelled')"
        job = await corral.job(array.status.jobs[0].id)
        assert (await job.refresh()).id == job.id
        assert repr(job) == f"AsyncJob({job.id!r}, state='cancelled')"
