"""Table-driven placement scenarios: one narrative id per case, ``want_*`` fields."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from scheduler_builders import AllocBuilder, JobBuilder, NodeBuilder, alloc, job, node, snapshot

from corral.scheduler import Config, ReasonCode, Remedy, schedule


@dataclass
class Case:
    id: str
    nodes: list[NodeBuilder]
    jobs: list[JobBuilder]
    allocs: list[AllocBuilder] = field(default_factory=list)
    config: Config = field(default_factory=Config)
    now: float = 100.0
    want_on: dict[str, str] = field(default_factory=dict)  # job id -> node name
    want_cards: dict[str, tuple[int, ...]] = field(default_factory=dict)
    want_unplaced: dict[str, ReasonCode] = field(default_factory=dict)  # job -> a reason code
    want_remedy: dict[str, Remedy] = field(default_factory=dict)
    want_on_cpu: set[str] = field(default_factory=set)


CASES = [
    Case(
        "best fit: a one-GPU job goes to the fullest node that still has room",
        nodes=[node("empty").gpus(8), node("busy").gpus(8)],
        allocs=[alloc("x", "busy").cards(0, 1, 2, 3, 4, 5)],
        jobs=[job("j").gpus(1)],
        want_on={"j": "busy"},
        want_cards={"j": (6,)},
    ),
    Case(
        "a retry passes over the node where it failed, best fit or not",
        nodes=[node("empty").gpus(8), node("busy").gpus(8)],
        allocs=[alloc("x", "busy").cards(0, 1, 2, 3, 4, 5)],
        jobs=[job("j").gpus(1).set(avoid_nodes=frozenset({"busy"}), attempt=1)],
        want_on={"j": "empty"},
    ),
    Case(
        "a retry goes back to the node where it failed when nothing else fits now",
        nodes=[node("full").gpus(8), node("busy").gpus(8)],
        allocs=[alloc("x", "full").cards(*range(8)), alloc("y", "busy").cards(0, 1, 2, 3)],
        jobs=[job("j").gpus(2).set(avoid_nodes=frozenset({"busy"}), attempt=1)],
        want_on={"j": "busy"},
    ),
    Case(
        "nodes a retry passes over that have left the cluster change nothing",
        nodes=[node("n1").gpus(8)],
        jobs=[job("j").gpus(1).set(avoid_nodes=frozenset({"gone"}), attempt=1)],
        want_on={"j": "n1"},
    ),
    Case(
        "a job too big for the busy node takes the empty one",
        nodes=[node("empty").gpus(8), node("busy").gpus(8)],
        allocs=[alloc("x", "busy").cards(0, 1, 2, 3, 4, 5)],
        jobs=[job("j").gpus(4)],
        want_on={"j": "empty"},
    ),
    Case(
        "a shared job fills a partly used card before opening a fresh one",
        nodes=[node("n").gpus(2)],
        allocs=[alloc("half", "n").cards(1, milli=500, vram_gib=40)],
        jobs=[job("s").vram(20)],
        want_cards={"s": (1,)},
    ),
    Case(
        "a shared job never overflows a card's VRAM: it opens the next card",
        nodes=[node("n").gpus(2, vram_gib=24)],
        allocs=[alloc("big", "n").cards(0, milli=700, vram_gib=16)],
        jobs=[job("s").vram(12)],
        want_cards={"s": (1,)},
    ),
    Case(
        "GPU model constraint skips nodes of other models",
        nodes=[node("a100").gpus(8, "A100"), node("h100").gpus(8, "H100")],
        jobs=[job("j").gpus(2).gpu_models("H100")],
        want_on={"j": "h100"},
    ),
    Case(
        "node selector is honoured",
        nodes=[node("r1").gpus(8).label(rack="r1"), node("r2").gpus(8).label(rack="r2")],
        jobs=[job("j").gpus(1).select(rack="r2")],
        want_on={"j": "r2"},
    ),
    Case(
        "backend must be offered by the node",
        nodes=[node("plain").gpus(1), node("comfy").gpus(1).backends("comfyui")],
        jobs=[job("j").gpus(1).set(backend="comfyui")],
        want_on={"j": "comfy"},
    ),
    Case(
        "model loaded beats model on disk beats no model",
        nodes=[
            node("none").gpus(4),
            node("disk").gpus(4).models(on_disk=("sdxl",)),
            node("loaded").gpus(4).models(loaded=("sdxl",)),
        ],
        jobs=[job("j").vram(10).set(model="sdxl")],
        want_on={"j": "loaded"},
    ),
    Case(
        "model on disk beats a slightly tighter node without it",
        nodes=[node("tight").gpus(4), node("disk").gpus(4).models(on_disk=("sdxl",))],
        allocs=[alloc("x", "tight").cards(0)],
        jobs=[job("j").gpus(1).set(model="sdxl")],
        want_on={"j": "disk"},
    ),
    Case(
        "with locality weighted 0, the tighter node wins over the model's node",
        nodes=[node("tight").gpus(4), node("disk").gpus(4).models(on_disk=("sdxl",))],
        allocs=[alloc("x", "tight").cards(0)],
        jobs=[job("j").gpus(1).set(model="sdxl")],
        config=Config(scorer_weights={"locality": 0}),
        want_on={"j": "tight"},
    ),
    Case(
        "a small job leaves the whole free node alone",
        nodes=[node("whole").gpus(8), node("part").gpus(8)],
        allocs=[alloc("x", "part").cards(0)],
        jobs=[job("j").gpus(2)],
        want_on={"j": "part"},
    ),
    Case(
        "CPU-only work prefers GPU-less nodes",
        nodes=[node("gpu").gpus(8), node("cpu").cpus(16)],
        jobs=[job("c").cpus(4)],
        want_on={"c": "cpu"},
    ),
    Case(
        "batch class offloads to CPU when no GPU is free and the job allows it",
        nodes=[node("n").gpus(1).cpus(8)],
        allocs=[alloc("x", "n").cards(0)],
        jobs=[job("b").gpus(1).cpu_fallback().set(priority="batch")],
        want_on={"b": "n"},
        want_on_cpu={"b"},
    ),
    Case(
        "paid work does not offload to CPU: its class does not allow it",
        nodes=[node("n").gpus(1).cpus(8)],
        allocs=[alloc("x", "n").cards(0).set(priority="interactive", preemptible=False)],
        jobs=[job("p").gpus(1).cpu_fallback().set(priority="paid")],
        want_unplaced={"p": ReasonCode.INSUFFICIENT_GPUS},
        want_remedy={"p": Remedy.WAIT},
    ),
    Case(
        "a job needing more GPUs than any node has can never run",
        nodes=[node("n").gpus(4)],
        jobs=[job("j").gpus(8)],
        want_unplaced={"j": ReasonCode.TOO_FEW_GPUS},
        want_remedy={"j": Remedy.NONE},
    ),
    Case(
        "a job needing more VRAM per card than any card has can never run",
        nodes=[node("n").gpus(4, vram_gib=24)],
        jobs=[job("j").gpus(1).vram(40)],
        want_unplaced={"j": ReasonCode.INSUFFICIENT_VRAM},
        want_remedy={"j": Remedy.NONE},
    ),
    Case(
        "retry backoff: a job is not placed before not_before",
        nodes=[node("n").gpus(4)],
        jobs=[job("j").gpus(1).set(not_before=500.0)],
        want_unplaced={"j": ReasonCode.NOT_BEFORE},
        want_remedy={"j": Remedy.WAIT},
    ),
    Case(
        "an unknown priority class is reported, not guessed",
        nodes=[node("n").gpus(4)],
        jobs=[job("j").gpus(1).set(priority="platinum")],
        want_unplaced={"j": ReasonCode.UNKNOWN_PRIORITY},
        want_remedy={"j": Remedy.NONE},
    ),
    Case(
        "the cycle placement limit leaves the rest for the next cycle",
        nodes=[node("n").gpus(4)],
        jobs=[job("a").gpus(1).set(submitted_at=1), job("b").gpus(1).set(submitted_at=2)],
        config=Config(max_placements_per_cycle=1),
        want_on={"a": "n"},
        want_unplaced={"b": ReasonCode.CYCLE_LIMIT},
    ),
    Case(
        "CPU slots are capacity too",
        nodes=[node("n").gpus(4).cpus(2)],
        jobs=[job("a").gpus(1).cpus(2).set(submitted_at=1), job("b").gpus(1).set(submitted_at=2)],
        want_on={"a": "n"},
        want_unplaced={"b": ReasonCode.INSUFFICIENT_CPUS},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_placement(case: Case) -> None:
    plan = schedule(snapshot(case.nodes, case.jobs, case.allocs), case.config, now=case.now)
    placed = {jid: p for p in plan.placements for jid in p.job_ids}
    for job_id, want in case.want_on.items():
        assert job_id in placed, f"{job_id} unplaced: {plan.unplaced}"
        assert placed[job_id].node == want
    for job_id, cards in case.want_cards.items():
        assert placed[job_id].gpu_indices == cards
    left = {u.job_id: u for u in plan.unplaced}
    for job_id, code in case.want_unplaced.items():
        assert job_id in left, f"{job_id} was placed"
        assert code in {r.code for r in left[job_id].reasons}, left[job_id].summary()
    for job_id, remedy in case.want_remedy.items():
        assert left[job_id].remedy is remedy
    assert {j for j, p in placed.items() if p.on_cpu} == case.want_on_cpu
