"""The prefetch policy: popular models onto idle nodes, ahead of demand, within budgets."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from scheduler_builders import AllocBuilder, JobBuilder, NodeBuilder, alloc, job, node, snapshot

from corral.core.errors import InvalidSpec
from corral.scheduler.prefetch import CacheState, PrefetchConfig, plan_prefetch

GB = 10**9
SIZES = {"sdxl": 7 * GB, "sd15": 2 * GB, "flux": 20 * GB, "cold": 5 * GB}


def jobs(model: str, count: int, **fields: object) -> list[JobBuilder]:
    return [job(f"{model}-{i}").gpus(1).set(model=model, **fields) for i in range(count)]


def idle(*names: str) -> list[NodeBuilder]:
    return [node(n).gpus(1) for n in names]


@dataclass
class Case:
    id: str
    nodes: list[NodeBuilder]
    jobs: list[JobBuilder]
    allocs: list[AllocBuilder] = field(default_factory=list)
    caches: dict[str, CacheState] | None = None  # default: 30 GB free on every node
    config: PrefetchConfig = field(default_factory=PrefetchConfig)
    want: list[tuple[str, str]] = field(default_factory=list)  # (node, model), in order


CASES = [
    Case(
        "eight queued jobs of a model nobody has: two idle nodes fetch it (one per 4 jobs)",
        nodes=idle("a", "b", "c"),
        jobs=jobs("sdxl", 8),
        want=[("a", "sdxl"), ("b", "sdxl")],
    ),
    Case(
        "the most demanded model goes first; each node gets one suggestion",
        nodes=idle("a", "b"),
        jobs=jobs("sd15", 2) + jobs("sdxl", 6),
        want=[("a", "sdxl"), ("b", "sdxl")],
    ),
    Case(
        "nodes running work are not idle; a node that has the model counts as a copy",
        nodes=[*idle("a", "b", "c"), node("has").gpus(1).models(on_disk=("sdxl",))],
        allocs=[alloc("x", "a").cards(0)],
        jobs=jobs("sdxl", 8),
        want=[("b", "sdxl")],
    ),
    Case(
        "a node already downloading is left alone, and its download counts as a copy",
        nodes=idle("a", "b", "c"),
        jobs=jobs("sdxl", 8),
        caches={
            "a": CacheState(30 * GB, fetching=frozenset({"sdxl"})),
            "b": CacheState(30 * GB),
            "c": CacheState(30 * GB),
        },
        want=[("b", "sdxl")],
    ),
    Case(
        "no room in the budget: not there; the node with the most room goes first",
        nodes=idle("small", "roomy", "full"),
        jobs=jobs("flux", 4),
        caches={
            "small": CacheState(10 * GB),
            "roomy": CacheState(100 * GB, used_bytes=10 * GB),
            "full": CacheState(25 * GB, used_bytes=20 * GB),
        },
        want=[("roomy", "flux")],
    ),
    Case(
        "a model less wanted than the one to fetch counts as room; a more wanted one does not",
        nodes=[
            node("less").gpus(1).models(on_disk=("sd15",)),
            node("more").gpus(1).models(on_disk=("flux",)),
        ],
        jobs=jobs("sdxl", 4) + jobs("sd15", 1) + jobs("flux", 5),
        caches={
            "less": CacheState(8 * GB, used_bytes=2 * GB),
            "more": CacheState(26 * GB, used_bytes=20 * GB),
        },
        want=[("less", "sdxl")],
    ),
    Case(
        "a node that could never run the jobs (backend) is not given their model",
        nodes=[node("comfy").gpus(1).backends("comfyui"), node("a1111").gpus(1).backends("a1111")],
        jobs=jobs("sdxl", 4, backend="a1111"),
        want=[("a1111", "sdxl")],
    ),
    Case(
        "paused nodes and nodes without a reported cache get nothing",
        nodes=[node("paused").gpus(1).paused(), *idle("no-cache")],
        jobs=jobs("sdxl", 4),
        caches={"paused": CacheState(30 * GB)},
        want=[],
    ),
    Case(
        "models without a known size are never prefetched",
        nodes=idle("a"),
        jobs=jobs("unregistered", 8),
        want=[],
    ),
    Case(
        "enough copies already: nothing to do",
        nodes=[*idle("a"), node("h").gpus(1).models(loaded=("sdxl",))],
        jobs=jobs("sdxl", 4),
        want=[],
    ),
    Case(
        "max_total caps one call; max_copies caps one model",
        nodes=idle("a", "b", "c", "d"),
        jobs=jobs("sdxl", 16) + jobs("sd15", 16),
        config=PrefetchConfig(max_total=3, max_copies=2),
        want=[("a", "sd15"), ("b", "sd15"), ("c", "sdxl")],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_prefetch(case: Case) -> None:
    snap = replace(snapshot(case.nodes, case.jobs, case.allocs), model_sizes=SIZES)
    caches = case.caches
    if caches is None:
        caches = {n.build().name: CacheState(30 * GB) for n in case.nodes}
    got = plan_prefetch(snap, caches, case.config)
    assert [(p.node, p.model) for p in got] == case.want
    for p in got:
        assert p.model in p.reason


def test_nothing_queued_means_nothing_to_prefetch() -> None:
    snap = replace(snapshot(idle("a"), []), model_sizes=SIZES)
    assert plan_prefetch(snap, {"a": CacheState(30 * GB)}) == ()


def test_the_reason_says_why() -> None:
    snap = replace(snapshot(idle("a"), jobs("sdxl", 5)), model_sizes=SIZES)
    (p,) = plan_prefetch(snap, {"a": CacheState(30 * GB)})
    assert p.reason == "5 queued jobs need sdxl; 0 nodes had it"


def test_recent_popularity_spreads_copies_before_a_queue_builds() -> None:
    nodes = [*idle("a", "b", "c", "d"), node("h").gpus(1).models(on_disk=("sdxl",))]
    snap = replace(snapshot(nodes, []), model_sizes=SIZES)
    caches = {n.build().name: CacheState(30 * GB) for n in nodes}
    popularity = {"sdxl": 60.0, "sd15": 30.0, "flux": 10.0, "unregistered": 99.0}
    got = plan_prefetch(snap, caches, PrefetchConfig(per_node=1), popularity=popularity)
    # copies in proportion to the shares of 5 nodes: sdxl 3 (h has it), sd15 2, flux 1
    assert [(p.node, p.model) for p in got] == [
        ("a", "sdxl"), ("b", "sdxl"), ("c", "sd15"), ("d", "sd15"), ("h", "flux"),
    ]  # fmt: skip
    assert got[0].reason == "sdxl is in demand lately; 1 node had it"


@pytest.mark.parametrize("bad", [{"jobs_per_copy": 0}, {"per_node": 0}, {"max_copies": 0}])
def test_bad_settings_name_the_field(bad: dict[str, int]) -> None:
    with pytest.raises(InvalidSpec) as err:
        PrefetchConfig(**bad)  # type: ignore[arg-type]
    assert err.value.field == f"prefetch.{next(iter(bad))}"
