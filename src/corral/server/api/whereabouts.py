"""Where and when a job runs, as its view says: its allocations with their GPUs'
topology (``placement``) and its expected start and end (``eta``)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class PlacedOut(BaseModel):
    """One allocation of a job: where it runs and on what."""

    allocation: str
    node: str
    replica: int
    gpu_indices: list[int]
    cpus: float
    observed: str = Field(description="pending, ready (a gang replica waiting for its go), ...")
    topology: str = Field(
        description="how its GPUs are linked, e.g. 'GPUs 0,1 (nvlink) on NUMA node 0'; "
        "empty when the node reported no topology"
    )
    memory_bytes: int = Field(0, description="host memory it holds, bytes")


class EtaOut(BaseModel):
    """When the job is expected to start and end: an estimate, re-made every few seconds
    while work is queued (docs/scheduler.md, "ETA")."""

    start_at: float | None = Field(
        None, description="expected start, epoch seconds (queued jobs; null: not foreseen)"
    )
    end_at: float | None = Field(None, description="expected end, epoch seconds")
    runtime_s: float = Field(description="predicted run time, seconds")
    basis: str = Field(
        description="what the run time rests on: history, estimate (the job's own, corrected "
        "by history), progress, default (nothing finished yet); beyond (queued past the "
        "estimate's horizon) or never (no node that could run it frees up)"
    )
    computed_at: float = Field(description="when the estimate was made, epoch seconds")
