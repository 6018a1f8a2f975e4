"""corral as a peer of the end-to-end benchmark: a real server and K real agents.

The client side is what a web app does: submit over HTTP and follow one
``/v1/events`` SSE stream for every job (a background thread routes each
event to the job waiting for it), so start and completion are timed as a
client watching SSE sees them. The HTTP client is the standard library's
(``plain_http.py``, the default) or httpx (``client="httpx"``).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from pg_schema import drop_schema_of
from plain_http import PlainHttp
from workload import Timing

HERE = Path(__file__).resolve().parent
ADMIN = "corral_admin_bench-e2e-token-for-the-peer-run"
CLI = "from corral.cli.main import main; main()"
BATCH = 500  # jobs per POST /v1/jobs/batch
WATCHED = ("job.started", "job.succeeded", "job.failed")  # the events a waiting client needs
CLIENTS = ("stdlib", "httpx")  # the HTTP client the load generator uses (see plain_http.py)
ONE_JOB = b'{"kind": "custom", "resources": {"cpus": 1}}'


class CorralPeer:
    def __init__(
        self,
        agents: int,
        db: str | None = None,
        label: str = "corral",
        sqlite_sync: str = "",
        server_env: dict[str, str] | None = None,
        client: str = "stdlib",
    ) -> None:
        if client not in CLIENTS:
            raise ValueError(f"client must be one of {', '.join(CLIENTS)}, not {client!r}")
        self.name = label
        self.client = client
        self._sqlite_sync = sqlite_sync  # "" keeps the server's default (FULL)
        self._server_env = dict(server_env or {})  # settings for the server, e.g. A/B runs
        self._tmp = tempfile.TemporaryDirectory(prefix="corral-e2e-")
        self._closed = False
        self._procs: list[subprocess.Popen[str]] = []
        try:
            self._start(agents, db, Path(self._tmp.name))
        except BaseException:
            self.close()  # never leave a server or agents behind
            raise

    def _start(self, agents: int, db: str | None, home: Path) -> None:
        if db is not None:
            drop_schema_of(db)  # each run starts empty: an earlier run's rows skew the figures
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        path = os.pathsep.join(filter(None, (str(HERE), os.environ.get("PYTHONPATH"))))
        env |= {"CORRAL_ADMIN_TOKEN": ADMIN, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
        if self._sqlite_sync:
            env["CORRAL_STORE__SQLITE_SYNCHRONOUS"] = self._sqlite_sync
        server_env = env | self._server_env
        argv = [sys.executable, "-c", CLI, "server", "--home", str(home), "--port", "0"]
        argv += ["--agent-port", "0"]  # never the default port: another server may hold it
        argv += ["--log-level", "warning"] + (["--db", db] if db else [])
        self._procs.append(
            subprocess.Popen(
                argv, env=server_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
        banner = _read_until(self._procs[0], r"--server (grpc://\S+)")
        self.url = re.search(r"listening on (http://\S+)", banner).group(1)  # type: ignore[union-attr]
        grpc = re.search(r"--server (grpc://\S+)", banner).group(1)  # type: ignore[union-attr]
        for i in range(agents):
            a = [sys.executable, "-c", CLI, "agent", "--server", grpc, "--token", ADMIN]
            a += ["--name", f"bench-{i}", "--handler", "e2e_noop:noop", "--cpus", "64"]
            a += ["--work-dir", str(home / f"agent-{i}"), "--log-level", "warning"]
            self._procs.append(
                subprocess.Popen(a, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
        self._http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {ADMIN}"},
            timeout=60,
            limits=httpx.Limits(max_connections=64),
        )
        self._plain = PlainHttp(self.url, {"Authorization": f"Bearer {ADMIN}"})
        self._waiters: dict[str, _Waiter] = {}
        self._lock = threading.Lock()
        self._listener = threading.Thread(target=self._listen, daemon=True)
        self._listener.start()
        self._wait_agents(agents)

    def _wait_agents(self, n: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self._http.get("/v1/nodes").json()) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only some of {n} agents connected within {timeout}s")
            time.sleep(0.1)

    # ---- the client ---------------------------------------------------------

    def round_trip(self) -> Timing:
        w = _Waiter(time.perf_counter())
        return self._register(self._post("/v1/jobs", ONE_JOB)["id"], w).wait()

    def stamped_trip(self) -> tuple[str, float, float, float]:
        """One round trip in wall-clock seconds, comparable with the server's event times
        (``events``): the job's id, when it was submitted, when the submission's answer
        arrived, and when the waiting client heard of its end."""
        w = _Waiter(time.perf_counter())
        submitted = time.time()
        job_id = self._post("/v1/jobs", ONE_JOB)["id"]
        answered = time.time()
        self._register(job_id, w).wait()
        return job_id, submitted, answered, time.time()

    def events(self) -> list[dict[str, Any]]:
        """The server's whole event log (``GET /v1/events/export``), oldest first."""
        reply = self._http.get("/v1/events/export")
        reply.raise_for_status()
        return [json.loads(line) for line in reply.text.splitlines() if line]

    def submit_all_then_wait(self, n: int) -> list[Timing]:
        waiters = []
        for start in range(0, n, BATCH):
            count = min(BATCH, n - start)
            w_at = time.perf_counter()
            body = json.dumps({"jobs": [{"resources": {"cpus": 1}}] * count}).encode()
            jobs = self._post("/v1/jobs/batch", body)["jobs"]
            waiters += [self._register(j["id"], _Waiter(w_at)) for j in jobs]
        return [w.wait() for w in waiters]

    def _post(self, path: str, body: bytes) -> Any:
        """POST ``body`` with the chosen client; its JSON answer."""
        if self.client == "stdlib":
            return json.loads(self._plain.post(path, body))
        reply = self._http.post(path, content=body, headers={"Content-Type": "application/json"})
        reply.raise_for_status()
        return reply.json()

    def _register(self, job_id: str, w: _Waiter) -> _Waiter:
        with self._lock:
            early = self._waiters.get(job_id)
            if early is not None:  # its events arrived before the submit returned
                w.started, w.done = early.started, early.done
                if early.done is not None:
                    w.event.set()
            self._waiters[job_id] = w
        return w

    def _listen(self) -> None:
        last = 0
        while not self._closed:
            if self.client == "stdlib":
                try:
                    # ``after``: from the start of the log, not from "now" (the default)
                    watched = {"kind": list(WATCHED), "after": [str(last)]}
                    for kind, seq, job_id in self._plain.events("/v1/events", watched, last):
                        last = seq
                        self._on_event(kind, job_id)
                except (OSError, http.client.HTTPException):
                    time.sleep(0.1)
                continue
            try:
                headers = {"Last-Event-ID": str(last)} if last else {}
                with self._http.stream(
                    "GET",
                    "/v1/events",
                    # not submitted/placed: never read here; all of them, not only from "now"
                    params={"kind": list(WATCHED), "after": last},
                    headers=headers,
                    timeout=httpx.Timeout(60, read=None),
                ) as r:
                    for kind, seq, job_id in _frames(r.iter_lines()):
                        last = seq
                        self._on_event(kind, job_id)
            except httpx.HTTPError:
                time.sleep(0.1)

    def _on_event(self, kind: str, job_id: str | None) -> None:
        if job_id is None or kind not in WATCHED:
            return
        now = time.perf_counter()
        with self._lock:
            w = self._waiters.setdefault(job_id, _Waiter(0.0))
            if kind == "job.started":
                w.started = w.started or now
            else:
                w.done = now
                w.event.set()

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds used so far by the server, all agents (Linux ``/proc``; else {}) and
        this client process (its HTTP calls and SSE parsing)."""
        try:
            used = [_proc_cpu_s(p.pid) for p in self._procs]
        except OSError:
            return {}
        return {"server": used[0], "agents": sum(used[1:]), "client": time.process_time()}

    def metrics(self) -> str:
        """The server's Prometheus text (``GET /metrics``)."""
        return self._http.get("/metrics").text

    def close(self) -> None:
        self._closed = True  # the listener stops instead of reconnecting
        for p in reversed(self._procs):
            p.terminate()
        for p in self._procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout is not None:
                p.stdout.close()
        if hasattr(self, "_http"):
            self._http.close()
            self._plain.close()  # the listener's stream ends (EOF), and so does the listener
            self._listener.join(10)
        self._tmp.cleanup()


