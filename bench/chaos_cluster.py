"""The chaos harness's processes: server replicas, agents and their proxies, all real.

Every process is a child of the harness in its own process group, killed with
``SIGKILL`` when the harness says so (or when it ends), and restarted on the
same ports, names and directories, as an operator's supervisor would.

* replicas: ``corral server`` on one database (a fresh PostgreSQL schema, or
  a SQLite file for a single server), sharing one blob directory (results
  and checkpoints must be readable from every replica);
* agents: ``corral agent`` with the ``chaos_work`` handler and fake GPUs,
  each dialling every replica through its own proxy (``chaos_proxy``), so
  its connections can be cut without killing it.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from pg_schema import drop_schema

ADMIN = "corral_admin_chaos-harness-token"
CLI = "from corral.cli.main import main; main()"
BENCH = Path(__file__).resolve().parent
PG = "postgresql://postgres@127.0.0.1:5432/test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    """A child process that can be killed and started again the same way."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.starts += 1

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill9(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return f"--- {self.name} ---\n" + "\n".join(text[-lines:])


@dataclass
class Replica:
    proc: Proc
    http: str
    agent_port: int


@dataclass
class Cluster:
    """Replicas, agents and proxies of one chaos run."""

    tmp: Path
    db: str
    replicas: list[Replica] = field(default_factory=list)
    agents: list[Proc] = field(default_factory=list)
    proxies: list[Proc] = field(default_factory=list)
    schema: str | None = None

    @classmethod
    def create(cls, tmp: Path, *, postgres: bool) -> Cluster:
        if not postgres:
            return cls(tmp, str(tmp / "corral.db"))
        schema = f"chaos_{uuid.uuid4().hex[:10]}"
        return cls(tmp, f"{PG}?schema={schema}", schema=schema)

    def add_replicas(self, n: int, node_timeout: float) -> None:
        for i in range(n):
            http_port, agent_port = free_port(), free_port()
            argv = [sys.executable, "-c", CLI, "server", "--db", self.db, "--home"]
            argv += [str(self.tmp / f"server-{i}"), "--blob-dir", str(self.tmp / "blobs")]
            argv += ["--port", str(http_port), "--agent-port", str(agent_port)]
            argv += ["--node-timeout", str(node_timeout), "--log-level", "warning"]
            env = _env(
                CORRAL_ADMIN_TOKEN=ADMIN,
                CORRAL_SCHEDULING__LIVENESS_TICK_S="0.5",
                CORRAL_SCHEDULING__RETRY_BACKOFF_S="0.2",
                CORRAL_SCHEDULING__PREEMPTION_GRACE_S="5",
                CORRAL_SCHEDULING__STOP_GRACE_S="3",
                CORRAL_SCHEDULING__STOP_SLACK_S="10",
                CORRAL_SCHEDULING__RESYNC_S="3",
                CORRAL_SCHEDULING__IDLE_CYCLE_S="1",
                CORRAL_API__SSE_POLL_S="0.3",
            )
            proc = Proc(f"server-{i}", argv, env, self.tmp / f"server-{i}.log")
            self.replicas.append(Replica(proc, f"http://127.0.0.1:{http_port}", agent_port))

    def add_agents(self, n: int, gpus: int, ledger: Path) -> None:
        for i in range(n):
            ports = [free_port() for _ in self.replicas]
            pairs = [f"{p}:{r.agent_port}" for p, r in zip(ports, self.replicas, strict=True)]
            proxy = [sys.executable, str(BENCH / "chaos_proxy.py"), *pairs]
            name = f"agent-{i}"
            self.proxies.append(Proc(f"proxy-{i}", proxy, _env(), self.tmp / f"proxy-{i}.log"))
            servers = ",".join(f"grpc://127.0.0.1:{p}" for p in ports)
            argv = [sys.executable, "-c", CLI, "agent", "--server", servers, "--name", name]
            argv += ["--token", ADMIN, "--handler", "chaos_work:run", "--cpus", "2"]
            argv += ["--fake-gpus", f"{gpus}x RTX 4090 24GiB", "--work-dir", str(self.tmp / name)]
            argv += ["--log-level", "warning"]
            env = _env(PYTHONPATH=f"{BENCH}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
            env["CHAOS_LEDGER"] = str(ledger)
            self.agents.append(Proc(name, argv, env, self.tmp / f"{name}.log"))

    async def start(self, timeout: float = 60.0) -> None:
        """Servers one after another (the first migrates the store), then proxies and agents."""
        for r in self.replicas:
            r.proc.start()
            await wait_healthy(r, timeout)
        for p in self.proxies:
            p.start()
        for a in self.agents:
            a.start()

    def stop(self) -> None:
        for proc in [*self.agents, *self.proxies, *(r.proc for r in self.replicas)]:
            proc.kill9()
        if self.schema:
            drop_schema(self.schema)

    def logs(self, lines: int = 30) -> str:
        procs = [*(r.proc for r in self.replicas), *self.agents[:2]]
        return "\n".join(p.tail(lines) for p in procs)


async def wait_healthy(replica: Replica, timeout: float) -> float:
    """Seconds until ``/healthz`` answers 200 (raises when the process dies or time runs out)."""
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=2) as http:
        while time.monotonic() - started < timeout:
            if not replica.proc.alive:
                raise RuntimeError(f"{replica.proc.name} exited:\n{replica.proc.tail()}")
            try:
                if (await http.get(f"{replica.http}/healthz")).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{replica.proc.name} never became healthy:\n{replica.proc.tail()}")


_LEADER = re.compile(r"^corral_scheduling_leader (\S+)$", re.MULTILINE)


async def leading(http: httpx.AsyncClient, replica: Replica) -> bool:
    """Whether ``replica`` says (``/metrics``) it runs the scheduling loop."""
    if not replica.proc.alive:
        return False
    try:
        text = (await http.get(f"{replica.http}/metrics", timeout=2)).text
    except httpx.HTTPError:
        return False
    m = _LEADER.search(text)
    return bool(m and float(m.group(1)) == 1.0)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    return env | {"PYTHONUNBUFFERED": "1"} | extra
