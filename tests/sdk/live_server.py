"""Real server processes for the SDK and CLI tests.

``corral_server`` runs the ``corral server`` command itself, through the
server tests' ``ServerProcess`` (no agents: jobs stay queued).
``stub_server`` runs ``stub_server.py``: the same control plane with two
in-process stub agents that play each job's payload as a script. Both
listen on a free loopback port with a fresh SQLite database and are
stopped at the end.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from corral.sdk import Retry

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))

from process_harness import ServerProcess, corral_command  # the server tests' own harness

__all__ = [
    "FAST_RETRY",
    "Running",
    "corral_command",
    "corral_server",
    "eventually",
    "free_port",
    "stub_server",
    "touch_when",
]

ADMIN_TOKEN = "corral_admin_sdk-test-token-for-live-servers"
FAST_RETRY = Retry(attempts=4, base_s=0.05, max_s=0.2)  # tests need not wait long
STUB_SCRIPT = Path(__file__).with_name("stub_server.py")
READY = re.compile(r"listening on (http://\S+)")
T = TypeVar("T")


@dataclass
class Running:
    url: str
    token: str
    home: Path
    proc: subprocess.Popen[str]
    output: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def log(self) -> str:
        return "".join(self.output)


@contextmanager
def corral_server(home: Path) -> Iterator[Running]:
    """``corral server`` on a free port with SQLite in ``home`` (the server tests' harness)."""
    proc = ServerProcess(str(home / "corral.db"), home).start()
    try:
        assert proc.proc is not None
        assert proc.admin_token, "no admin token in the banner"
        yield Running(proc.url, proc.admin_token, home, proc.proc, proc.output)
    finally:
        proc.stop()


@contextmanager
def stub_server(home: Path) -> Iterator[Running]:
    with _process([sys.executable, str(STUB_SCRIPT), "--home", str(home)], home) as running:
        yield running


@contextmanager
def _process(cmd: list[str], home: Path, timeout: float = 30.0) -> Iterator[Running]:
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CORRAL_ADMIN_TOKEN": ADMIN_TOKEN, "CORRAL_LOG_LEVEL": "warning"}
    for name in ("CORRAL_URL", "CORRAL_TOKEN", "CORRAL_STORE__DB"):
        env.pop(name, None)
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    output: list[str] = []
    ready = threading.Event()
    found: list[str] = []

    def drain() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            match = READY.search(line)
            if match and not found:
                found.append(match.group(1))
                ready.set()
        ready.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        if not ready.wait(timeout) or not found:
            raise RuntimeError(f"server did not start: {' '.join(cmd)}\n{''.join(output)}")
        yield Running(found[0], ADMIN_TOKEN, home, proc, output)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(5)
        if proc.stdout is not None:
            proc.stdout.close()


def eventually(probe: Callable[[], T], timeout: float = 10.0) -> T:
    """Poll ``probe`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {value!r})")
        time.sleep(0.02)


def free_port() -> int:
    """A loopback port with nothing listening on it (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def touch_when(condition: Callable[[], bool], path: Path, timeout: float = 15.0) -> None:
    """In the background: create ``path`` (a stub job's gate) once ``condition()`` holds, or
    after ``timeout`` seconds anyway so a test that waits on the job cannot hang."""

    def run() -> None:
        deadline = time.monotonic() + timeout
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.01)
        path.touch()

    threading.Thread(target=run, daemon=True).start()
