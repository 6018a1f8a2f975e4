"""Real processes on loopback: `corral server` and `corral agent`, driven over HTTP.

Each process's output is read by a thread into a list, so a test can wait
for a line ("connected to ...") and a failure shows the process's log.
Waiting is polling with a deadline (``eventually``), never a fixed sleep.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

ADMIN = "corral_admin_e2e-test-admin-token"
T = TypeVar("T")
CLI = "from corral.cli.main import main; main()"


class Proc:
    """A subprocess whose combined output is collected line by line."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.lines: list[str] = []
        self.popen = subprocess.Popen(
            argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float = 30.0, after: int = 0) -> re.Match[str]:
        """The first output line (from index ``after``) matching ``pattern``."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines[after:]:
                if m := rx.search(line):
                    return m
            if self.popen.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.02)
        raise AssertionError(f"{self.name}: no line matching {pattern!r}\n{self.log()}")

    def log(self) -> str:
        return f"--- {self.name} (rc={self.popen.poll()}) ---\n" + "\n".join(self.lines[-60:])

    def kill9(self) -> None:
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(5)

    def interrupt(self, timeout: float = 15.0) -> int:
        """SIGINT (Ctrl-C) and wait for the exit code."""
        self.popen.send_signal(signal.SIGINT)
        return self.popen.wait(timeout)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self._reader.join(5)
        if self.popen.stdout is not None:
            self.popen.stdout.close()


@dataclass
class Cluster:
    """A server and its agents, all subprocesses; stopped at the end of the test."""

    tmp: Path
    procs: list[Proc] = field(default_factory=list)
    server: Proc | None = None
    http: str = ""
    agents_url: str = ""
    http_port: int = 0
    agent_port: int = 0

    def start_server(self, *, node_timeout: float = 2.0, **env: str) -> Proc:
        """``corral server`` on free ports (the same ports again after a restart)."""
        settings = {
            "CORRAL_ADMIN_TOKEN": ADMIN,
            "CORRAL_AGENTS__PORT": str(self.agent_port),
            "CORRAL_SCHEDULING__LIVENESS_TICK_S": "0.2",
            "CORRAL_SCHEDULING__DEBOUNCE_S": "0.001",
            "CORRAL_SCHEDULING__RETRY_BACKOFF_S": "0.1",
            "CORRAL_SCHEDULING__STOP_SLACK_S": "5",
            "CORRAL_API__SSE_POLL_S": "0.2",
            **env,
        }
        argv = [sys.executable, "-c", CLI, "server", "--home", str(self.tmp / "server")]
        argv += ["--port", str(self.http_port), "--node-timeout", str(node_timeout)]
        proc = self._spawn("server", argv, settings)
        self.http = proc.wait_for(r"listening on (http://\S+)").group(1)
        self.agents_url = proc.wait_for(r"--server (grpc://\S+)").group(1)
        self.http_port = int(self.http.rsplit(":", 1)[1])
        self.agent_port = int(self.agents_url.rsplit(":", 1)[1])
        self.server = proc
        return proc

    def start_agent(self, name: str, *args: str, token: str = ADMIN, wait: bool = True) -> Proc:
        """``corral agent`` for node ``name``; waits until it has connected."""
        argv = [sys.executable, "-c", CLI, "agent", "--server", self.agents_url, "--name", name]
        argv += ["--token", token, "--work-dir", str(self.tmp / name), *args]
        proc = self._spawn(f"agent {name}", argv, {})
        if wait:
            proc.wait_for(r"connected to grpc://")
        return proc

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> Proc:
        full = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
        proc = Proc(name, argv, full | {"PYTHONUNBUFFERED": "1"} | env)
        self.procs.append(proc)
        return proc

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.http, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
        )

    def logs(self) -> str:
        return "\n".join(p.log() for p in self.procs)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


def eventually(probe: Callable[[], T], timeout: float = 15.0, what: str = "condition") -> T:
    """Poll ``probe`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    value = probe()
    while not value:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout}s (last: {value!r})")
        time.sleep(0.05)
        value = probe()
    return value


def submit(client: httpx.Client, **spec: Any) -> dict[str, Any]:
    reply = client.post("/v1/jobs", json=spec)
    assert reply.status_code == 201, reply.text
    job: dict[str, Any] = reply.json()
    return job


def job(client: httpx.Client, job_id: str) -> dict[str, Any]:
    reply = client.get(f"/v1/jobs/{job_id}")
    reply.raise_for_status()
    data: dict[str, Any] = reply.json()
    return data


def wait_state(
    client: httpx.Client, job_id: str, *states: str, timeout: float = 15.0
) -> dict[str, Any]:
    """The job once it is in one of ``states``."""
    return eventually(
        lambda: (j := job(client, job_id))["state"] in states and j,
        timeout,
        f"job {job_id} in {states}",
    )


def events(client: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    """Every event of a job so far (its SSE stream, read until it ends or goes quiet)."""
    out: list[dict[str, Any]] = []
    for frame in sse(client, f"/v1/jobs/{job_id}/events", idle_s=1.0):
        out.append(frame)
    return out


def sse(client: httpx.Client, path: str, idle_s: float = 5.0) -> Iterator[dict[str, Any]]:
    """Parse an SSE stream into ``{"id", "event", "data"}`` frames until it ends or idles."""
    timeout = httpx.Timeout(10, read=idle_s)
    try:
        with client.stream("GET", path, timeout=timeout) as response:
            response.raise_for_status()
            frame: dict[str, Any] = {}
            for line in response.iter_lines():
                if line == "":
                    if "data" in frame:
                        frame["data"] = json.loads(frame["data"])
                        yield frame
                    frame = {}
                elif not line.startswith(":"):
                    key, _, value = line.partition(": ")
                    frame[key] = value
    except httpx.ReadTimeout:
        return
