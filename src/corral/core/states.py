"""Lifecycles as transition tables (STYLE.md habit 4).

Every entity with a lifecycle has one table: an edge per allowed change and
a comment saying when it happens. ``transition`` is the only gate: it checks
the edge and appends a ``Transition`` to the entity's history, so every
change is explained and recorded. The table's and the record's types live in
``lifecycle.py`` and the gate in ``gate.py``;
all three are named here too.
"""

from __future__ import annotations

from enum import StrEnum

from corral.core.gate import transition
from corral.core.lifecycle import Lifecycle, Transition

__all__ = [
    "ALLOCATION",
    "DESIRED",
    "JOB",
    "NODE",
    "UNSTARTED",
    "AllocDesired",
    "AllocObserved",
    "JobState",
    "Lifecycle",
    "NodeState",
    "StopReason",
    "Transition",
    "transition",
]


class JobState(StrEnum):
    WAITING = "waiting"  # for the jobs it runs after (a pipeline's step): not yet in the queue
    QUEUED = "queued"
    PLACED = "placed"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class NodeState(StrEnum):
    READY = "ready"
    LOST = "lost"


class AllocDesired(StrEnum):
    """What the server wants an allocation to do."""

    RUN = "run"
    STOP = "stop"  # cancel, interrupt or timeout
    PREEMPT = "preempt"  # stop with a grace period so it can checkpoint, then requeue


class StopReason(StrEnum):
    """Why the server stops an allocation (or one job of a batch): what the server records
    and the agent's executor obeys, and so how the job ends."""

    CANCEL = "cancel"  # the client does not want it any more: stop now, fail, no retry
    INTERRUPT = "interrupt"  # stop early and keep what was produced: finish with partial results
    PREEMPT = "preempt"  # make room: checkpoint within the grace period, stop; the job requeues
    TIMEOUT = "timeout"  # ran past the job's time limit: stop; the job fails, no retry


class AllocObserved(StrEnum):
    """What the agent last reported about an allocation."""

    PENDING = "pending"  # assigned, not yet started
    READY = "ready"  # a gang replica prepared to start, waiting for the rest of its gang
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # ended because it was told to
    LOST = "lost"  # its node vanished


W, Q, P, R = JobState.WAITING, JobState.QUEUED, JobState.PLACED, JobState.RUNNING
JOB: Lifecycle[JobState] = Lifecycle(
    "job",
    {
        (W, Q): "every job it runs after ended as it needs: it enters the queue",
        (W, JobState.CANCELLED): "its client cancelled it, or a job it needs did not succeed",
        (Q, P): "the scheduler placed it on a node (an allocation exists)",
        (Q, JobState.CANCELLED): "the client cancelled it before it was placed",
        (Q, JobState.FAILED): "it can never run: attempts exhausted while it waited, or rejected",
        (P, R): "the agent reported that it started",
        (P, Q): "the assignment never started: node lost or preempted first (attempt + 1)",
        (P, JobState.CANCELLED): "the client cancelled it before it started",
        (P, JobState.FAILED): "the agent refused it and another attempt would not help",
        (R, JobState.SUCCEEDED): "it finished and its result was accepted",
        (R, JobState.FAILED): "it failed for good: not retryable, or out of attempts",
        (R, JobState.CANCELLED): "the client cancelled it while it ran",
        (R, Q): "node lost, preempted or a retryable failure: requeued, attempt + 1",
    },
    terminal=frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}),
)

NODE: Lifecycle[NodeState] = Lifecycle(
    "node",
    {
        (NodeState.READY, NodeState.LOST): "not heard from for node_timeout, or its token revoked",
        (NodeState.LOST, NodeState.READY): "its agent reconnected and resynced",
    },
    terminal=frozenset(),
)

_PEND, _READY, _RUN = AllocObserved.PENDING, AllocObserved.READY, AllocObserved.RUNNING
UNSTARTED = frozenset({_PEND, _READY})
"""Observed states of an allocation the agent has not started yet."""
ALLOCATION: Lifecycle[AllocObserved] = Lifecycle(
    "allocation",
    {
        (_PEND, _RUN): "the agent started it",
        (_PEND, _READY): "a gang replica is prepared and waits for its gang's go",
        (_READY, _RUN): "every replica of its gang was ready: the server said go",
        (_READY, AllocObserved.STOPPED): "stopped (cancel, preempt, a replica failed) before go",
        (_READY, AllocObserved.FAILED): "the agent could not start it after all",
        (_READY, AllocObserved.LOST): "its node was lost while it waited for its gang",
        (_PEND, AllocObserved.STOPPED): "stopped (cancel, preempt) before it started",
        (_PEND, AllocObserved.FAILED): "the agent could not start it",
        (_PEND, AllocObserved.LOST): "its node was lost before it started",
        (_RUN, AllocObserved.SUCCEEDED): "it finished and reported its result",
        (_RUN, AllocObserved.FAILED): "it reported an error",
        (_RUN, AllocObserved.STOPPED): "it obeyed a stop (cancel, interrupt, timeout, preempt)",
        (_RUN, AllocObserved.LOST): "its node was lost while it ran",
    },
    terminal=frozenset(
        {
            AllocObserved.SUCCEEDED,
            AllocObserved.FAILED,
            AllocObserved.STOPPED,
            AllocObserved.LOST,
        }
    ),
)

DESIRED: Lifecycle[AllocDesired] = Lifecycle(
    "allocation-desired",
    {
        (AllocDesired.RUN, AllocDesired.STOP): "cancel, interrupt or timeout asked for",
        (AllocDesired.RUN, AllocDesired.PREEMPT): "the scheduler chose it as a preemption victim",
        (AllocDesired.PREEMPT, AllocDesired.STOP): "a cancel overrides a pending preemption",
    },
    terminal=frozenset({AllocDesired.STOP}),
)
