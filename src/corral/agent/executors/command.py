"""The command executor: a subprocess per job (training runs, scripts).

The process gets its job through the environment (``CORRAL_JOB_ID``,
``CORRAL_ATTEMPT``, ``CUDA_VISIBLE_DEVICES``, ``CORRAL_CHECKPOINT_DIR``,
``CORRAL_RESUME_FROM``, ``CORRAL_OUTPUT_DIR``, ... see ``job_env``; a gang's replica
also ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ... see ``distributed.py``) and talks
back with plain lines on stdout or stderr (see ``corral.agent.executors.lines``);
every other line is streamed as a log line. Files it leaves in
``CORRAL_OUTPUT_DIR`` are its results. Its exit code decides: 0 succeeds,
75 (``EX_TEMPFAIL``) or death by a signal nobody sent fails retryably, any other
code fails for good. A stop sends SIGTERM to its whole process group, then
SIGKILL after the grace period.

A Python entry point (``python train.py``) with a preload set (the agent's
``--preload``, or the payload's ``preload``) is forked from a zygote that has
imported those modules already (``warm.py``), and otherwise behaves as the plain
subprocess it replaces; the plain subprocess is the fallback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import tempfile
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from corral.agent.executors.base import (
    Failed,
    Finished,
    JobWork,
    LogLine,
    Progress,
    Result,
    StopSignal,
    Update,
    monotone,
    stopped_terminal,
)
from corral.agent.executors.distributed import gang_env, launch_argv, launcher_of
from corral.agent.executors.lines import ResultFile, file_result, parse_line, read_result
from corral.agent.executors.warm import (
    Entry,
    Zygote,
    Zygotes,
    ZygoteUnavailable,
    preload_of,
    python_entry,
)
from corral.agent.topology import Topology
from corral.core import Clock, ExecutorError, InvalidSpec

log = logging.getLogger("corral.agent")

EX_TEMPFAIL = 75
"""sysexits.h "temporary failure": the conventional 'try again later' exit code."""

LINE_LIMIT = 1 << 20
"""Longest output line kept (1 MiB); longer ones are dropped with a note."""

STDERR_TAIL = 10
"""stderr lines quoted in the error of a failed command."""


class Running(Protocol):
    """A started command: a plain subprocess or one forked by a zygote (``WarmProcess``)."""

    @property
    def pid(self) -> int: ...
    @property
    def stdout(self) -> asyncio.StreamReader | None: ...
    @property
    def stderr(self) -> asyncio.StreamReader | None: ...
    async def wait(self) -> int | None: ...


class CommandExecutor:
    """Runs ``command`` (or the payload's ``command``) as a subprocess per job; Python
    entry points forked from a zygote preloading ``preload`` (``warm.py``)."""

    def __init__(
        self,
        clock: Clock,
        command: Sequence[str] | None = None,
        *,
        allow_payload_command: bool = True,
        workdir: Path | None = None,
        name: str = "command",
        topology: Topology | None = None,
        preload: Sequence[str] = (),
    ) -> None:
        self._clock = clock
        self._workdir = (workdir or Path.cwd()).resolve()
        self._command = list(command) if command else None
        self._allow_payload_command = allow_payload_command
        self._name = name
        self._topology = topology  # pins a job to its GPUs' NUMA nodes' CPUs when known
        self._pids: dict[str, int] = {}  # allocation id -> its process (the VRAM guard asks)
        self._preload = tuple(preload)
        self._zygotes = Zygotes()

    @property
    def name(self) -> str:
        return self._name

    def root_pid(self, allocation_id: str) -> int | None:
        """The process running ``allocation_id`` (its children are found from it)."""
        return self._pids.get(allocation_id)

    async def run(self, assignment: JobWork, stop: StopSignal) -> AsyncIterator[Update]:
        argv = launch_argv(
            self._argv(assignment.payload), assignment, launcher_of(assignment.payload)
        )
        if stop.requested is not None:  # stopped before it began: do not even start it
            yield stopped_terminal(stop.requested)
            return
        out_dir = Path(tempfile.mkdtemp(prefix=f"corral-{assignment.allocation_id}-"))
        keep = assignment.scratch_dir  # results stay there as files until the server has them
        try:
            env = job_env(assignment, out_dir, _payload_env(assignment.payload))
            cpus = self._topology.cpus_for(assignment.gpu_indices) if self._topology else None
            if cpus is not None:
                env["CORRAL_CPUS"] = ",".join(map(str, sorted(cpus)))
            proc, note = await self._start(argv, env, assignment, cpus)
            self._pids[assignment.allocation_id] = proc.pid
            if note:
                yield LogLine(note, "agent")
            if cpus is not None and self._topology is not None:
                pin(proc.pid, cpus)
                yield LogLine(self._topology.describe(assignment.gpu_indices), "agent")
            async for update in self._supervise(proc, stop, out_dir, keep):
                yield update
        finally:
            self._pids.pop(assignment.allocation_id, None)
            shutil.rmtree(out_dir, ignore_errors=True)

    async def warm(self, assignment: JobWork | None) -> None:
        """Start the zygote ``assignment`` will be forked from and wait until it has
        preloaded (None: the configured command's); nothing if it starts cold."""
        payload = assignment.payload if assignment is not None else {}
        try:
            found = self._warm_entry(self._argv(payload), payload)
        except InvalidSpec:
            return  # the run itself says what is wrong
        if found is not None:
            await found[0].ready()

    async def cool(self) -> None:
        """Stop the zygotes (the runs they forked go on)."""
        await self._zygotes.aclose()

    async def _start(
        self, argv: list[str], env: dict[str, str], job: JobWork, cpus: frozenset[int] | None
    ) -> tuple[Running, str]:
        """Start the command: forked from its zygote when it can be, else a subprocess;
        and a line for the job's log saying which."""
        found = self._warm_entry(argv, job.payload)
        if found is None:
            return await _spawn(argv, env, self._workdir), ""
        zygote, entry = found
        try:
            proc = await zygote.spawn(entry, env, self._workdir, cpus, LINE_LIMIT)
        except ZygoteUnavailable as exc:
            log.warning("job %s: warm start unavailable (%s): starting cold", job.job_id, exc)
            self._zygotes.get(zygote.python, zygote.modules)  # one that died: again, for the next
            note = f"warm start unavailable ({exc}); started cold"
            return await _spawn(argv, env, self._workdir), note
        return proc, f"started warm: forked with {', '.join(zygote.modules)} preloaded"

    def _warm_entry(
        self, argv: list[str], payload: Mapping[str, object]
    ) -> tuple[Zygote, Entry] | None:
        """The zygote and entry point to fork ``argv`` with; None when it starts cold."""
        modules = preload_of(payload, self._preload)
        if not modules or launcher_of(payload):  # torchrun's workers are its own to start
            return None
        path = _payload_env(payload).get("PATH", os.environ.get("PATH"))
        entry = python_entry(argv, path)
        if entry is None:
            return None
        zygote = self._zygotes.get(entry.python, modules)
        return None if zygote is None else (zygote, entry)

    def _argv(self, payload: Mapping[str, object]) -> list[str]:
        """The command line: the configured command plus ``args``, or the payload's command."""
        if self._command is not None:
            return self._command + _strings(payload.get("args", []), "payload.args")
        if not self._allow_payload_command:
            raise InvalidSpec("payload.command", "this agent runs only its configured command")
        command = payload.get("command")
        if isinstance(command, str):
            command = shlex.split(command)
        argv = _strings(command, "payload.command")
        if not argv:
            raise InvalidSpec("payload.command", "missing: give the command line to run")
        return argv

    async def _supervise(
        self,
        proc: Running,
        stop: StopSignal,
        out_dir: Path,
        keep: Path | None = None,
    ) -> AsyncIterator[Update]:
        queue: asyncio.Queue[tuple[str, str] | None] = asyncio.Queue()
        assert proc.stdout is not None
        assert proc.stderr is not None
        readers = [
            asyncio.create_task(_read_lines(proc.stdout, "stdout", queue)),
            asyncio.create_task(_read_lines(proc.stderr, "stderr", queue)),
        ]
        killer = asyncio.create_task(self._kill_when_stopped(proc, stop))
        tail: deque[str] = deque(maxlen=STDERR_TAIL)
        result_files: list[ResultFile] = []
        last = 0.0
        try:
            async for stream, line in _until_closed(queue, len(readers)):
                if stream == "stderr":
                    tail.append(line)
                update = parse_line(line, stream, self._workdir)
                if isinstance(update, ResultFile):
                    result_files.append(update)
                    continue
                if isinstance(update, Progress):
                    update = monotone(update, last)
                    last = update.fraction
                yield update
            code = await proc.wait()
        finally:
            killer.cancel()
            _kill_group(proc, signal.SIGKILL)  # leftovers of a finished command, too
            await proc.wait()
            await asyncio.gather(*readers, killer, return_exceptions=True)
        results = await asyncio.to_thread(_collect_results, out_dir, result_files, keep)
        yield _terminal(code, stop, results, list(tail))

    async def _kill_when_stopped(self, proc: Running, stop: StopSignal) -> None:
        request = await stop.wait()
        _kill_group(proc, signal.SIGTERM)
        await self._clock.sleep(request.grace_s)
        _kill_group(proc, signal.SIGKILL)


def pin(pid: int, cpus: frozenset[int]) -> None:
    """Keep ``pid`` on ``cpus`` (its GPUs' NUMA nodes): set as it starts, before it makes
    its threads, which inherit it."""
    with contextlib.suppress(OSError):  # it ended already, or the CPUs went offline
        os.sched_setaffinity(pid, cpus)


def job_env(assignment: JobWork, out_dir: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """The environment a job's process runs with; corral's own variables win over ``extra``."""
    env = {**os.environ, **extra, "PYTHONUNBUFFERED": "1", **gang_env(assignment)}
    checkpoint_dir = assignment.checkpoint_dir
    if checkpoint_dir is not None:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
    env.update(
        CORRAL_JOB_ID=assignment.job_id,
        CORRAL_JOB_IDS=",".join(assignment.job_ids),
        CORRAL_ALLOCATION_ID=assignment.allocation_id,
        CORRAL_ATTEMPT=str(assignment.attempt),
        CUDA_VISIBLE_DEVICES=",".join(str(i) for i in assignment.gpu_indices),
        CORRAL_CHECKPOINT_DIR=str(checkpoint_dir or ""),
        CORRAL_RESUME_FROM=assignment.resume_from or "",
        CORRAL_RESUME_STEP=str(assignment.resume_step),
        CORRAL_OUTPUT_DIR=str(out_dir),
        CORRAL_MODEL=assignment.model or "",
        CORRAL_MODEL_PATH=str(assignment.model_path or ""),
        CORRAL_PAYLOAD=json.dumps(dict(assignment.payload)),
        # Its input files (uploaded, or a pipeline's earlier steps' results): name -> path.
        CORRAL_INPUTS=json.dumps({f.name: str(f.path) for f in assignment.inputs if f.path}),
        # The host memory it asked for, bytes ("0": none): for the job to size itself by;
        # the agent sets no limit (agent/memory.py says why).
        CORRAL_MEMORY_BYTES=str(assignment.memory_bytes),
    )
    return env


def _payload_env(payload: Mapping[str, object]) -> dict[str, str]:
    extra = payload.get("env", {})
    if not isinstance(extra, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in extra.items()
    ):
        raise InvalidSpec("payload.env", "must be an object of string values")
    return dict(extra)


def _strings(value: object, field: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise InvalidSpec(field, f"must be a list of strings, got {value!r}")
    return list(value)


async def _spawn(argv: list[str], env: dict[str, str], cwd: Path) -> asyncio.subprocess.Process:
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,  # its own process group: a stop reaches its children
            limit=LINE_LIMIT,
        )
    except OSError as exc:  # not found, not executable
        raise ExecutorError(f"cannot start {argv[0]!r}: {exc}", retryable=False) from exc


async def _read_lines(
    reader: asyncio.StreamReader, stream: str, queue: asyncio.Queue[tuple[str, str] | None]
) -> None:
    try:
        while True:
            try:
                raw = await reader.readline()
            except ValueError:  # a line over LINE_LIMIT: asyncio dropped it
                queue.put_nowait(("agent", f"[{stream} line over {LINE_LIMIT} bytes dropped]"))
                continue
            if not raw:
                return
            queue.put_nowait((stream, raw.decode("utf-8", "replace").rstrip("\r\n")))
    finally:
        queue.put_nowait(None)


async def _until_closed(
    queue: asyncio.Queue[tuple[str, str] | None], streams: int
) -> AsyncIterator[tuple[str, str]]:
    while streams:
        item = await queue.get()
        if item is None:
            streams -= 1
            continue
        yield item


def _kill_group(proc: Running, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _collect_results(
    out_dir: Path, named: list[ResultFile], keep: Path | None
) -> tuple[Result, ...]:
    """Files named by ``CORRAL_RESULT`` lines, then files left in the output directory: kept
    as files in ``keep`` (never read into memory: a training run's weights may be large), or
    read when the agent has no such folder."""
    paths = [f.path for f in named] + sorted(p for p in out_dir.iterdir() if p.is_file())
    unique = list(dict.fromkeys(p.resolve() for p in paths))
    if keep is None:
        return tuple(r for r in map(read_result, unique) if r is not None)
    kept = (file_result(p, keep, i) for i, p in enumerate(unique))
    return tuple(r for r in kept if r is not None)


def _terminal(
    code: int | None, stop: StopSignal, results: tuple[Result, ...], tail: list[str]
) -> Finished | Failed:
    request = stop.requested
    if request is not None:
        return stopped_terminal(request, results)
    if code is None:  # forked by a zygote that ended before it could say how the run ended
        return Failed("command ended with an unknown exit status (its zygote died)", True)
    if code == 0:
        return Finished(results)
    reason = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    stderr = ("; last stderr: " + " | ".join(tail)) if tail else ""
    return Failed(f"command {reason}{stderr}", retryable=code == EX_TEMPFAIL or code < 0)
