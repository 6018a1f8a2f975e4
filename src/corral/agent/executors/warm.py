"""Warm start: a command that is a Python script runs forked from a zygote that has
already imported its heavy modules (``zygote.py``), instead of a fresh interpreter
that imports them again. A rank of a DDP gang spends seconds in ``import torch``;
forked, it is in its own ``main`` in milliseconds.

What is warmed is a *preload set*: the modules named by the job's ``payload.preload``,
else by the agent's ``--preload``; an empty set means a cold start. One zygote per
(interpreter, preload set), at most ``ZYGOTES_MAX``, each started at the agent's start
(for its configured command) or while a gang replica prepares, before it says ready.
A run never waits for a zygote still importing (it would wait about as long as a cold
start takes): it starts cold. A zygote that died is started again at the next use (up
to ``RESTARTS_MAX`` times); one that could not preload (an import failed, it
initialised CUDA) is not retried until the agent restarts. Whenever no zygote can fork
the run, it starts as a plain subprocess, and the job's log says why.

Only a command that is ``python [-u] [-B] script.py ...`` or ``python [-u] [-B] -m
module ...`` can start warm; anything else (another program, other interpreter
flags, the ``torchrun`` launcher) starts cold.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import socket
import tempfile
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.agent.executors import zygote as zygote_main
from corral.core import InvalidSpec

log = logging.getLogger("corral.agent")

ZYGOTES_MAX = 4
"""Zygotes an agent keeps: each holds its modules in memory (``torch`` alone takes
hundreds of MB), and a node runs few distinct training environments."""

PRELOAD_TIMEOUT_S = 300.0
"""How long a zygote may take to import its modules (torch from a cold disk takes tens of
seconds) before it is taken for hung, killed, and its runs start cold."""

RESTARTS_MAX = 5
"""Times a zygote that died is started again in an agent's life: one that keeps dying
(killed for memory, say) would otherwise cost an import per run."""

CLOSE_WAIT_S = 5.0
"""How long a zygote gets to exit once told to, before it is killed."""

INTERPRETER = re.compile(r"python(\d+(\.\d+)*)?")
FLAGS = frozenset({"-u", "-B"})  # flags a forked child honours as the fresh interpreter would
MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


class ZygoteUnavailable(Exception):
    """No zygote can fork this run (the run starts cold)."""


@dataclass(frozen=True, slots=True)
class Entry:
    """A command that is a Python entry point: the interpreter and what it runs."""

    python: str
    module: str | None
    script: str | None
    args: tuple[str, ...]


def python_entry(argv: Sequence[str], path: str | None = None) -> Entry | None:
    """``argv`` as a Python entry point (``path``: the PATH to find the interpreter on);
    None when it is anything else."""
    if not argv or not INTERPRETER.fullmatch(os.path.basename(argv[0])):
        return None
    python = shutil.which(argv[0], path=path)
    if python is None:
        return None
    rest = list(argv[1:])
    while rest and rest[0] in FLAGS:
        rest.pop(0)
    if len(rest) >= 2 and rest[0] == "-m" and MODULE_NAME.fullmatch(rest[1]):
        return Entry(os.path.abspath(python), rest[1], None, tuple(rest[2:]))
    if rest and not rest[0].startswith("-"):
        return Entry(os.path.abspath(python), None, rest[0], tuple(rest[1:]))
    return None


def preload_of(payload: Mapping[str, object], default: Sequence[str]) -> tuple[str, ...]:
    """The payload's ``preload`` (module names), else ``default``."""
    value = payload.get("preload")
    if value is None:
        return tuple(default)
    if not isinstance(value, list) or not all(
        isinstance(v, str) and MODULE_NAME.fullmatch(v) for v in value
    ):
        raise InvalidSpec("payload.preload", f"must be a list of module names, got {value!r}")
    return tuple(value)


class WarmProcess:
    """A run forked by a zygote, seen as ``asyncio.subprocess.Process`` is: its pid, its
    output streams, its exit code (None: unknown, the zygote died before reporting it)."""

    def __init__(
        self,
        pid: int,
        stdout: asyncio.StreamReader,
        stderr: asyncio.StreamReader,
        status: asyncio.StreamReader,
        closing: asyncio.StreamWriter,
    ) -> None:
        self.pid, self.stdout, self.stderr = pid, stdout, stderr
        self._status, self._closing = status, closing
        self._code: int | None = None
        self._ended = False

    async def wait(self) -> int | None:
        if not self._ended:
            line = await self._status.readline()
            try:
                self._code = int(line)
            except ValueError:  # the zygote ended first: wait for the run itself
                await _gone(self.pid)
            self._ended = True
            self._closing.close()
        return self._code


