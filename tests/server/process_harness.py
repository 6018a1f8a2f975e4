"""``corral server`` as a real child process: start it, read its banner, kill it (-9 too)."""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

_URL = re.compile(r"listening on (http://\S+)")
_TOKEN = re.compile(r"admin token: (\S+)")


def corral_command() -> list[str]:
    script = Path(sys.executable).parent / "corral"
    if script.exists():
        return [str(script)]
    found = shutil.which("corral")
    return [found] if found else [sys.executable, "-c", "from corral.cli.main import main; main()"]


class ServerProcess:
    """One ``corral server --port 0`` process on ``db``, with its home in ``home``."""

    def __init__(self, db: str, home: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.db = db
        self.home = home
        self.extra = extra
        self.env = env or {}
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        self.url = ""
        self.admin_token: str | None = None

    def start(self, timeout: float = 60.0) -> ServerProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")} | self.env
        args = [
            *corral_command(),
            "server",
            "--db",
            self.db,
            "--home",
            str(self.home),
            "--port",
            "0",
            "--agent-port",
            "0",
            "--log-level",
            "warning",
            *self.extra,
        ]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self._pumper = threading.Thread(target=self._pump, daemon=True)
        self._pumper.start()
        deadline = time.monotonic() + timeout
        while not self.url:
            self._read_line(deadline)
        self._wait_healthy(deadline)
        while True:  # the banner is printed before the app accepts requests: it is all here
            try:
                self._note(self.lines.get_nowait())
            except queue.Empty:
                break
        return self

    def _pump(self) -> None:
        assert self.proc is not None
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def _read_line(self, deadline: float) -> None:
        try:
            self._note(self.lines.get(timeout=max(0.01, deadline - time.monotonic())))
        except queue.Empty:
            raise AssertionError(
                "corral server printed no banner:\n" + "\n".join(self.output)
            ) from None
        if (
            self.proc is not None
            and self.proc.poll() is not None
            and self.lines.empty()
            and not self.url
        ):
            raise AssertionError("corral server exited:\n" + "\n".join(self.output))

    def _note(self, line: str) -> None:
        self.output.append(line)
        if m := _URL.search(line):
            self.url = m.group(1)
        if m := _TOKEN.search(line):
            self.admin_token = m.group(1)

    def _wait_healthy(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError("corral server never became healthy:\n" + "\n".join(self.output))

    def kill9(self) -> None:
        """SIGKILL: no shutdown code runs, as in a power cut of the process."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self._reap()

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        assert self.proc is not None
        self.proc.wait(timeout=10)
        self._pumper.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
