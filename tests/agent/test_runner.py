"""execute(): the guarantees the supervisor relies on, whatever an executor does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from corral.agent.executors.base import (
    Failed,
    Finished,
    JobWork,
    LogLine,
    Progress,
    Started,
    StopSignal,
    Update,
)
from corral.agent.testing import Harness, run_to_end, stop_on_first_progress
from corral.core import ExecutorError, InvalidSpec, Unavailable, VirtualClock
from corral.core.states import StopReason


class Misbehaving:
    """An executor whose run is the given async generator function."""

    name = "odd"

    def __init__(self, body, clock: VirtualClock) -> None:  # type: ignore[no-untyped-def]
        self._body = body
        self.clock = clock

    def run(self, assignment: JobWork, stop: StopSignal) -> AsyncIterator[Update]:
        return self._body(self.clock, stop)  # type: ignore[no-any-return]


def run(body, job: JobWork | None = None, **kwargs: object) -> tuple[list[Update], float]:  # type: ignore[no-untyped-def]
    clock = VirtualClock()
    harness = Harness(Misbehaving(body, clock), clock, None)  # type: ignore[arg-type]
    updates = asyncio.run(run_to_end(harness, job or JobWork("a", 1, ("j",)), **kwargs))  # type: ignore[arg-type]
    return updates, clock.now()


async def raises(error: BaseException) -> AsyncIterator[Update]:
    yield Progress(0.1)
    raise error


@pytest.mark.parametrize(
    ("error", "want"),
    [
        pytest.param(
            ExecutorError("OOM", retryable=True),
            Failed("OOM", True),
            id="executor-error-keeps-retryable",
        ),
        pytest.param(
            InvalidSpec("payload.x", "bad"),
            Failed("payload.x: bad", False),
            id="bad-payload-never-retried",
        ),
        pytest.param(
            Unavailable("store down"),
            Failed("odd: store down", True),
            id="unavailable-is-retryable",
        ),
        pytest.param(
            ConnectionResetError("reset"),
            Failed("odd: reset", True),
            id="connection-errors-are-retryable",
        ),
        pytest.param(KeyError("k"), Failed("odd: KeyError: 'k'", False), id="bugs-are-not"),
    ],
)
def test_an_executor_that_raises_gets_a_terminal_written_for_it(
    error: BaseException, want: Failed
) -> None:
    updates, _ = run(lambda clock, stop: raises(error))
    assert updates == [Started(), Progress(0.1), want]


def test_an_executor_that_ends_without_a_terminal_is_a_bug_reported_as_such() -> None:
    async def silent(clock: VirtualClock, stop: StopSignal) -> AsyncIterator[Update]:
        yield LogLine("hi")

    updates, _ = run(silent)
    assert updates[-1] == Failed("odd executor ended without a result (a bug)", retryable=False)


def test_nothing_follows_the_terminal() -> None:
    async def chatty(clock: VirtualClock, stop: StopSignal) -> AsyncIterator[Update]:
        yield Finished()
        yield LogLine("after the end")
        yield Failed("and a second terminal", False)

    updates, _ = run(chatty)
    assert updates == [Started(), Finished()]


async def deaf(clock: VirtualClock, stop: StopSignal) -> AsyncIterator[Update]:
    """Ignores stops entirely."""
    while True:
        yield Progress(0.5)
        await clock.sleep(1.0)


def test_an_executor_deaf_to_a_stop_is_abandoned_after_grace_plus_margin() -> None:
    updates, now = run(deaf, on_update=stop_on_first_progress(StopReason.PREEMPT, 30.0))
    assert updates[-1] == Failed(
        "preempted: odd did not stop within 30s; abandoned",
        retryable=True,
        stopped=StopReason.PREEMPT,
    )
    assert now == pytest.approx(32.0)  # grace 30 s + the 2 s margin, on the virtual clock


def test_the_job_timeout_becomes_a_timeout_stop_with_its_own_grace() -> None:
    job = JobWork("a", 1, ("j",), timeout_s=3600.0)
    updates, now = run(deaf, job)
    terminal = updates[-1]
    assert isinstance(terminal, Failed)
    assert terminal.stopped is StopReason.TIMEOUT
    assert terminal.error.startswith("timed out: after 3600s")
    assert now == pytest.approx(3600.0 + 10.0 + 2.0)


def test_the_first_stop_wins_but_a_shorter_grace_applies() -> None:
    stop = StopSignal()
    assert stop.request(StopReason.INTERRUPT, 60.0)
    assert not stop.request(StopReason.CANCEL, 5.0)
    assert stop.requested is not None
    assert (stop.requested.reason, stop.requested.grace_s) == (StopReason.INTERRUPT, 5.0)
    with pytest.raises(ValueError, match="grace_s"):
        stop.request(StopReason.CANCEL, -1)
