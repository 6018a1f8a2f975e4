"""The supervisor: what the server wants run (desired) becomes what runs (observed).

The link hands it ``Order``s (assignments) and stop orders; it runs each
order as its own task through ``execute()`` with the executor the order asks
for (its backend, else the one configured for its kind, else the default),
and reports every update to ``sink`` as a ``Report`` tagged with allocation,
attempt and job. It never starts work it was not given and never queues
work locally: concurrency on this node is exactly what the scheduler
assigned.

An order with several jobs (a batch of samples) runs them one after another
under one stop signal; their results are gathered into one ``Done``. A
failure ends the whole order (the server requeues its jobs).

An allocation that ended stays *held* until the link says the server
acknowledged its end (``acknowledge``): the hello after a reconnect lists it,
so the server waits for the resent result instead of declaring the work lost.

Over 400 lines on purpose: starting, stopping, superseding and acknowledging work all act
on the same slots; what stands alone lives beside it (``vram_guard``, ``model_gate``,
``inputs``, ``checkpoints``, ``gang_gate``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from corral.agent.executors.base import (
    Executor,
    Failed,
    Finished,
    JobWork,
    LogLine,
    Progress,
    Ready,
    Started,
    StopSignal,
    Update,
    stopped_terminal,
)
from corral.agent.executors.runner import TIMEOUT_GRACE_S, execute
from corral.agent.fingerprint import GpuSnapshot
from corral.agent.gang_gate import GangGate
from corral.agent.inputs import InputFetcher
from corral.agent.model_gate import ready
from corral.agent.models import ModelManager
from corral.agent.orders import Done, Held, JobResult, Order, Report
from corral.agent.vram_guard import Reservation, VramGuard, process_tree
from corral.core import Clock
from corral.core.model_names import lacked
from corral.core.states import StopReason

log = logging.getLogger("corral.agent")

SHUTDOWN_GRACE_S = 10.0
"""On agent shutdown, running work gets this long to checkpoint before it is abandoned."""


@runtime_checkable
class OwnsProcesses(Protocol):
    """Executors that run work in child processes say which, for the VRAM guard."""

    def root_pid(self, allocation_id: str) -> int | None: ...


@runtime_checkable
class Warms(Protocol):
    """Executors that can get ready for a run ahead of it (``command.py``'s zygotes): at the
    agent's start, and while a gang replica prepares, so its go does not wait for them."""

    async def warm(self, assignment: JobWork | None) -> None: ...
    async def cool(self) -> None: ...


@dataclass
class _Slot:
    order: Order
    stop: StopSignal = field(default_factory=StopSignal)
    executor: Executor | None = None
    task: asyncio.Task[None] | None = None
    finished: bool = False
    progress: float = 0.0
    # A batch: the job running now and its own stop signal (``stop`` reaches it too), and
    # the jobs stopped on their own (``stop_job``: skipped, or stopped while they run).
    running: str = ""
    job_stop: StopSignal | None = None
    dropped: dict[str, StopReason] = field(default_factory=dict)
    # A result names a file kept for it, or a run ended otherwise (it may have left some):
    # the allocation's results folder is deleted once its end is acknowledged.
    kept_files: bool = False


class Supervisor:
    def __init__(
        self,
        executors: Mapping[str, Executor],
        clock: Clock,
        *,
        default: str,
        by_kind: Mapping[str, str] | None = None,
        timeout_grace_s: float = TIMEOUT_GRACE_S,
        guard: VramGuard | None = None,
        models: ModelManager | None = None,
    ) -> None:
        if default not in executors:
            raise ValueError(f"default executor {default!r} is not among {sorted(executors)}")
        self.executors = dict(executors)
        self._owners = any(isinstance(e, OwnsProcesses) for e in executors.values())
        self.clock = clock
        self.default = default
        self.by_kind = dict(by_kind or {})
        self.timeout_grace_s = timeout_grace_s
        self.guard = guard or VramGuard()
        self.models = models  # the model cache: jobs wait for their models (model_gate.py)
        self.on_change: Callable[[], None] = lambda: None  # work started or ended (loaded models)
        # work failed because a backend lacks a model: the agent lists its backends' models again
        self.on_lacking: Callable[[], None] = lambda: None
        self.sink: Callable[[Report], None] = lambda report: None
        # Readies a job before it runs (fetches an uploaded checkpoint: checkpoints.py).
        self.prepare: Callable[[JobWork], Awaitable[JobWork]] | None = None
        self.inputs: InputFetcher | None = None  # fetches a job's input files (inputs.py)
        self.intake_open = True  # the server's word; it only affects what it sends
        self.gang = GangGate()  # gang replicas wait for the server's go (gang_gate.py)
        self._slots: dict[str, _Slot] = {}
        self._warming: set[asyncio.Task[None]] = set()
        self._by_job: dict[str, str] = {}  # job id -> the allocation holding its latest attempt

    @property
    def backends(self) -> list[str]:
        return sorted(self.executors)

    def assign(self, order: Order) -> bool:
        """Start ``order``. False when it is already held (a resent assignment)."""
        if order.allocation_id in self._slots:
            return False
        self._supersede(order)
        slot = _Slot(order)
        self._slots[order.allocation_id] = slot
        name = order.backend or self.by_kind.get(order.kind) or self.default
        slot.executor = self.executors.get(name)
        if slot.executor is None:
            error = f"this node has no {name!r} executor (it offers {', '.join(self.backends)})"
            self._emit(slot, Started())
            self._end(slot, Failed(error, retryable=True))
            return True
        slot.task = asyncio.get_running_loop().create_task(
            self._run(slot), name=f"corral-alloc-{order.allocation_id}"
        )
        return True

    def _supersede(self, order: Order) -> None:
        """Stop older attempts of the same jobs still running here.

        The server assigns a new attempt only after it has given up on the old
        one (say the node was taken for lost while its connection was down), so
        an older attempt still running here is a zombie: two attempts of one job
        must not share its GPU and checkpoint directory. (Its reports would be
        refused as stale anyway.)
        """
        for job in order.jobs:
            alloc_id = self._by_job.get(job.job_id)
            slot = self._slots.get(alloc_id) if alloc_id is not None else None
            if slot is None or slot.order.attempt >= order.attempt:
                continue
            self._by_job[job.job_id] = order.allocation_id
            if not slot.finished:
                note = f"superseded by attempt {order.attempt}"
                log.info("allocation %s: %s", alloc_id, note)
                self.stop(slot.order.allocation_id, StopReason.CANCEL, 0.0, note)
        for job in order.jobs:
            self._by_job.setdefault(job.job_id, order.allocation_id)

    def stop(self, allocation_id: str, reason: StopReason, grace_s: float, note: str = "") -> bool:
        """Ask a running allocation to stop. False when it is not running here."""
        slot = self._slots.get(allocation_id)
        if slot is None or slot.finished:
            return False
        slot.stop.request(reason, max(0.0, grace_s), note)
        if slot.job_stop is not None:
            slot.job_stop.request(reason, max(0.0, grace_s), note)
        return True

    def stop_job(
        self, allocation_id: str, job_id: str, reason: StopReason, grace_s: float = 0.0
    ) -> bool:
        """One job of a running batch was cancelled or interrupted on its own: skip it, or
        stop it now if it runs (an interrupt keeps what it made); the batch goes on with the
        others. False when there is nothing to stop."""
        slot = self._slots.get(allocation_id)
        if slot is None or slot.finished or job_id in slot.dropped:
            return False
        if job_id not in {j.job_id for j in slot.order.jobs}:
            return False
        slot.dropped[job_id] = reason
        running = slot.job_stop if slot.running == job_id else None
        log.info(
            "allocation %s: job %s was %s; %s, the batch goes on",
            allocation_id,
            job_id,
            "interrupted" if reason is StopReason.INTERRUPT else "cancelled",
            "stopping it" if running is not None else "skipping it",
        )
        if running is not None:
            running.request(reason, max(0.0, grace_s), "stopped on its own")
        return True

    def held(self) -> list[Held]:
        observed = {True: "finished", False: "running"}
        return [
            Held(s.order.allocation_id, s.order.attempt, observed[s.finished], s.progress)
            for s in self._slots.values()
        ]

    def acknowledge(self, allocation_id: str) -> None:
        """The server has this allocation's end: forget it."""
        slot = self._slots.get(allocation_id)
        if slot is not None and slot.finished:
            del self._slots[allocation_id]
            for job in slot.order.jobs:
                if self._by_job.get(job.job_id) == allocation_id:
                    del self._by_job[job.job_id]
            if slot.kept_files:  # its result files were sent and taken
                _drop_scratch(slot.order)

    def running(self) -> list[str]:
        return [a for a, s in self._slots.items() if not s.finished]

    def busy_gpus(self) -> set[int]:  # the GPU indices running work holds
        return {i for s in self._slots.values() if not s.finished for i in s.order.gpu_indices}

    def process_owners(self) -> dict[int, str]:
        """pid -> allocation, for work running in child processes (see ``OwnsProcesses``)."""
        owners: dict[int, str] = {}
        if not self._owners:
            return owners
        for alloc_id, slot in self._slots.items():
            if slot.finished or not isinstance(slot.executor, OwnsProcesses):
                continue
            root = slot.executor.root_pid(alloc_id)
            if root is not None:
                owners |= dict.fromkeys(process_tree(root), alloc_id)
        return owners

    def check_vram(self, snapshot: GpuSnapshot, owners: Mapping[int, str]) -> list[str]:
        """Stop allocations over their VRAM reservation; returns their ids."""
        if not owners:
            return []
        reservations = [
            Reservation(a, s.order.gpu_indices, s.order.vram_bytes)
            for a, s in self._slots.items()
            if a in owners.values()
        ]
        stopped = []
        for v in self.guard.observe(snapshot, reservations, owners):
            if self.stop(v.allocation_id, StopReason.CANCEL, 0.0, v.error):
                log.warning("%s", v.error)
                stopped.append(v.allocation_id)
        return stopped

    def warm_up(self) -> None:
        """Let the executors that can get ready for their configured work start now."""
        for executor in self.executors.values():
            if isinstance(executor, Warms):
                task = asyncio.get_running_loop().create_task(executor.warm(None))
                self._warming.add(task)
                task.add_done_callback(self._warming.discard)

    async def shutdown(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Preempt everything running (so it checkpoints) and wait for it to end; then let
        the executors drop what they kept warm."""
        tasks = [s.task for s in self._slots.values() if s.task is not None and not s.finished]
        for alloc_id in self.running():
            self.stop(alloc_id, StopReason.PREEMPT, grace_s, "the agent is shutting down")
        if tasks:
            await asyncio.wait(tasks, timeout=grace_s + 3.0)
        for task in tasks:
            task.cancel()
        # gather, not each under suppress(CancelledError): a cancel of shutdown itself propagates
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(e.cool() for e in self.executors.values() if isinstance(e, Warms)))

    async def _run(self, slot: _Slot) -> None:
        try:
            await self._run_jobs(slot)
        except asyncio.CancelledError:
            if not slot.finished:
                self._end(slot, Failed("the agent abandoned the work", retryable=True))
            raise
        except Exception as exc:  # a bug here must still end the allocation
            log.exception("allocation %s crashed", slot.order.allocation_id)
            slot.kept_files = True  # whatever it left goes once the end is acknowledged
            if not slot.finished:
                self._end(slot, Failed(f"agent error: {type(exc).__name__}: {exc}", False))

    async def _run_jobs(self, slot: _Slot) -> None:
        """Wait for the order's models (pinned while it runs), then run its jobs."""
        order = slot.order
        async with contextlib.AsyncExitStack() as held:
            jobs = order.jobs
            if order.model_specs:

                def emit(update: Progress, job_id: str) -> None:
                    self._emit(slot, update, job_id)

                got = await ready(self.models, order.model_specs, jobs, slot.stop, emit, held)
                if isinstance(got, Failed):
                    self._end(slot, got)
                    return
                jobs = got
            self.on_change()
            try:
                await self._run_ready(slot, jobs)
            finally:
                self.on_change()

    async def _run_ready(self, slot: _Slot, jobs: tuple[JobWork, ...]) -> None:
        """Run the order's jobs in turn. A batch cut short (a job failed, or a stop came
        between jobs) reports what finished before with the failure, so those jobs keep
        their results and the ones that never ran are not counted as failed."""
        assert slot.executor is not None
        results, modified, finished = list[JobResult](), dict[str, str](), list[str]()
        stopped: list[str] = []  # stopped on their own (``stop_job``) without a result
        started = False

        def before() -> Done | None:
            return Done(tuple(results), modified, jobs=tuple(finished)) if finished else None

        for index, job in enumerate(jobs):
            if job.job_id in slot.dropped:
                stopped.append(job.job_id)  # stopped on its own before its turn
                continue
            job = await self._prepared(slot, job)
            terminal = await self._with_inputs(
                slot, job, index, batch=len(jobs) > 1, first=not started
            )
            started = True
            alone = job.job_id in slot.dropped and slot.stop.requested is None
            if alone and not isinstance(terminal, Finished):
                stopped.append(job.job_id)  # stopped on its own while it ran: the batch goes on
                continue
            if not isinstance(terminal, Finished):
                failure = terminal or Failed("no result (a bug)", retryable=False)
                failing = job.job_id if len(jobs) > 1 and failure.stopped is None else ""
                self._end(slot, failure, failing, before())
                return
            results += [JobResult(job.job_id, r) for r in terminal.results]
            slot.kept_files = slot.kept_files or any(r.path for r in terminal.results)
            modified |= terminal.modified
            finished.append(job.job_id)
            request = slot.stop.requested
            if request is not None and request.reason is not StopReason.INTERRUPT:
                halted = _failed(stopped_terminal(request))  # the batch was stopped
                self._end(slot, halted, "", before() if index + 1 < len(jobs) else None)
                return
            if request is not None or (terminal.interrupted and not alone):
                self._end(slot, Done(tuple(results), modified, interrupted=True))
                return
        self._end(slot, Done(tuple(results), modified, stopped=tuple(stopped)))

    async def _run_one(
        self, slot: _Slot, job: JobWork, index: int, *, batch: bool, first: bool
    ) -> Finished | Failed | None:
        """Run one job of the order; its terminal (None: the executor gave none, a bug).
        Only the order's ``first`` job reports ``Started`` (a gang replica's, once its gang
        is ready: ``gang_gate.py``); a ``batch``'s job gets a stop signal of its own
        (``stop_job``)."""
        assert slot.executor is not None
        if first and job.gang is not None and self.gang.enabled:

            def say_ready() -> None:
                self._emit(slot, Ready(), job.job_id)

            warm = slot.executor.warm(job) if isinstance(slot.executor, Warms) else None
            request = await self.gang.ready(slot.order.allocation_id, slot.stop, say_ready, warm)
            if request is not None:
                return _failed(stopped_terminal(request))
        terminal: Finished | Failed | None = None
        signal = _job_signal(slot, job.job_id) if batch else slot.stop
        updates = execute(
            slot.executor, job, signal, self.clock, timeout_grace_s=self.timeout_grace_s
        )
        try:
            async for update in updates:
                if isinstance(update, Started):
                    if first:
                        self._emit(slot, update, job.job_id)
                elif isinstance(update, Finished | Failed):
                    terminal = update
                else:
                    self._track(slot, update, index)
                    self._emit(slot, update, job.job_id)
        finally:
            slot.running, slot.job_stop = "", None
            if not isinstance(terminal, Finished) and job.results_root is not None:
                slot.kept_files = True  # a failed or stopped run may have left files too
        return terminal

    async def _with_inputs(
        self, slot: _Slot, job: JobWork, index: int, *, batch: bool, first: bool
    ) -> Finished | Failed | None:
        """Run one job with its input files fetched first (and removed after): a file that
        cannot be fetched fails the attempt retryably, before anything ran."""
        if not job.inputs or self.inputs is None:
            return await self._run_one(slot, job, index, batch=batch, first=first)
        try:
            try:
                ready = await self.inputs.fetch(job)
            except Exception as exc:  # the server refused it, or the link kept breaking
                log.warning("job %s: cannot fetch its input files: %s", job.job_id, exc)
                return Failed(f"could not fetch the job's input files: {exc}", retryable=True)
            return await self._run_one(slot, ready, index, batch=batch, first=first)
        finally:
            await self.inputs.discard(job)

    async def _prepared(self, slot: _Slot, job: JobWork) -> JobWork:
        if self.prepare is None or not job.resume_from:
            return job
        ready = await self.prepare(job)
        if ready.resume_from is None:
            note = f"could not fetch the checkpoint {job.resume_from}; starting from the beginning"
            self._emit(slot, LogLine(note, "agent"), job.job_id)
        return ready

    def _track(self, slot: _Slot, update: Update, index: int) -> None:
        if isinstance(update, Progress):
            slot.progress = (index + update.fraction) / max(1, len(slot.order.jobs))

    def _emit(
        self, slot: _Slot, update: Update | Done, job_id: str = "", before: Done | None = None
    ) -> None:
        order = slot.order
        self.sink(Report(order.allocation_id, order.attempt, update, job_id, before))

    def _end(
        self,
        slot: _Slot,
        terminal: Done | Failed,
        job_id: str = "",
        before: Done | None = None,
    ) -> None:
        slot.finished = True
        slot.progress = 1.0 if isinstance(terminal, Done) else slot.progress
        if isinstance(terminal, Failed) and lacked(terminal.error):
            self.on_lacking()
        self._emit(slot, terminal, job_id, before)


def _drop_scratch(order: Order) -> None:
    """Delete the folder where the order's result files waited (``JobWork.scratch_dir``:
    ``<results_root>/<allocation>/<job>``)."""
    roots = {job.results_root for job in order.jobs if job.results_root is not None}
    for root in roots:
        shutil.rmtree(root / order.allocation_id, ignore_errors=True)


def _job_signal(slot: _Slot, job_id: str) -> StopSignal:
    """The stop signal of one job of a batch: a stop of the whole batch reaches it (also one
    asked for before it started), and ``Supervisor.stop_job`` stops it alone."""
    signal = StopSignal()
    request = slot.stop.requested
    if request is not None:
        signal.request(request.reason, request.grace_s, request.note)
    slot.running, slot.job_stop = job_id, signal
    return signal


def _failed(terminal: Finished | Failed) -> Failed:
    return terminal if isinstance(terminal, Failed) else Failed("stopped", retryable=False)
