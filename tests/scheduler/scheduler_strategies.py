"""Hypothesis strategies for small, varied clusters, queues and running work.

Running work is made the way it happens in life: a first cycle of
``schedule`` places some jobs, their placements become allocations (with
random ages, checkpoints and flags), then new jobs arrive.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st
from scheduler_replay import apply

from corral.core import GIB, Gpu, Job, JobKind, Node, NodeState, ResourceRequest, Team
from corral.scheduler import Config, Snapshot, schedule

MODELS = ("A100", "H100")
CLASSES = ("interactive", "paid", "free", "batch")


@st.composite
def nodes(draw: st.DrawFn) -> tuple[Node, ...]:
    count = draw(st.integers(1, 6))
    out = []
    for i in range(count):
        cards = draw(st.sampled_from((0, 1, 2, 4, 4)))
        model = draw(st.sampled_from(MODELS))
        vram = draw(st.sampled_from((24, 80))) * GIB
        cpus = draw(st.sampled_from((0, 4, 16, 32)))
        # a third report two NUMA nodes, the first half of the cards on node 0, CPUs split
        numa = cards > 1 and draw(st.integers(0, 2)) == 0
        out.append(
            Node(
                name=f"n{i}",
                gpus=tuple(
                    Gpu(g, model, vram, numa=2 * g // cards if numa else -1) for g in range(cards)
                ),
                cpus=cpus,
                numa_cpus=((0, cpus / 2), (1, cpus / 2)) if numa else (),
                memory_bytes=draw(st.sampled_from((0, 16, 64, 64))) * GIB,
                labels={"rack": draw(st.sampled_from(("r1", "r2")))},
                models_on_disk=frozenset(draw(st.sets(st.sampled_from(("sdxl", "flux"))))),
                backends=frozenset(draw(st.sets(st.sampled_from(("comfyui", "command"))))),
                paused=draw(st.integers(0, 9)) == 0,
                draining=draw(st.integers(0, 9)) == 0,
                state=NodeState.LOST if draw(st.integers(0, 9)) == 0 else NodeState.READY,
            )
        )
    return tuple(out)


@st.composite
def resources(draw: st.DrawFn) -> ResourceRequest:
    request = draw(_resources())
    memory = draw(st.sampled_from((0, 0, 0, 8, 24))) * GIB  # most jobs ask for none
    return replace(request, memory_bytes=memory) if memory else request


@st.composite
def _resources(draw: st.DrawFn) -> ResourceRequest:
    shape = draw(st.sampled_from(("whole", "whole", "share", "vram", "cpu")))
    cpus = draw(st.integers(0, 2))
    models = frozenset(draw(st.sets(st.sampled_from(MODELS), max_size=1)))
    if shape == "whole":
        vram = draw(st.sampled_from((0, 0, 40))) * GIB
        return ResourceRequest(
            gpus=draw(st.integers(1, 3)),
            vram_bytes=vram,
            cpus=cpus,
            gpu_models=models,
            cpu_fallback=draw(st.booleans()),
        )
    if shape == "share":
        return ResourceRequest(
            gpu_milli=draw(st.sampled_from((250, 500, 700))),
            cpus=cpus,
            gpu_models=models,
            cpu_fallback=draw(st.booleans()),
        )
    if shape == "vram":
        return ResourceRequest(vram_bytes=draw(st.sampled_from((8, 12, 30))) * GIB, cpus=cpus)
    return ResourceRequest(cpus=max(cpus, 1))


SAMPLE = ResourceRequest(vram_bytes=8 * GIB, cpus=1)


@st.composite
def jobs(draw: st.DrawFn, prefix: str = "j", at_least: int = 0) -> tuple[Job, ...]:
    """Training-like jobs of every shape, and sample jobs that often batch together."""
    count = draw(st.integers(at_least, max(at_least, 14)))
    return tuple(
        draw(
            sample_jobs(f"{prefix}{i}")
            if draw(st.integers(0, 2)) == 0
            else train_jobs(f"{prefix}{i}")
        )
        for i in range(count)
    )


@st.composite
def train_jobs(draw: st.DrawFn, job_id: str) -> Job:
    return Job(
        id=job_id,
        resources=draw(resources()),
        kind=JobKind.TRAIN,
        priority=draw(st.sampled_from(CLASSES)),
        team=draw(st.sampled_from(("a", "b", "default"))),
        user=draw(st.sampled_from(("u1", "u2", "u3"))),
        node_selector=draw(st.sampled_from(({}, {}, {"rack": "r1"}))),
        replicas=draw(st.sampled_from((1, 1, 1, 2, 3))),
        gang_label=draw(st.sampled_from((None, "rack"))),
        backend=draw(st.sampled_from((None, None, "command"))),
        preemptible=draw(st.integers(0, 3)) > 0,
        submitted_at=float(draw(st.integers(0, 50))),
        not_before=float(draw(st.sampled_from((0, 0, 0, 10_000)))),
    )


@st.composite
def sample_jobs(draw: st.DrawFn, job_id: str) -> Job:
    return Job(
        id=job_id,
        resources=SAMPLE,
        kind=JobKind.SAMPLE,
        batch_key=draw(st.sampled_from((None, "k1", "k1", "k2"))),
        priority=draw(st.sampled_from(("paid", "free"))),
        team=draw(st.sampled_from(("a", "b"))),
        user=draw(st.sampled_from(("u1", "u2", "u3"))),
        model="sdxl",
        submitted_at=float(draw(st.integers(0, 50))),
    )


@st.composite
def teams(draw: st.DrawFn) -> tuple[Team, ...]:
    return tuple(
        Team(
            name,
            quota_gpus=draw(st.integers(0, 8)),
            borrow_limit_gpus=draw(st.sampled_from((None, 0, 2, 4))),
            weight=draw(st.sampled_from((1.0, 2.0))),
        )
        for name in ("a", "b")
    )


@st.composite
def situations(draw: st.DrawFn) -> tuple[Snapshot, Config, float]:
    """A cluster with running work (placed by a first cycle) and a new queue."""
    config = Config(
        min_runtime_before_preemption_s=draw(st.sampled_from((0.0, 60.0))),
        max_batch_size=draw(st.integers(1, 3)),
    )
    first = Snapshot(nodes=draw(nodes()), queued=draw(jobs("old", 6)), teams=draw(teams()))
    start = 0.0
    plan = schedule(first, config, now=start)
    known = {j.id: j for j in first.queued}
    running = apply(first, plan, start, known)
    aged = tuple(
        replace(
            a,
            started_at=float(draw(st.integers(-100, 50))),
            last_checkpoint_at=draw(st.sampled_from((None, 20.0, 90.0))),
            progress=draw(st.floats(0, 1)),
        )
        for a in running.allocations
    )
    now = 100.0
    snapshot = Snapshot(
        nodes=first.nodes, queued=draw(jobs("new")), allocations=aged, teams=first.teams
    )
    return snapshot, config, now


@st.composite
def crowded(draw: st.DrawFn) -> tuple[Snapshot, Config, float]:
    """A cluster filled by team a's borrowing, then owed work arrives: preemption country."""
    config = Config(min_runtime_before_preemption_s=draw(st.sampled_from((0.0, 60.0))))
    count = draw(st.integers(1, 4))
    cluster = tuple(
        Node(name=f"n{i}", gpus=tuple(Gpu(g, "A100", 80 * GIB) for g in range(4)), cpus=64)
        for i in range(count)
    )
    quota_b = draw(st.integers(1, 4 * count))
    borrow = draw(st.sampled_from((None, 2, 4 * count)))
    squad = (Team("a", 1, borrow), Team("b", quota_b, borrow))
    filler = tuple(
        Job(
            id=f"old{i}",
            resources=ResourceRequest(gpus=draw(st.sampled_from((1, 1, 2))), cpus=1),
            team="a",
            priority=draw(st.sampled_from(("free", "batch", "paid"))),
            preemptible=draw(st.integers(0, 4)) > 0,
            replicas=draw(st.sampled_from((1, 1, 1, 2))),
        )
        for i in range(4 * count)
    )
    first = Snapshot(nodes=cluster, queued=filler, teams=squad)
    running = apply(first, schedule(first, config, now=0.0), 0.0, {j.id: j for j in filler})
    aged = tuple(
        replace(
            a,
            started_at=float(draw(st.integers(0, 90))),
            last_checkpoint_at=draw(st.sampled_from((None, 50.0, 95.0))),
        )
        for a in running.allocations
    )
    owed = tuple(
        Job(
            id=f"new{i}",
            resources=ResourceRequest(gpus=draw(st.sampled_from((1, 2, 3))), cpus=1),
            team=draw(st.sampled_from(("a", "b", "b"))),
            priority=draw(st.sampled_from(("paid", "free", "interactive", "batch"))),
            replicas=draw(st.sampled_from((1, 1, 2, 3))),
            submitted_at=float(i),
        )
        for i in range(draw(st.integers(1, 6)))
    )
    return Snapshot(nodes=cluster, queued=owed, allocations=aged, teams=squad), config, 100.0
