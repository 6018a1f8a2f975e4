"""The sync SDK against a server process whose stub agents run jobs to the end."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from flaky_proxy import FlakyProxy
from live_server import FAST_RETRY, Running, eventually, touch_when

from corral.core.states import JobState
from corral.sdk import Client, JobFailed, WaitTimeout

PNG = b"\x89PNG\r\n\x1a\n"


def test_events_show_progress_previews_and_logs_then_the_result(
    runner_client: Client, team: str, tmp_path: Path
) -> None:
    job = runner_client.submit(
        kind="sample",
        team=team,
        gpus=1,
        payload={"steps": 3, "preview": True, "log": True, "files": {"cat.txt": "meow"}},
    )
    events = list(job.events())

    kinds = [e.kind for e in events]
    assert kinds[0] == "job.submitted"
    assert kinds[-1] == "job.succeeded"
    assert {"job.placed", "job.started"} <= set(kinds)
    assert [e.progress for e in events if e.kind == "job.progress"] == pytest.approx(
        [1 / 3, 2 / 3, 1.0]
    )
    assert [e.message for e in events if e.progress] == ["step 1/3", "step 2/3", "step 3/3"]
    assert [line for e in events for line in e.lines] == [f"step {i} of 3" for i in (1, 2, 3)]
    previews = [e for e in events if e.preview_url]
    assert len(previews) == 3
    assert job.preview(previews[0]).startswith(PNG)
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs))

    final = job.wait(timeout=10)
    assert final.state is JobState.SUCCEEDED
    result = job.result()
    assert result.names == ["cat.txt"]
    assert result.read() == b"meow"
    assert [p.read_bytes() for p in result.save(tmp_path / "out")] == [b"meow"]
    assert (tmp_path / "out" / "cat.txt").exists()


def test_resuming_after_the_stream_drops_loses_and_repeats_nothing(
    stub: Running, make_proxy: Callable[[int], FlakyProxy], team: str, gate: Path
) -> None:
    proxy = make_proxy(stub.port)
    with Client(proxy.url, stub.token, retry=FAST_RETRY) as client:
        job = client.submit(team=team, gpus=1, payload={"steps": 4, "log": True, "gate": str(gate)})
        stream = job.events()
        touch_when(lambda: stream.reconnects > 0, gate)  # resumed: now let the job finish
        seen = []
        for event in stream:
            seen.append(event)
            if event.kind == "job.started":
                assert proxy.cut() > 0  # the connection dies mid-stream (the job is held)

        assert stream.reconnects >= 1
        assert seen[-1].kind == "job.succeeded"
        replay = list(client.events(job.id))  # a fresh read of the whole log
    assert [e.seq for e in seen] == [e.seq for e in replay]
    assert [e.kind for e in seen] == [e.kind for e in replay]


def test_events_resume_after_a_given_sequence_number(runner_client: Client, team: str) -> None:
    job = runner_client.submit(team=team, payload={"steps": 2})
    everything = list(job.events())
    later = list(job.events(after=everything[2].seq))
    assert [e.seq for e in later] == [e.seq for e in everything[3:]]
    assert list(job.events(after=everything[-1].seq)) == []


def test_events_of_chosen_kinds_only(runner_client: Client, team: str) -> None:
    job = runner_client.submit(team=team, payload={"steps": 3})
    wanted = ["job.progress", "job.succeeded"]
    events = list(job.events(kinds=wanted))
    assert [e.kind for e in events] == ["job.progress"] * 3 + ["job.succeeded"]
    # The server ends the stream after the job's final event even when it is filtered out.
    assert [e.progress for e in runner_client.events(job.id, kinds=["job.progress"])] == (
        pytest.approx([1 / 3, 2 / 3, 1.0])
    )
    assert job.wait(timeout=10).state is JobState.SUCCEEDED  # wait() follows only the end


def test_wait_times_out_then_a_cancelled_job_has_no_result(
    runner_client: Client, team: str, gate: Path
) -> None:
    job = runner_client.submit(team=team, payload={"steps": 1, "gate": str(gate)})
    with pytest.raises(WaitTimeout) as err:
        job.wait(timeout=0.3)
    assert err.value.state in ("placed", "running")
    assert job.id in str(err.value)

    job.cancel()
    assert job.wait(timeout=10).state is JobState.CANCELLED
    with pytest.raises(JobFailed, match="cancelled"):
        job.result()


def test_interrupt_keeps_what_was_made(runner_client: Client, team: str, gate: Path) -> None:
    job = runner_client.submit(team=team, payload={"steps": 1, "gate": str(gate)})
    eventually(lambda: job.refresh().state is JobState.RUNNING)

    job.interrupt()
    result = job.result(timeout=10)
    assert result.read("partial.txt") == b"partial"
    assert job.status.state is JobState.SUCCEEDED


def test_a_failed_job_says_why(runner_client: Client, team: str) -> None:
    job = runner_client.submit(team=team, payload={"fail": "CUDA out of memory"})
    final = job.wait(timeout=10)
    assert final.state is JobState.FAILED
    assert "CUDA out of memory" in (final.error or "")
    with pytest.raises(JobFailed, match="CUDA out of memory"):
        job.result()


def test_logs_so_far_with_an_idle_timeout(runner_client: Client, team: str, gate: Path) -> None:
    job = runner_client.submit(team=team, payload={"steps": 2, "log": True, "gate": str(gate)})
    eventually(lambda: job.refresh().progress == 1.0)

    so_far = list(job.events(idle_timeout=0.5))
    assert [line for e in so_far for line in e.lines] == ["step 1 of 2", "step 2 of 2"]
    assert not any(e.terminal for e in so_far)
    gate.touch()
    assert job.wait(timeout=10).state is JobState.SUCCEEDED


def test_nodes_show_gpus_and_can_be_paused_resumed_and_drained(runner_client: Client) -> None:
    nodes = {n.name: n for n in runner_client.nodes()}
    assert set(nodes) == {"box-a", "box-b"}
    assert [g.model for g in nodes["box-b"].gpus] == ["RTX 4090", "RTX 4090"]
    assert nodes["box-b"].gpus[0].vram_bytes == 24 * 2**30

    try:
        assert runner_client.pause_node("box-b").condition == "paused"
        assert runner_client.node("box-b").paused
        assert runner_client.drain_node("box-b").condition == "draining"
    finally:
        assert runner_client.resume_node("box-b").condition == "ready"
