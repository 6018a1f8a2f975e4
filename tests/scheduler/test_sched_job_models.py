"""Jobs naming several models (a checkpoint and LoRAs), and nodes that said they lack one.

Table-driven: ``Job.models`` sends a job to the nodes that have all of them while one
of those has room; ``Job.lacking_nodes`` (nodes whose backend refused the job for a
model it lacks) are never used again for the job, by any path: search, eviction,
batches; and a job that fits only there leaves the node to other jobs of its shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from scheduler_builders import AllocBuilder, JobBuilder, NodeBuilder, alloc, job, node, snapshot

from corral.scheduler import Config, ReasonCode, schedule

LORA = frozenset({"lora:ink.safetensors"})
BOTH = frozenset({"lora:ink.safetensors", "vae:sharp.safetensors"})


@dataclass
class Case:
    id: str
    nodes: list[NodeBuilder]
    jobs: list[JobBuilder]
    allocs: list[AllocBuilder] = field(default_factory=list)
    want_on: dict[str, str] = field(default_factory=dict)  # job id -> node name
    want_unplaced: dict[str, ReasonCode] = field(default_factory=dict)
    want_preemptions: int = 0


def busy(node_name: str, *cards: int, **fields: object) -> AllocBuilder:
    return alloc(f"busy-{node_name}", node_name).cards(*cards).set(started_at=0.0, **fields)


CASES = [
    Case(
        "a job naming a LoRA goes to the node that has it, though another fits tighter",
        nodes=[
            node("holder").gpus(4).models(on_disk=("lora:ink.safetensors",)),
            node("tight").gpus(4),
        ],
        allocs=[busy("tight", 0, 1, 2)],
        jobs=[job("j").gpus(1).set(models=LORA)],
        want_on={"j": "holder"},
    ),
    Case(
        "every model counts: the node with the LoRA and the VAE beats the one with the LoRA",
        nodes=[
            node("lora-only").gpus(1).models(on_disk=("lora:ink.safetensors",)),
            node("both").gpus(1).models(on_disk=tuple(BOTH)),
        ],
        jobs=[job("j").gpus(1).set(models=BOTH)],
        want_on={"j": "both"},
    ),
    Case(
        "the holder full, it starts where it fits (a backend may have it without saying)",
        nodes=[node("holder").gpus(1).models(on_disk=("lora:ink.safetensors",)), node("n").gpus(1)],
        allocs=[busy("holder", 0)],
        jobs=[job("j").gpus(1).set(models=LORA)],
        want_on={"j": "n"},
    ),
    Case(
        "a node that refused it for a model it lacks is passed over for one that fits",
        nodes=[node("refused").gpus(4), node("other").gpus(4)],
        allocs=[busy("refused", 0, 1, 2)],
        jobs=[job("j").gpus(1).set(lacking_nodes=frozenset({"refused"}), attempt=1)],
        want_on={"j": "other"},
    ),
    Case(
        "it is never placed there again, even when nothing else fits: it waits, saying why",
        nodes=[node("refused").gpus(4), node("full").gpus(1)],
        allocs=[busy("full", 0)],
        jobs=[job("j").gpus(1).set(lacking_nodes=frozenset({"refused"}), attempt=1)],
        want_unplaced={"j": ReasonCode.MODEL_MISSING},
    ),
    Case(
        "the node it cannot use stays open to the next job of the same shape",
        nodes=[node("refused").gpus(1)],
        jobs=[
            job("j").gpus(1).set(lacking_nodes=frozenset({"refused"}), submitted_at=1.0),
            job("k").gpus(1).set(submitted_at=2.0),
        ],
        want_on={"k": "refused"},
        want_unplaced={"j": ReasonCode.MODEL_MISSING},
    ),
    Case(
        "nothing is evicted to make room on a node it cannot use",
        nodes=[node("refused").gpus(1)],
        allocs=[busy("refused", 0, priority="free")],
        jobs=[job("p").gpus(1).set(priority="paid", lacking_nodes=frozenset({"refused"}))],
        want_unplaced={"p": ReasonCode.MODEL_MISSING},
    ),
    Case(
        "a job refused by a node never rides there in another job's batch",
        nodes=[node("refused").gpus(1)],
        jobs=[
            job("lead").gpus(1).sample("k").set(submitted_at=1.0),
            job("rider")
            .gpus(1)
            .sample("k")
            .set(submitted_at=2.0, lacking_nodes=frozenset({"refused"})),
        ],
        want_on={"lead": "refused"},
        want_unplaced={"rider": ReasonCode.MODEL_MISSING},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_job_models(case: Case) -> None:
    plan = schedule(snapshot(case.nodes, case.jobs, case.allocs), Config(), now=100.0)
    placed = {jid: p for p in plan.placements for jid in p.job_ids}
    for job_id, want in case.want_on.items():
        assert job_id in placed, f"{job_id} unplaced: {plan.unplaced}"
        assert placed[job_id].node == want
    left = {u.job_id: u for u in plan.unplaced}
    for job_id, code in case.want_unplaced.items():
        assert job_id in left, f"{job_id} was placed on {placed[job_id].node}"
        assert code in {r.code for r in left[job_id].reasons}, left[job_id].summary()
    assert len(plan.preemptions) == case.want_preemptions


def test_the_reason_names_the_nodes_that_lack_its_model() -> None:
    jobs = [job("j").gpus(1).set(lacking_nodes=frozenset({"gpu-1", "gpu-2"}))]
    plan = schedule(snapshot([node("gpu-1").gpus(1), node("gpu-2").gpus(1)], jobs), Config())
    (unplaced,) = plan.unplaced
    assert "2 nodes: lack a model it needs (their backends said so): gpu-1, gpu-2" in (
        unplaced.summary()
    )
