"""The settle table: what a job becomes when its allocation ends."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from corral.core.events import EventKind
from corral.core.states import JobState, StopReason
from corral.server.services.outcomes import Ending, backoff_s, settle


@dataclass(frozen=True)
class Case:
    id: str
    ending: Ending
    stop: StopReason | None = None
    failures: int = 0
    max_attempts: int = 3
    retryable: bool = True
    want_state: JobState = JobState.QUEUED
    want_event: EventKind = EventKind.JOB_REQUEUED
    want_counted: bool = False
    want_backoff: bool = False


CASES = [
    Case(
        "finished-is-success",
        Ending.SUCCEEDED,
        want_state=JobState.SUCCEEDED,
        want_event=EventKind.JOB_SUCCEEDED,
    ),
    Case(
        "finished-after-preempt-order-still-success",
        Ending.SUCCEEDED,
        StopReason.PREEMPT,
        want_state=JobState.SUCCEEDED,
        want_event=EventKind.JOB_SUCCEEDED,
    ),
    Case(
        "retryable-failure-requeues-with-backoff",
        Ending.FAILED,
        want_counted=True,
        want_backoff=True,
    ),
    Case(
        "last-attempt-failure-fails",
        Ending.FAILED,
        failures=2,
        want_state=JobState.FAILED,
        want_event=EventKind.JOB_FAILED,
        want_counted=True,
    ),
    Case(
        "non-retryable-fails-at-once",
        Ending.FAILED,
        retryable=False,
        want_state=JobState.FAILED,
        want_event=EventKind.JOB_FAILED,
        want_counted=True,
    ),
    Case("lost-requeues-without-backoff", Ending.LOST, want_counted=True),
    Case(
        "lost-too-often-fails",
        Ending.LOST,
        failures=2,
        want_state=JobState.FAILED,
        want_event=EventKind.JOB_FAILED,
        want_counted=True,
    ),
    Case("preempted-requeues-uncounted", Ending.STOPPED, StopReason.PREEMPT, failures=2),
    Case(
        "timeout-fails",
        Ending.STOPPED,
        StopReason.TIMEOUT,
        want_state=JobState.FAILED,
        want_event=EventKind.JOB_FAILED,
    ),
    Case(
        "interrupt-without-result-cancels",
        Ending.STOPPED,
        StopReason.INTERRUPT,
        want_state=JobState.CANCELLED,
        want_event=EventKind.JOB_CANCELLED,
    ),
    Case(
        "finished-after-interrupt-with-nothing-made-cancels",
        Ending.NOTHING_MADE,
        StopReason.INTERRUPT,
        want_state=JobState.CANCELLED,
        want_event=EventKind.JOB_CANCELLED,
    ),
    Case(
        "cancel-cancels",
        Ending.STOPPED,
        StopReason.CANCEL,
        want_state=JobState.CANCELLED,
        want_event=EventKind.JOB_CANCELLED,
    ),
    Case(
        "stopped-unasked-is-a-retryable-failure",
        Ending.STOPPED,
        want_counted=True,
        want_backoff=True,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_settle(case: Case) -> None:
    got = settle(
        ending=case.ending,
        stop_reason=case.stop,
        failures=case.failures,
        max_attempts=case.max_attempts,
        retryable=case.retryable,
        error="boom",
    )
    assert (got.state, got.event, got.count_failure, got.backoff) == (
        case.want_state,
        case.want_event,
        case.want_counted,
        case.want_backoff,
    )


def test_backoff_doubles_and_is_capped() -> None:
    assert [backoff_s(2.0, n) for n in (1, 2, 3)] == [2.0, 4.0, 8.0]
    assert backoff_s(2.0, 30) == 300.0
