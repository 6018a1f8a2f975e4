"""The agent link's pure parts: server URLs, reconnect delays, labels, wire translation."""

from __future__ import annotations

import random

import pytest

from corral.agent.executors.base import Failed, Progress, Result
from corral.agent.link import Target, backoff_s, parse_server
from corral.agent.main import parse_labels
from corral.agent.orders import Done, JobResult, Report
from corral.agent.wire import order_from, stop_from, update_message
from corral.core import InvalidSpec
from corral.core.states import StopReason
from corral.proto.gen.corral.v1 import agent_pb2 as pb


@pytest.mark.parametrize(
    ("url", "want"),
    [
        pytest.param("grpc://vps:9000", Target("vps:9000", False, "grpc://vps:9000"), id="grpc"),
        pytest.param("grpcs://vps", Target("vps:8471", True, "grpcs://vps"), id="tls-default-port"),
        pytest.param("vps:9000", Target("vps:9000", False, "vps:9000"), id="bare"),
        pytest.param("http://vps:8470", Target("vps:8471", False, "http://vps:8470"), id="api-url"),
        pytest.param(
            "https://c.example", Target("c.example:8471", True, "https://c.example"), id="https"
        ),
        pytest.param("grpc://[::1]:9", Target("[::1]:9", False, "grpc://[::1]:9"), id="ipv6"),
    ],
)
def test_server_urls(url: str, want: Target) -> None:
    assert parse_server(url) == want


@pytest.mark.parametrize("url", ["", "ftp://x", "grpc://:9", "grpc://h:port"])
def test_bad_server_urls_name_the_option(url: str) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_server(url)
    assert caught.value.field == "server"


def test_backoff_grows_to_its_cap_and_is_spread_by_jitter() -> None:
    rng = random.Random(7)
    for failures, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (10, 30.0), (50, 30.0)]:
        delays = [backoff_s(failures, rng) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays), (failures, min(delays))
        assert max(delays) - min(delays) > ceiling / 4  # really spread: no thundering herd


def test_labels() -> None:
    assert parse_labels(["zone=home,gpu=4090", "owner = me"]) == {
        "zone": "home",
        "gpu": "4090",
        "owner": "me",
    }
    with pytest.raises(InvalidSpec, match="labels: 'oops': write key=value"):
        parse_labels(["oops"])


def test_an_assignment_becomes_an_order_with_a_job_work_per_job() -> None:
    msg = pb.Assign(
        allocation_id="al-1",
        attempt=3,
        gpu_indices=[1],
        gpu_milli=500,
        vram_bytes=8 << 30,
        jobs=[
            pb.Work(
                job_id="j1",
                kind="sample",
                payload_json='{"prompt": "a"}',
                backend="demo",
                resume_from="/ck/j1",
                resume_step=4,
                timeout_s=30,
            ),
            pb.Work(job_id="j2", kind="sample", payload_json='{"prompt": "b"}'),
        ],
    )
    order = order_from(msg)
    assert (order.allocation_id, order.attempt, order.backend) == ("al-1", 3, "demo")
    assert order.vram_bytes == 8 << 30  # a shared card: the reservation is the guard's limit
    first, second = order.jobs
    assert first.job_ids == ("j1",)
    assert dict(first.payload) == {"prompt": "a"}
    assert (first.resume_from, first.resume_step, first.timeout_s) == ("/ck/j1", 4, 30)
    assert first.gpu_indices == (1,)
    assert (second.resume_from, second.timeout_s) == (None, None)


def test_stop_reasons_cross_the_wire() -> None:
    stop = pb.Stop(allocation_id="al-1", reason=pb.STOP_REASON_PREEMPT, grace_s=30)
    assert stop_from(stop) == ("al-1", StopReason.PREEMPT, 30.0)


def test_updates_carry_allocation_attempt_and_job_and_large_results_go_by_blob() -> None:
    progress = update_message(5, Report("al-1", 2, Progress(0.5, 5, 10), "j1"))
    assert progress.seq == 5
    assert (progress.update.allocation_id, progress.update.attempt) == ("al-1", 2)
    assert progress.update.job_id == "j1"
    assert progress.update.progress.step == 5
    done = Done(
        (JobResult("j1", Result("a.png", b"small")), JobResult("j2", Result("b", b"x" * 9)))
    )
    msg = update_message(6, Report("al-1", 2, done), {1: "uploads/al-1/2/abc"})
    small, big = msg.update.finished.results
    assert (small.job_id, small.data, small.blob_id) == ("j1", b"small", "")
    assert (big.job_id, big.data, big.blob_id) == ("j2", b"", "uploads/al-1/2/abc")


def test_a_batch_cut_short_carries_what_finished_with_its_failure() -> None:
    before = Done((JobResult("j1", Result("a.png", b"png")),), jobs=("j1", "j2"))
    failed = Failed("CUDA out of memory", retryable=True)
    msg = update_message(7, Report("al-1", 2, failed, "j3", before), {0: "uploads/al-1/2/f"})
    u = msg.update
    assert (u.job_id, u.failed.error, u.failed.retryable) == ("j3", "CUDA out of memory", True)
    assert list(u.failed.finished_jobs) == ["j1", "j2"]
    [r] = u.failed.results
    assert (r.job_id, r.name, r.blob_id, r.data) == ("j1", "a.png", "uploads/al-1/2/f", b"")
    plain = update_message(8, Report("al-2", 1, failed)).update.failed
    assert (list(plain.finished_jobs), list(plain.results)) == ([], [])
