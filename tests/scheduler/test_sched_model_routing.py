"""Model-aware routing: wait for a busy node that has the model, or fetch it elsewhere?

Every case: a 6.5 GB model ``sdxl``; fetching at 100 MB/s takes 65 s and loading
from disk at 1 GB/s 6.5 s, so starting on a node without it costs ~71.5 s. One
GPU per node. ``now`` is 100.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from scheduler_builders import AllocBuilder, JobBuilder, NodeBuilder, alloc, job, node, snapshot

from corral.scheduler import Config, ReasonCode, Remedy, schedule
from corral.scheduler.api import Snapshot
from corral.scheduler.node_cap import ABSENT, LOADED, ON_DISK
from corral.scheduler.routing import startup_s

SIZE = 6_500_000_000
ROUTING = Config(model_fetch_bytes_per_s=100e6, model_load_bytes_per_s=1e9, model_max_wait_s=300)
NOW = 100.0


def sdxl(job_id: str, runtime: float = 30.0, submitted: float = NOW) -> JobBuilder:
    return (
        job(job_id).gpus(1).set(model="sdxl", estimated_runtime_s=runtime, submitted_at=submitted)
    )


def holder(name: str = "holder", *, loaded: bool = True) -> NodeBuilder:
    models = {"loaded": ("sdxl",)} if loaded else {"on_disk": ("sdxl",)}
    return node(name).gpus(1).models(**models)


def busy(node_name: str = "holder") -> AllocBuilder:
    return alloc(f"busy-{node_name}", node_name).cards(0).set(started_at=0.0)


@dataclass
class Case:
    id: str
    nodes: list[NodeBuilder]
    jobs: list[JobBuilder]
    allocs: list[AllocBuilder] = field(default_factory=list)
    ends: dict[str, float] = field(default_factory=dict)  # allocation -> expected end
    sizes: dict[str, int] = field(default_factory=lambda: {"sdxl": SIZE})
    config: Config = ROUTING
    want_on: dict[str, str] = field(default_factory=dict)
    want_waiting: dict[str, str] = field(default_factory=dict)  # job -> the holder named


CASES = [
    Case(
        "a busy node with the model loaded, free in 10 s, beats fetching on an idle node",
        nodes=[holder(), node("idle").gpus(1)],
        allocs=[busy()],
        ends={"busy-holder": NOW + 10},
        jobs=[sdxl("j")],
        want_waiting={"j": "holder"},
    ),
    Case(
        "free only in 200 s: fetching it on the idle node is quicker",
        nodes=[holder(), node("idle").gpus(1)],
        allocs=[busy()],
        ends={"busy-holder": NOW + 200},
        jobs=[sdxl("j")],
        want_on={"j": "idle"},
    ),
    Case(
        "a job queued for model_max_wait_s already goes to fetch the model",
        nodes=[holder(), node("idle").gpus(1)],
        allocs=[busy()],
        ends={"busy-holder": NOW + 10},
        jobs=[sdxl("j", submitted=NOW - 300)],
        want_on={"j": "idle"},
    ),
    Case(
        "without a fetch rate routing never waits (the default)",
        nodes=[holder(), node("idle").gpus(1)],
        allocs=[busy()],
        ends={"busy-holder": NOW + 10},
        jobs=[sdxl("j")],
        config=Config(),
        want_on={"j": "idle"},
    ),
    Case(
        "the first job books the holder; the next one would wait too long and fetches",
        nodes=[holder(), node("idle").gpus(1)],
        allocs=[busy()],
        ends={"busy-holder": NOW + 10},
        jobs=[sdxl("j1", runtime=100), sdxl("j2", runtime=100)],
        want_waiting={"j1": "holder"},
        want_on={"j2": "idle"},
    ),
    Case(
        "on disk on the idle node, loading (6.5 s) is quicker than waiting 10 s for the GPU",
        nodes=[holder(), node("idle").gpus(1).models(on_disk=("sdxl",))],
        allocs=[busy()],
        ends={"busy-holder": NOW + 10},
        jobs=[sdxl("j")],
        want_on={"j": "idle"},
    ),
    Case(
        "loaded on a node free in 3 s beats loading from disk on the idle one (6.5 s)",
        nodes=[holder(), node("idle").gpus(1).models(on_disk=("sdxl",))],
        allocs=[busy()],
        ends={"busy-holder": NOW + 3},
        jobs=[sdxl("j")],
        want_waiting={"j": "holder"},
    ),
    Case(
        "a holder whose end is unknown is not waited for",
        nodes=[holder(), node("idle").gpus(1)],
        allocs=[busy()],
        jobs=[sdxl("j")],
        want_on={"j": "idle"},
    ),
    Case(
        "a model the registry does not know (no size) is not waited for",
        nodes=[holder(), node("idle").gpus(1)],
        allocs=[busy()],
        ends={"busy-holder": NOW + 10},
        sizes={},
        jobs=[sdxl("j")],
        want_on={"j": "idle"},
    ),
    Case(
        "a holder that could never run the job (no such backend) is not waited for",
        nodes=[holder().backends("comfyui"), node("idle").gpus(1).backends("a1111")],
        allocs=[busy()],
        ends={"busy-holder": NOW + 10},
        jobs=[sdxl("j").set(backend="a1111")],
        want_on={"j": "idle"},
    ),
    Case(
        "an idle holder is simply used: nothing to wait for",
        nodes=[holder(), node("idle").gpus(1)],
        jobs=[sdxl("j")],
        want_on={"j": "holder"},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_routing(case: Case) -> None:
    snap = replace(
        snapshot(case.nodes, case.jobs, case.allocs),
        expected_ends=case.ends,
        model_sizes=case.sizes,
    )
    plan = schedule(snap, case.config, now=NOW)
    placed = {j: p.node for p in plan.placements for j in p.job_ids}
    for job_id, want in case.want_on.items():
        assert placed.get(job_id) == want, plan
    unplaced = {u.job_id: u for u in plan.unplaced}
    for job_id, node_name in case.want_waiting.items():
        u = unplaced[job_id]
        assert [r.code for r in u.reasons] == [ReasonCode.MODEL_WAIT]
        assert u.remedy is Remedy.WAIT
        assert f"waiting for {node_name}, which has model sdxl" in u.summary()
    assert len(placed) + len(unplaced) == len(case.jobs)


def test_a_waiting_job_is_placed_on_the_holder_once_it_frees() -> None:
    jobs = [sdxl("j")]
    waiting = replace(
        snapshot([holder(), node("idle").gpus(1)], jobs, [busy()]),
        expected_ends={"busy-holder": NOW + 10},
        model_sizes={"sdxl": SIZE},
    )
    assert not schedule(waiting, ROUTING, now=NOW).placements
    freed = replace(waiting, allocations=(), expected_ends={})
    plan = schedule(freed, ROUTING, now=NOW + 10)
    assert [(p.job_ids, p.node) for p in plan.placements] == [(("j",), "holder")]


def test_startup_costs() -> None:
    assert startup_s(LOADED, SIZE, ROUTING) == 0.0
    assert startup_s(ON_DISK, SIZE, ROUTING) == pytest.approx(6.5)
    assert startup_s(ABSENT, SIZE, ROUTING) == pytest.approx(71.5)


@pytest.mark.parametrize(
    ("field_name", "value"),
    [
        ("model_fetch_bytes_per_s", 0.0),
        ("model_load_bytes_per_s", -1.0),
        ("model_max_wait_s", -1.0),
    ],
)
def test_bad_routing_knobs_name_the_field(field_name: str, value: float) -> None:
    from corral.core.errors import InvalidSpec

    with pytest.raises(InvalidSpec) as err:
        Config(**{field_name: value})  # type: ignore[arg-type]
    assert err.value.field == f"config.{field_name}"


def test_routing_is_deterministic() -> None:
    snap: Snapshot = replace(
        snapshot(
            [holder("h1"), holder("h2", loaded=False), node("a").gpus(1), node("b").gpus(1)],
            [sdxl(f"j{i}", runtime=20) for i in range(6)],
            [busy("h1"), busy("h2")],
        ),
        expected_ends={"busy-h1": NOW + 5, "busy-h2": NOW + 8},
        model_sizes={"sdxl": SIZE},
    )
    assert schedule(snap, ROUTING, now=NOW) == schedule(snap, ROUTING, now=NOW)
