"""``execute``: run one assignment through an executor, with the guarantees
the supervisor relies on whatever the executor does.

* ``Started`` first, exactly one terminal update last, nothing after it;
* the job's timeout becomes a ``timeout`` stop (with ``timeout_grace_s``);
* an executor that ignores a stop for longer than its grace (plus
  ``ABANDON_MARGIN_S``) is abandoned and the terminal written for it;
* an executor that raises or ends without a terminal gets one synthesised,
  retryable when the error says so (``ExecutorError.retryable``,
  ``Unavailable``, connection errors).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Coroutine
from dataclasses import dataclass
from typing import Any

from corral.agent.executors.base import (
    Executor,
    Failed,
    Finished,
    JobWork,
    Started,
    StopSignal,
    Terminal,
    Update,
    stopped_terminal,
)
from corral.core import Clock, ExecutorError, InvalidSpec, Unavailable
from corral.core.states import StopReason

TIMEOUT_GRACE_S = 10.0
"""Grace a timed-out job gets to wrap up: long enough to write a small checkpoint."""

ABANDON_MARGIN_S = 2.0
"""Extra time past the grace before an unresponsive executor is abandoned: the
executor's own grace handling (SIGKILL after SIGTERM) gets to act first."""


@dataclass(frozen=True, slots=True)
class _Ended:
    error: BaseException | None = None
    abandoned: bool = False


async def execute(
    executor: Executor,
    assignment: JobWork,
    stop: StopSignal,
    clock: Clock,
    *,
    timeout_grace_s: float = TIMEOUT_GRACE_S,
) -> AsyncIterator[Update]:
    """Yield ``Started``, the executor's updates, then exactly one terminal."""
    yield Started()
    queue: asyncio.Queue[Update | _Ended] = asyncio.Queue()
    producer = asyncio.create_task(_pump(executor.run(assignment, stop), queue))
    watchdog = _Watchdog(stop, clock, producer)
    if assignment.timeout_s is not None:
        watchdog.start(_time_out(assignment.timeout_s, timeout_grace_s, stop, clock))
    terminal: Terminal | None = None
    ended = _Ended()
    try:
        while True:
            item = await queue.get()
            if isinstance(item, _Ended):
                ended = item
                break
            if terminal is not None:
                continue  # an executor bug: nothing may follow the terminal
            if isinstance(item, Finished | Failed):
                terminal = item
            yield item
    finally:
        tasks = [producer, *watchdog.close()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if terminal is None:
        yield synthesise_terminal(executor.name, stop, ended.error, abandoned=ended.abandoned)


def synthesise_terminal(
    executor: str, stop: StopSignal, error: BaseException | None, *, abandoned: bool = False
) -> Terminal:
    """The terminal for a run that produced none (it raised, vanished or hung)."""
    request = stop.requested
    if error is not None:
        return failure_from(error, executor)
    if request is not None:
        if abandoned:
            note = f"{executor} did not stop within {request.grace_s:g}s; abandoned"
            joined = f"{request.note}; {note}" if request.note else note
            request = type(request)(request.reason, request.grace_s, joined)
        return stopped_terminal(request)
    return Failed(f"{executor} executor ended without a result (a bug)", retryable=False)


def failure_from(error: BaseException, executor: str) -> Failed:
    """Turn an exception into a ``Failed`` that says whether a retry may help."""
    if isinstance(error, ExecutorError):
        return Failed(str(error), retryable=error.retryable)
    if isinstance(error, InvalidSpec):  # a bad payload is wrong everywhere: no retry
        return Failed(str(error), retryable=False)
    if isinstance(error, Unavailable | ConnectionError | TimeoutError):
        return Failed(f"{executor}: {error}", retryable=True)
    return Failed(f"{executor}: {type(error).__name__}: {error}", retryable=False)


async def _pump(updates: AsyncIterator[Update], queue: asyncio.Queue[Update | _Ended]) -> None:
    try:
        async for update in updates:
            queue.put_nowait(update)
    except asyncio.CancelledError:
        queue.put_nowait(_Ended(abandoned=True))
        raise
    except Exception as exc:
        queue.put_nowait(_Ended(error=exc))
    else:
        queue.put_nowait(_Ended())
    finally:
        aclose = getattr(updates, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()


class _Watchdog:
    """Abandons the producer when it outlives a stop's grace (plus ``ABANDON_MARGIN_S``).

    It costs a run nothing until a stop arrives: a callback on the stop's future
    starts the timer then. ``start`` adds a task of its own (the timeout's).
    """

    def __init__(self, stop: StopSignal, clock: Clock, producer: asyncio.Task[None]) -> None:
        self._stop, self._clock, self._producer = stop, clock, producer
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = stop.future()
        self._stopped.add_done_callback(self._on_stop)

    def start(self, work: Coroutine[Any, Any, None]) -> None:
        self._tasks.append(asyncio.ensure_future(work))

    def close(self) -> list[asyncio.Task[None]]:
        """Stop watching; the tasks to cancel and reap."""
        self._stopped.remove_done_callback(self._on_stop)
        return self._tasks

    def _on_stop(self, _: object) -> None:
        self.start(self._abandon())

    async def _abandon(self) -> None:
        request = self._stop.requested
        assert request is not None
        await self._clock.sleep(request.grace_s + ABANDON_MARGIN_S)
        self._producer.cancel()


async def _time_out(timeout_s: float, grace_s: float, stop: StopSignal, clock: Clock) -> None:
    """Turn the job's timeout into a stop (unless another stop comes first)."""
    timed_out = await first_of(clock.sleep(timeout_s), stop.wait()) == 0
    if timed_out:
        stop.request(StopReason.TIMEOUT, grace_s, f"after {timeout_s:g}s")


async def first_of(*awaitables: Awaitable[Any]) -> int:
    """Wait for the first of ``awaitables`` to finish, cancel the rest, return its index.

    The winner's exception propagates; the losers' are discarded.
    """
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        index = next(i for i, task in enumerate(tasks) if task in done)
        tasks[index].result()  # re-raise the winner's exception, if any
        return index
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
