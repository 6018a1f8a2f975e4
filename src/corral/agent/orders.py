"""What the supervisor is given and what it says back: an ``Order`` (an assignment as the
agent runs it) and the ``Report``s of its updates, ending in a ``Done`` or a ``Failed``;
``Held`` is an allocation as the hello lists it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from corral.agent.executors.base import Failed, JobWork, Result, Update
from corral.agent.model_gate import SpecOrError
from corral.core.model import EMPTY


@dataclass(frozen=True, slots=True)
class Order:
    """An allocation the server assigned: one job, a batch run in turn, or one gang replica."""

    allocation_id: str
    attempt: int
    jobs: tuple[JobWork, ...]
    kind: str = "custom"
    backend: str = ""  # the executor the jobs asked for; "" lets the supervisor choose
    gpu_indices: tuple[int, ...] = ()
    vram_bytes: int = 0  # per GPU; 0: whole cards (the VRAM guard's allowance)
    model_specs: Mapping[str, SpecOrError] = field(default_factory=lambda: EMPTY)  # by job id


@dataclass(frozen=True, slots=True)
class JobResult:
    job_id: str
    result: Result


@dataclass(frozen=True, slots=True)
class Done:
    """An order's successful end: every job's results (partial when interrupted). Also what a
    batch cut short finished before it failed (``Report.before``: ``jobs`` says which)."""

    results: tuple[JobResult, ...] = ()
    modified: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    interrupted: bool = False
    jobs: tuple[str, ...] = ()  # the jobs that finished (set for a batch cut short)
    stopped: tuple[str, ...] = ()  # jobs of a batch stopped on their own, with no result


@dataclass(frozen=True, slots=True)
class Report:
    """One update of one allocation, for the link to send."""

    allocation_id: str
    attempt: int
    update: Update | Done  # never ``Finished``: an order's success is one ``Done``
    job_id: str = ""  # the job it is about (for a batch's failure: the job that failed)
    before: Done | None = None  # a batch cut short by a failure: what finished before it

    @property
    def terminal(self) -> bool:
        return isinstance(self.update, Done | Failed)


@dataclass(frozen=True, slots=True)
class Held:
    """An allocation this agent holds, as the hello reports it."""

    allocation_id: str
    attempt: int
    observed: str  # "running" | "finished" (its end not yet acknowledged)
    progress: float = 0.0
