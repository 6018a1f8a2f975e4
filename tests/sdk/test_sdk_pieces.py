"""The SDK's pure parts (SSE decoding, backoff, resume decisions, config) and its retry rules
over ``httpx.MockTransport``: fast, no server."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.sdk import BadRequest, Client, Retry, ServerError, ServerUnreachable, WaitTimeout
from corral.sdk.config import ConfigError, load, resolve, save
from corral.sdk.events import SseDecoder
from corral.sdk.results import save_path
from corral.sdk.retry import Follow

JOB = {
    "id": "job_1",
    "kind": "custom",
    "state": "queued",
    "priority": "free",
    "team": "default",
    "user": "anonymous",
    "resources": {"gpus": 1, "gpu_milli": 0, "vram_bytes": 0, "cpus": 1},
    "submitted_at": 1.0,
}


def decode(text: str) -> list[tuple[int, str]]:
    decoder = SseDecoder()
    out = []
    for line in text.split("\n"):
        event = decoder.feed(line)
        if event is not None:
            out.append((event.seq, event.kind))
    return out


def test_sse_frames_become_events_and_noise_is_skipped() -> None:
    text = (
        ": keep-alive\n\n"
        'id: 7\nevent: job.progress\ndata: {"seq": 7, "kind": "job.progress", "at": 1,'
        ' "data": {"progress": 0.5}}\n\n'
        "data: not json\n\n"
        'id: 9\r\ndata: {"kind": "job.log", "at": 2,\r\ndata: "data": {"lines": ["hi"]}}\r\n\r\n'
        "event: other\n\n"
    )
    assert decode(text) == [(7, "job.progress"), (9, "job.log")]


@pytest.mark.parametrize(
    ("attempt", "want"),
    [
        pytest.param(1, 0.25, id="first retry waits the base"),
        pytest.param(3, 1.0, id="then doubles"),
        pytest.param(4, None, id="the fourth failure gives up"),
    ],
)
def test_backoff_doubles_then_gives_up(attempt: int, want: float | None) -> None:
    retry = Retry(attempts=4, base_s=0.25, max_s=4.0, jitter=0.0)
    assert retry.delay(attempt) == want


def test_backoff_is_capped_and_jittered() -> None:
    retry = Retry(attempts=20, base_s=1.0, max_s=3.0, jitter=0.2, rng=random.Random(1))
    delays = [retry.delay(n) for n in range(5, 15)]
    assert all(d is not None and 2.4 <= d <= 3.6 for d in delays)
    assert len(set(delays)) > 1


def test_a_follow_resumes_after_the_last_event_and_stops_when_idle() -> None:
    follow = Follow("job_1", "http://x", Retry(attempts=2, base_s=0.1, jitter=0.0))
    assert follow.headers() == {}
    follow.seen(41, now=0.0)
    assert follow.headers() == {"Last-Event-ID": "41"}
    assert follow.broken(httpx.RemoteProtocolError("cut"), now=1.0) == 0.1
    with pytest.raises(ServerUnreachable, match="event stream broke"):
        follow.broken(httpx.ReadError("again"), now=2.0)

    idle = Follow("job_1", "http://x", Retry(), idle_timeout=0.5)
    assert idle.read_timeout(0.0) == 0.5
    assert idle.broken(httpx.ReadTimeout("quiet"), now=1.0) is None


def test_a_follow_with_a_deadline_reads_in_slices_and_raises_at_the_deadline() -> None:
    follow = Follow("job_1", "http://x", Retry(attempts=1), deadline=10.0, timeout=10.0)
    assert follow.read_timeout(0.0) == 2.0
    assert follow.broken(httpx.ReadTimeout("slice"), now=2.0) == 0.0  # not a failure
    assert follow.read_timeout(9.5) == 0.5
    with pytest.raises(WaitTimeout, match="within 10s"):
        follow.broken(httpx.ReadTimeout("slice"), now=10.0)


def test_flags_beat_environment_beats_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    assert resolve(env={}, path=path).url_from == "default"
    save("corral.example:8470/", "tok-file", path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert load(path) == {"url": "http://corral.example:8470", "token": "tok-file"}

    from_file = resolve(env={}, path=path)
    assert (from_file.url, from_file.token, from_file.url_from) == (
        "http://corral.example:8470",
        "tok-file",
        str(path),
    )
    env = {"CORRAL_URL": "http://env:1", "CORRAL_TOKEN": "tok-env"}
    assert resolve(env=env, path=path).token == "tok-env"
    assert resolve(env=env, path=path).url_from == "CORRAL_URL"
    flags = resolve("http://flag:2", "tok-flag", env=env, path=path)
    assert (flags.url, flags.token, flags.url_from) == ("http://flag:2", "tok-flag", "--url")


def test_a_broken_config_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('url = "unterminated\n')
    with pytest.raises(ConfigError, match=str(path)):
        resolve(env={}, path=path)


def test_result_files_are_saved_inside_the_directory(tmp_path: Path) -> None:
    assert save_path(tmp_path, "../../etc/passwd") == tmp_path / "etc" / "passwd"
    assert save_path(tmp_path, "img/0.png") == tmp_path / "img" / "0.png"


def mock_client(handler: httpx.MockTransport, attempts: int = 3) -> Client:
    retry = Retry(attempts=attempts, base_s=0.001, jitter=0.0)
    return Client("http://corral.test", "tok", retry=retry, transport=handler)


def test_unavailable_is_retried_but_a_bad_request_is_not() -> None:
    keys: list[str] = []
    busy = [2]  # answer 503 this many more times

    def handle(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers["Idempotency-Key"])
        if busy[0] > 0:
            busy[0] -= 1
            return httpx.Response(503, json={"error": "unavailable", "message": "store busy"})
        if b'"user":"mallory"' in request.content:
            body = {"error": "invalid", "message": "user: no", "field": "user"}
            return httpx.Response(422, json=body)
        return httpx.Response(201, json=JOB)

    with mock_client(httpx.MockTransport(handle)) as client:
        assert client.submit().id == "job_1"
        assert len(keys) == 3
        assert len(set(keys)) == 1  # every retry carried the same idempotency key
        keys.clear()
        with pytest.raises(BadRequest) as err:
            client.submit(user="mallory")
        assert err.value.field == "user"
        assert len(keys) == 1  # a 4xx is never retried


def test_a_server_that_stays_down_gives_a_server_error() -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, text="upstream down")

    with mock_client(httpx.MockTransport(handle)) as client, pytest.raises(ServerError) as err:
        client.nodes()
    assert err.value.status == 503
    assert "upstream down" in err.value.message


def test_connection_errors_give_up_after_the_attempts() -> None:
    tries = []

    def handle(request: httpx.Request) -> httpx.Response:
        tries.append(1)
        raise httpx.ConnectError("[Errno 111] Connection refused")

    with (
        mock_client(httpx.MockTransport(handle), attempts=3) as client,
        pytest.raises(ServerUnreachable, match="after 3 attempts"),
    ):
        client.teams()
    assert len(tries) == 3


class Breaks(httpx.SyncByteStream):
    """An SSE body that sends ``frames`` and then loses the connection."""

    def __init__(self, frames: list[bytes], then_break: bool) -> None:
        self.frames = frames
        self.then_break = then_break

    def __iter__(self) -> Iterator[bytes]:
        yield from self.frames
        if self.then_break:
            raise httpx.RemoteProtocolError("peer closed connection")


def frame(seq: int, kind: str) -> bytes:
    body = json.dumps({"seq": seq, "kind": kind, "at": 0.0, "job_id": "job_1", "data": {}})
    return f"id: {seq}\nevent: {kind}\ndata: {body}\n\n".encode()


def test_a_broken_stream_is_resumed_with_last_event_id() -> None:
    asked: list[str | None] = []

    def handle(request: httpx.Request) -> httpx.Response:
        asked.append(request.headers.get("Last-Event-ID"))
        if len(asked) == 1:
            stream = Breaks([frame(3, "job.submitted"), frame(5, "job.started")], True)
        else:  # a server resumes after the id; this one also repeats one, which is dropped
            stream = Breaks([frame(5, "job.started"), frame(8, "job.succeeded")], False)
        return httpx.Response(200, stream=stream, headers={"content-type": "text/event-stream"})

    with mock_client(httpx.MockTransport(handle)) as client:
        stream = client.events("job_1")
        assert [e.seq for e in stream] == [3, 5, 8]
    assert asked == [None, "5"]
    assert stream.reconnects == 1


def test_the_local_admin_token_of_corral_up_is_used_only_for_this_machine(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    (tmp_path / "admin-token").write_text("corral_admin_local\n")
    assert resolve(env={}, path=path).token == "corral_admin_local"
    assert resolve("http://localhost:9000", env={}, path=path).token == "corral_admin_local"
    assert resolve("http://gpu-box:8470", env={}, path=path).token is None
    assert resolve(env={"CORRAL_TOKEN": "mine"}, path=path).token == "mine"


def test_the_local_admin_token_is_read_from_corral_home_when_it_is_set(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    (tmp_path / "admin-token").write_text("corral_admin_default\n")
    home = tmp_path / "elsewhere"
    home.mkdir()
    (home / "admin-token").write_text("corral_admin_home\n")
    env = {"CORRAL_HOME": str(home)}
    assert resolve(env=env, path=path).token == "corral_admin_home"  # where `corral up` kept it
    assert resolve("http://gpu-box:8470", env=env, path=path).token is None
    assert resolve(env={"CORRAL_HOME": str(tmp_path / "none")}, path=path).token is None
