"""Before an allocation runs: wait for its jobs' models, then keep them pinned while it runs.

The supervisor calls ``ready(...)`` with the order's model specs (from the
server's registry, one per job that names a registered model). Each missing
model is downloaded with job priority (ahead of prefetches); while the job
waits, every change of the download is reported as the job's progress,
``waiting for model sdxl-base: 43%``, so the person who submitted it sees why
it has not started. A stop (cancel, preempt) ends the wait at once; the
download carries on as a prefetch.

A model that cannot be had (every source failed, the cache is full of models
in use, a registry entry the agent cannot read) ends the allocation with a
*retryable* failure naming the model and why, so the server places the job
again, maybe on a node that has the model.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import replace

from corral.agent.executors.base import (
    Failed,
    JobWork,
    Progress,
    StopSignal,
    stopped_terminal,
)
from corral.agent.models import DownloadProgress, ModelError, ModelManager, ModelSpec

Emit = Callable[[Progress, str], None]  # (update, job id)
SpecOrError = ModelSpec | str  # a registry entry, or why the agent could not read it


async def ready(
    models: ModelManager | None,
    specs: Mapping[str, SpecOrError],
    jobs: tuple[JobWork, ...],
    stop: StopSignal,
    emit: Emit,
    held: contextlib.AsyncExitStack,
) -> tuple[JobWork, ...] | Failed:
    """The jobs with their models' paths (pinned until ``held`` closes), or why not."""
    out: list[JobWork] = []
    for job in jobs:
        spec = specs.get(job.job_id)
        if spec is None:
            out.append(job)
            continue
        if isinstance(spec, str):
            return Failed(f"model {job.model}: {spec}", retryable=False)
        if models is None:
            return Failed(
                f"model {spec.name} is needed but this agent has no model cache "
                "(start it with --models-dir and --models-budget)",
                retryable=True,
            )
        waited = await _wait(models, spec, job.job_id, stop, emit)
        if waited is not None:
            return waited
        path = await held.enter_async_context(models.use(spec, job_id=job.job_id))
        out.append(replace(job, model_path=path))
    return tuple(out)


async def _wait(
    models: ModelManager, spec: ModelSpec, job_id: str, stop: StopSignal, emit: Emit
) -> Failed | None:
    """Download ``spec`` for ``job_id`` (reporting progress) unless a stop comes first."""
    last = [""]

    def show(p: DownloadProgress) -> None:
        if job_id in p.jobs and p.message != last[0]:
            last[0] = p.message
            emit(Progress(0.0, message=p.message), job_id)

    forget = models.downloader.add_listener(show)
    fetch = asyncio.ensure_future(models.downloader.ensure(spec, job_id=job_id))
    stopped = asyncio.ensure_future(stop.wait())
    try:
        for p in models.downloader.waiting_for(job_id):
            show(p)  # where it is now, not only from the next change on
        await asyncio.wait({fetch, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not fetch.done():
            fetch.cancel()  # the download itself goes on as a prefetch
            request = stop.requested
            assert request is not None
            terminal = stopped_terminal(request)
            return terminal if isinstance(terminal, Failed) else Failed("stopped", False)
        try:
            fetch.result()
        except ModelError as exc:
            return Failed(str(exc), retryable=True)
        return None
    finally:
        forget()
        stopped.cancel()
        # gather, not suppress(CancelledError): a cancel of this wait itself propagates
        (outcome,) = await asyncio.gather(fetch, return_exceptions=True)
        if isinstance(outcome, Exception) and not isinstance(outcome, ModelError):
            raise outcome