class _Waiter:
    def __init__(self, submitted: float) -> None:
        self.submitted = submitted
        self.started: float | None = None
        self.done: float | None = None
        self.event = threading.Event()

    def wait(self, timeout: float = 300) -> Timing:
        if not self.event.wait(timeout):
            raise TimeoutError("a job did not finish within 300 s")
        assert self.done is not None
        started = self.started or self.done
        return Timing(started - self.submitted, self.done - self.submitted)


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _frames(lines: Iterator[str]) -> Iterator[tuple[str, int, str | None]]:
    kind, seq = "", 0
    for line in lines:
        if line.startswith("id:"):
            seq = int(line[3:])
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            yield kind, seq, json.loads(line[5:]).get("job_id")


def _read_until(proc: subprocess.Popen[str], pattern: str, timeout: float = 60) -> str:
    text, deadline = "", time.monotonic() + timeout
    assert proc.stdout is not None
    while not re.search(pattern, text):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"corral server did not start:\n{text}")
        text += proc.stdout.readline()
    threading.Thread(target=_drain, args=(proc.stdout,), daemon=True).start()
    return text


def _drain(out: Any) -> None:
    """Read a process's output to its end (so it never blocks on a full pipe)."""
    with contextlib.suppress(OSError, ValueError):  # closed under it by ``CorralPeer.close``
        for _ in out:
            pass