class Zygote:
    """One zygote process for one (interpreter, preload set)."""

    def __init__(self, python: str, modules: tuple[str, ...]) -> None:
        self.python, self.modules = python, modules
        self._dir = Path(tempfile.mkdtemp(prefix="corral-zygote-"))  # private: mode 0700
        self._socket = str(self._dir / "fork.sock")
        self._proc: asyncio.subprocess.Process | None = None
        self._ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._errors: deque[str] = deque(maxlen=5)
        self._closing = False  # told to exit: its end is no news
        self._task = asyncio.get_running_loop().create_task(self._start())

    @property
    def refused(self) -> bool:
        """It ended without ever being ready: its preload fails."""
        return self._ready.done() and bool(self._ready.result())

    @property
    def dead(self) -> bool:
        return self._proc is not None and self._proc.returncode is not None

    @property
    def forks(self) -> bool:
        """It has preloaded and is alive: a run forked now starts warm."""
        return self._ready.done() and not self._ready.result() and not self.dead

    async def ready(self) -> str:
        """Wait until it can fork; "" then, else why it cannot."""
        return await asyncio.shield(self._ready)

    async def spawn(
        self,
        entry: Entry,
        env: Mapping[str, str],
        cwd: Path,
        cpus: frozenset[int] | None,
        limit: int,
    ) -> WarmProcess:
        """Fork ``entry`` with ``env`` in ``cwd`` on ``cpus`` (``limit``: the longest output
        line read); ``ZygoteUnavailable`` if it cannot now. A zygote still importing is not
        waited for: the run would wait as long as a cold start takes."""
        if not self.forks:
            refusal = self._ready.result() if self._ready.done() else ""
            raise ZygoteUnavailable(refusal or "the zygote is still importing")
        if self.dead:
            raise ZygoteUnavailable("the zygote has ended")
        body: dict[str, object] = {"module": entry.module, "script": entry.script}
        body["args"] = list(entry.args)
        body |= {"env": dict(env), "cwd": str(cwd), "cpus": sorted(cpus) if cpus else None}
        data = json.dumps(body).encode()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, self._socket)
            socket.send_fds(sock, [zygote_main.HEADER.pack(len(data))], [out_w, err_w])
            await loop.sock_sendall(sock, data)
            status, closing = await asyncio.open_unix_connection(sock=sock)
            pid = int(await status.readline())
        except (OSError, ValueError) as exc:
            sock.close()
            for fd in (out_r, err_r):
                os.close(fd)
            why = str(exc) or type(exc).__name__
            raise ZygoteUnavailable(f"the zygote did not fork: {why}") from exc
        finally:
            for fd in (out_w, err_w):
                os.close(fd)
        stdout, stderr = await _reader(out_r, limit), await _reader(err_r, limit)
        return WarmProcess(pid, stdout, stderr, status, closing)

    async def aclose(self) -> None:
        """Tell it to exit (its children run on) and wait; killed if it does not."""
        proc = self._proc
        self._closing = True
        if proc is not None and proc.returncode is None:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), CLOSE_WAIT_S)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        shutil.rmtree(self._dir, ignore_errors=True)

    async def _start(self) -> None:
        try:
            self._proc = proc = await asyncio.create_subprocess_exec(
                self.python,
                "-u",
                zygote_main.__file__,
                self._socket,
                *self.modules,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # the terminal's Ctrl-C is for the agent, which closes it
            )
        except OSError as exc:
            self._ready.set_result(f"cannot start {self.python}: {exc}")
            return
        assert proc.stdout is not None
        assert proc.stderr is not None
        errors = asyncio.ensure_future(self._read_errors(proc.stderr))
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), PRELOAD_TIMEOUT_S)
        except TimeoutError:
            self._errors.append(f"no word after {PRELOAD_TIMEOUT_S:g} s")
            proc.kill()
            line = b""
        if line.startswith(b"ready"):
            self._ready.set_result("")
            log.info("zygote %s preloaded %s", line.split()[-1].decode(), ", ".join(self.modules))
        code = await proc.wait()
        await errors
        why = " | ".join(self._errors) or f"exit code {code}"
        if not self._ready.done():
            self._ready.set_result(f"the zygote could not preload {', '.join(self.modules)}: {why}")
        if not self._closing:
            log.warning("zygote for %s ended: %s", ", ".join(self.modules), why)

    async def _read_errors(self, stderr: asyncio.StreamReader) -> None:
        async for raw in stderr:
            self._errors.append(raw.decode("utf-8", "replace").rstrip())


class Zygotes:
    """The agent's zygotes, by (interpreter, preload set)."""

    def __init__(self, limit: int = ZYGOTES_MAX) -> None:
        self._limit = limit
        self._zygotes: dict[tuple[str, tuple[str, ...]], Zygote] = {}
        self._restarts: dict[tuple[str, tuple[str, ...]], int] = {}

    def get(self, python: str, modules: tuple[str, ...]) -> Zygote | None:
        """The zygote for ``modules`` under ``python``, started if there is none or it died;
        None when there are ``limit`` other sets already."""
        key = (python, tuple(sorted(set(modules))))
        found = self._zygotes.get(key)
        if found is not None and found.dead and not found.refused:
            self._restarts[key] = restarts = self._restarts.get(key, 0) + 1
            if restarts > RESTARTS_MAX:
                return found  # it keeps dying: its runs start cold (and say so)
            log.warning("zygote for %s died: starting another", ", ".join(key[1]))
            asyncio.get_running_loop().create_task(found.aclose())
            found = None
        if found is None:
            if len(self._zygotes) >= self._limit and key not in self._zygotes:
                return None
            found = self._zygotes[key] = Zygote(*key)
        return found

    async def aclose(self) -> None:
        zygotes, self._zygotes = list(self._zygotes.values()), {}
        await asyncio.gather(*(z.aclose() for z in zygotes))


async def _reader(fd: int, limit: int) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=limit)
    pipe = os.fdopen(fd, "rb", buffering=0)
    await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), pipe
    )
    return reader


async def _gone(pid: int) -> None:
    """Wait until ``pid`` (not our child) has ended."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    ended = loop.create_future()

    def end() -> None:
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(fd, end)
    try:
        await ended
    finally:
        loop.remove_reader(fd)
        os.close(fd)
