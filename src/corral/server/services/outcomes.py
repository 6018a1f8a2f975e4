"""What happens to a job when its allocation ends: a pure decision, one table.

The agent service reports *how* an allocation ended (``Ending``) and why it
was stopped, if it was; ``settle`` says what the job becomes. Keeping this
pure keeps the retry, preemption and timeout policy in one readable place.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from corral.core.events import EventKind
from corral.core.states import JobState, StopReason

NOTHING_SAVED = "interrupted before it saved anything"  # the job's error, for clients


class Ending(StrEnum):
    SUCCEEDED = "succeeded"  # the agent reported finished (maybe early, for an interrupt)
    FAILED = "failed"  # the agent reported an error
    STOPPED = "stopped"  # the agent obeyed a stop order
    LOST = "lost"  # the node vanished, or the agent forgot the allocation
    CUT_SHORT = "cut_short"  # its batch ended before it ran: another job of the batch failed
    # Finished after a client's interrupt with no result file (a ComfyUI graph stopped before
    # its save node ran): a job's ending, never an allocation's.
    NOTHING_MADE = "nothing_made"


@dataclass(frozen=True, slots=True)
class Settlement:
    """The job's next state, the event that says so, and bookkeeping."""

    state: JobState
    event: EventKind
    error: str | None = None
    count_failure: bool = False  # counts against max_attempts
    backoff: bool = False  # requeue with a retry delay


def settle(
    *,
    ending: Ending,
    stop_reason: StopReason | None,
    failures: int,
    max_attempts: int,
    retryable: bool = True,
    error: str | None = None,
    alike_nodes: int = 1,
    same_failure_nodes: int = 0,
) -> Settlement:
    """Decide the job's fate. ``failures`` is how many attempts already failed.

    ``alike_nodes`` is on how many distinct nodes the job has now failed with
    this same error; at ``same_failure_nodes`` (0: never) a retryable failure
    is final: the job, not the nodes, is at fault.
    """
    if ending is Ending.NOTHING_MADE:  # no result to succeed with: as if stopped before
        return Settlement(JobState.CANCELLED, EventKind.JOB_CANCELLED, error=NOTHING_SAVED)
    if ending is Ending.SUCCEEDED:
        return Settlement(JobState.SUCCEEDED, EventKind.JOB_SUCCEEDED)
    if ending is Ending.STOPPED and stop_reason is not None:
        return _stopped(stop_reason)
    if ending is Ending.CUT_SHORT:  # it never ran: nothing to count, nothing to wait for
        why = "another job of its batch failed before it ran"  # not that job's error
        return Settlement(JobState.QUEUED, EventKind.JOB_REQUEUED, error=why)
    if ending is Ending.LOST:
        # Not the job's fault as far as we know, but it counts: a job that kills nodes must end.
        # No backoff: the work should resume elsewhere at once.
        return _failed(error or "its node was lost", True, failures, max_attempts, backoff=False)
    if ending is Ending.STOPPED:
        error = "the agent stopped it unasked"
    elif retryable and 0 < same_failure_nodes <= alike_nodes:
        error = f"{error or 'failed'} (the same failure on {alike_nodes} nodes: not retrying)"
        return Settlement(JobState.FAILED, EventKind.JOB_FAILED, error=error, count_failure=True)
    return _failed(error or "failed", retryable, failures, max_attempts)


def _stopped(reason: StopReason) -> Settlement:
    if reason is StopReason.PREEMPT:
        # Preemption is the scheduler's choice, not the job's fault: never counted.
        return Settlement(JobState.QUEUED, EventKind.JOB_REQUEUED, error="preempted")
    if reason is StopReason.TIMEOUT:
        return Settlement(JobState.FAILED, EventKind.JOB_FAILED, error="timed out")
    if reason is StopReason.INTERRUPT:
        return Settlement(JobState.CANCELLED, EventKind.JOB_CANCELLED, error="interrupted")
    return Settlement(JobState.CANCELLED, EventKind.JOB_CANCELLED, error="cancelled")


def _failed(
    error: str, retryable: bool, failures: int, max_attempts: int, *, backoff: bool = True
) -> Settlement:
    if retryable and failures + 1 < max_attempts:
        return Settlement(
            JobState.QUEUED,
            EventKind.JOB_REQUEUED,
            error=error,
            count_failure=True,
            backoff=backoff,
        )
    if retryable:
        error = f"{error} (gave up after {failures + 1} attempts)"
    return Settlement(JobState.FAILED, EventKind.JOB_FAILED, error=error, count_failure=True)


def backoff_s(base_s: float, failures: int) -> float:
    """Retry delay after the ``failures``-th failure: base, 2x base, 4x ..., capped at 5 min."""
    return float(min(base_s * 2.0 ** max(0, failures - 1), 300.0))
