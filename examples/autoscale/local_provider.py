"""A command provider whose "machines" are ``corral agent`` processes on this computer.

Use it to watch the autoscaler work without a cloud, then copy it and replace
``start_agent`` / ``stop`` with your cloud's API calls::

    CORRAL_AUTOSCALE__POOLS_FILE=pools.yaml \\
    CORRAL_AUTOSCALE__COMMAND="python examples/autoscale/local_provider.py" \\
    corral server

The server runs ``local_provider.py list|launch|terminate`` with a JSON
request on stdin (``corral.server.providers.CommandProvider``):

* ``launch``: ``{"pool": {...}, "names": [...], "server": ..., "token": ...}``
  starts, per name, ``corral agent --server S --name NAME --work-dir DIR/work/NAME``
  with ``--fake-gpus "<gpus>x <gpu_model> <vram>"`` when the pool has GPUs, the
  pool's ``--cpus`` and ``--label``\\s, and the join token in ``CORRAL_AGENT_TOKEN``
  (an environment variable: other users do not see it in ``ps``). Each agent
  runs detached in its own session, logging to ``DIR/logs/NAME.log``, with its
  own work directory (its node key and model cache), so agents never collide.
  A ``request_id`` already seen starts nothing (the server sent the launch
  again, not knowing whether the first one arrived);
* ``list`` prints ``{"members": [{"name", "pool", "launched_at"}]}``: the
  names whose agent process is still alive;
* ``terminate``: ``{"names": [...]}`` sends SIGTERM to each agent's process
  group, then SIGKILL to those still alive after a grace period.

Environment:

* ``CORRAL_LOCAL_PROVIDER_DIR``: where pids, logs and work directories live
  (default ``~/.corral/local-provider``);
* ``CORRAL_BIN``: the corral command line (default ``python -m corral`` with
  this interpreter);
* ``CORRAL_LOCAL_PROVIDER_AGENT_ARGS``: more ``corral agent`` options, e.g.
  ``--handler mypkg.jobs:run``;
* ``CORRAL_LOCAL_PROVIDER_GRACE_S``: seconds between SIGTERM and SIGKILL (default 10);
* ``CORRAL_LOCAL_PROVIDER_LAG_S``: ``list`` leaves out machines launched less than this
  long ago, as a cloud API's list lags behind its launches (default 0), to try the
  autoscaler against one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")  # a node name that is also a file name
POLL_S = 0.1  # how often terminate looks whether the agents have exited


def main(argv: list[str]) -> int:
    """Run one action; a problem goes to stderr with exit code 2 (the server shows both)."""
    if len(argv) != 2 or argv[1] not in ("list", "launch", "terminate"):
        print("usage: local_provider.py list|launch|terminate < request.json", file=sys.stderr)
        return 2
    home = Path(os.environ.get("CORRAL_LOCAL_PROVIDER_DIR", "~/.corral/local-provider"))
    state = State(home.expanduser())
    request: dict[str, Any] = json.loads(sys.stdin.read() or "{}")
    try:
        if argv[1] == "list":
            shown = time.time() - float(os.environ.get("CORRAL_LOCAL_PROVIDER_LAG_S", "0"))
            members = [m for m in state.members() if m["launched_at"] <= shown]
            print(json.dumps({"members": members}))
        elif argv[1] == "launch":
            launch(state, request)
        else:
            terminate(state, request["names"])
    except KeyError as exc:
        print(f"local_provider {argv[1]}: the request has no {exc}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as exc:
        print(f"local_provider {argv[1]}: {exc}", file=sys.stderr)
        return 2
    return 0


def launch(state: State, request: dict[str, Any]) -> None:
    """Start one agent per name, once per request id; a name whose agent already runs is
    left alone."""
    pool = request["pool"]
    seen = state.request(str(request.get("request_id", "")))
    if seen is not None and seen.exists():
        return
    for name in request["names"]:
        if not NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a usable node name")
        if state.alive(name):
            continue
        args = agent_args(pool, name, request["server"], state.work(name))
        pid = start_agent(args, request["token"], state.log(name))
        state.save(name, {"name": name, "pool": pool["name"], "pid": pid, "at": time.time()})
    if seen is not None:
        seen.touch()


def agent_args(pool: dict[str, Any], name: str, server: str, work: Path) -> list[str]:
    """The ``corral agent`` command line for one machine of ``pool``."""
    corral = os.environ.get("CORRAL_BIN")
    args = shlex.split(corral) if corral else [sys.executable, "-m", "corral"]
    args += ["agent", "--server", server, "--name", name, "--work-dir", str(work)]
    args += ["--cpus", str(pool.get("cpus", 1))]
    if pool.get("gpus", 0) > 0:
        model = (pool.get("gpu_model") or "GPU").replace(",", " ")
        args += ["--fake-gpus", f"{pool['gpus']}x {model} {size_text(pool['vram_bytes'])}"]
    for key, value in sorted(pool.get("labels", {}).items()):
        args += ["--label", f"{key}={value}"]
    return args + shlex.split(os.environ.get("CORRAL_LOCAL_PROVIDER_AGENT_ARGS", ""))


def size_text(n: int) -> str:
    """Bytes as ``corral agent --fake-gpus`` reads them: ``24GiB``, exact when it can be."""
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n / 1024**2:.6f}MiB"


def start_agent(args: list[str], token: str, log: Path) -> int:
    """Start the agent detached (own session, no inherited pipes); return its pid."""
    env = {**os.environ, "CORRAL_AGENT_TOKEN": token}
    with log.open("ab") as out:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # outlives this script; its group is what terminate stops
        )
    return proc.pid


def terminate(state: State, names: list[str]) -> None:
    """SIGTERM each agent's process group, SIGKILL what is left after the grace period."""
    grace_s = float(os.environ.get("CORRAL_LOCAL_PROVIDER_GRACE_S", "10"))
    running = [name for name in names if NAME.fullmatch(name) and state.alive(name)]
    for name in running:
        signal_group(state.pid(name), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(state.alive(n) for n in running) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    for name in running:
        if state.alive(name):
            signal_group(state.pid(name), signal.SIGKILL)
    for name in names:
        if NAME.fullmatch(name):
            state.forget(name)


def signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


class State:
    """One JSON record per machine in ``<home>/members``; logs and work directories beside."""

    def __init__(self, home: Path) -> None:
        self.home = home
        for sub in ("members", "logs", "work", "requests"):
            (home / sub).mkdir(parents=True, exist_ok=True)

    def members(self) -> list[dict[str, Any]]:
        """The machines whose agent is alive; records of dead ones are dropped."""
        out = []
        for path in sorted((self.home / "members").glob("*.json")):
            name = path.stem
            record = self.load(name)
            if record is None or not process_alive(record["pid"], name):
                self.forget(name)
                continue
            out.append({"name": name, "pool": record["pool"], "launched_at": record["at"]})
        return out

    def alive(self, name: str) -> bool:
        record = self.load(name)
        return record is not None and process_alive(record["pid"], name)

    def pid(self, name: str) -> int:
        record = self.load(name)
        return int(record["pid"]) if record else 0

    def load(self, name: str) -> dict[str, Any] | None:
        try:
            record: dict[str, Any] = json.loads(self.record(name).read_text())
        except FileNotFoundError:
            return None
        return record

    def save(self, name: str, record: dict[str, Any]) -> None:
        path = self.record(name)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, path)  # readers see the old record or the new one, never half

    def forget(self, name: str) -> None:
        self.record(name).unlink(missing_ok=True)

    def record(self, name: str) -> Path:
        return self.home / "members" / f"{name}.json"

    def request(self, request_id: str) -> Path | None:
        """The marker of a launch request id seen (None: the request carries none)."""
        if not request_id:
            return None
        return self.home / "requests" / hashlib.sha256(request_id.encode()).hexdigest()

    def log(self, name: str) -> Path:
        return self.home / "logs" / f"{name}.log"

    def work(self, name: str) -> Path:
        return self.home / "work" / name


def process_alive(pid: int, name: str) -> bool:
    """Whether ``pid`` still runs and is this agent (not an exited zombie, not a reused pid).

    Where there is no ``/proc`` (macOS), only whether the pid exists.
    """
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # the pid went to another user's process
        return False
    if not Path("/proc/self").exists():
        return True
    proc = Path(f"/proc/{pid}")
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        argv = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return state not in ("Z", "X") and name.encode() in argv


if __name__ == "__main__":
    sys.exit(main(sys.argv))
