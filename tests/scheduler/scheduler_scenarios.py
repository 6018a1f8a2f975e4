"""YAML scheduler scenarios (``tests/scenarios/*.yaml``): a cluster and steps with wants.

Nodes, teams and jobs use the simulator's field names (``docs/scheduler.md``),
so the same cluster can be replayed by ``corral sim``. A scenario adds steps:
at each step jobs are submitted (or finished), one cycle runs, the plan is
applied, and ``want`` is checked::

    name: idle quota is reclaimed
    nodes: [{name: n, count: 4, gpus: 10}]
    teams: [{name: a, quota_gpus: 20}, {name: b, quota_gpus: 20}]
    steps:
      - now: 0
        submit: [{id: a, count: 35, gpus: 1, team: a}]
        want: {team_gpus: {a: 35}}
      - now: 3600
        submit: [{id: b, count: 10, gpus: 1, team: b}]
        want: {team_gpus: {a: 30, b: 10}, preemptions: 5}

``count`` replicates a node or job; names get ``-1``, ``-2`` ... suffixes.
Wants: ``placed`` (ids, or a number of jobs), ``unplaced`` (id -> reason
codes), ``remedy`` (id -> remedy), ``placed_on`` (id -> node), ``team_gpus``,
``preemptions``, ``batches``, ``borrowed``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from scheduler_replay import World

from corral.core import GIB, Gpu, InvalidSpec, Job, JobKind, Node, ResourceRequest, Team
from corral.scheduler import Config, Plan

NODE_FIELDS = {
    "name",
    "count",
    "gpus",
    "gpu_model",
    "vram_gib",
    "cpus",
    "labels",
    "models",
    "models_loaded",
    "backends",
    "paused",
    "draining",
}
JOB_FIELDS = {
    "id",
    "count",
    "gpus",
    "vram_gib",
    "cpus",
    "gpu_models",
    "team",
    "user",
    "priority",
    "preemptible",
    "replicas",
    "gang_label",
    "model",
    "backend",
    "batch_key",
    "kind",
    "selector",
    "cpu_fallback",
    "submit_at",
    "not_before",
    "duration",
}
WANT_FIELDS = {
    "placed",
    "unplaced",
    "remedy",
    "placed_on",
    "team_gpus",
    "preemptions",
    "batches",
    "borrowed",
}


def load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or "steps" not in data:
        raise InvalidSpec(f"{path.name}", "a scenario is a mapping with 'steps'")
    return data


def world_of(data: dict[str, Any]) -> World:
    nodes = [n for i, spec in enumerate(data.get("nodes", ())) for n in _nodes(spec, f"nodes[{i}]")]
    teams = [Team(**t) for t in data.get("teams", ())]
    return World(nodes, teams, Config(**data.get("config", {})))


def run_step(world: World, step: dict[str, Any], where: str) -> Plan:
    jobs = [
        j for i, s in enumerate(step.get("submit", ())) for j in _jobs(s, f"{where}.submit[{i}]")
    ]
    world.finish(*step.get("finish", ()))
    world.submit(*jobs)
    return world.cycle(float(step.get("now", 0)))


def check(world: World, plan: Plan, want: dict[str, Any], where: str) -> None:
    _known(want, WANT_FIELDS, f"{where}.want")
    placed = {j: p for p in plan.placements for j in p.job_ids}
    left = {u.job_id: u for u in plan.unplaced}
    if "placed" in want:
        expected = want["placed"]
        if isinstance(expected, int):
            assert len(placed) == expected, f"{where}: placed {sorted(placed)}"
        else:
            assert set(expected) <= set(placed), f"{where}: placed {sorted(placed)}"
    for job_id, codes in want.get("unplaced", {}).items():
        assert job_id in left, f"{where}: {job_id} was placed"
        assert set(codes) <= {r.code.value for r in left[job_id].reasons}, left[job_id].summary()
    for job_id, remedy in want.get("remedy", {}).items():
        assert left[job_id].remedy.value == remedy, f"{where}: {job_id}"
    for job_id, node in want.get("placed_on", {}).items():
        assert placed[job_id].node == node, f"{where}: {job_id} on {placed[job_id].node}"
    for team, gpus in want.get("team_gpus", {}).items():
        assert world.gpus_of(team) == gpus, f"{where}: team {team} holds {world.gpus_of(team)}"
    if "preemptions" in want:
        assert len(plan.preemptions) == want["preemptions"], f"{where}: {plan.preemptions}"
    if "batches" in want:
        assert len(plan.batches) == want["batches"], f"{where}: {plan.batches}"
    if "borrowed" in want:
        assert sum(p.borrowed for p in plan.placements) == want["borrowed"], where


def _nodes(spec: dict[str, Any], where: str) -> list[Node]:
    _known(spec, NODE_FIELDS, where)
    count = int(spec.get("count", 1))
    cards = int(spec.get("gpus", 0))
    vram = int(float(spec.get("vram_gib", 80)) * GIB)
    gpus = tuple(Gpu(i, str(spec.get("gpu_model", "A100")), vram) for i in range(cards))
    loaded = frozenset(spec.get("models_loaded", ()))
    return [
        Node(
            name=_name(spec["name"], i, count),
            gpus=gpus,
            cpus=int(spec.get("cpus", 64)),
            labels=spec.get("labels", {}),
            models_on_disk=frozenset(spec.get("models", ())) | loaded,
            models_loaded=loaded,
            backends=frozenset(spec.get("backends", ())),
            paused=bool(spec.get("paused", False)),
            draining=bool(spec.get("draining", False)),
        )
        for i in range(count)
    ]


def _jobs(spec: dict[str, Any], where: str) -> list[Job]:
    _known(spec, JOB_FIELDS, where)
    count = int(spec.get("count", 1))
    extra: dict[str, Any] = {"cpus": int(spec.get("cpus", 1))}
    if "vram_gib" in spec:
        extra["vram_bytes"] = int(float(spec["vram_gib"]) * GIB)
    if "gpu_models" in spec:
        extra["gpu_models"] = frozenset(spec["gpu_models"])
    extra["cpu_fallback"] = bool(spec.get("cpu_fallback", False))
    resources = ResourceRequest.from_gpus(float(spec.get("gpus", 0)), **extra)
    base = float(spec.get("submit_at", 0))
    return [
        Job(
            id=_name(spec["id"], i, count),
            resources=resources,
            kind=JobKind(spec.get("kind", "sample" if "batch_key" in spec else "custom")),
            priority=spec.get("priority", "free"),
            team=spec.get("team", "default"),
            user=spec.get("user", "anonymous"),
            node_selector=spec.get("selector", {}),
            replicas=int(spec.get("replicas", 1)),
            gang_label=spec.get("gang_label"),
            model=spec.get("model"),
            backend=spec.get("backend"),
            batch_key=spec.get("batch_key"),
            preemptible=bool(spec.get("preemptible", True)),
            submitted_at=base + i * 1e-3,
            not_before=float(spec.get("not_before", 0)),
        )
        for i in range(count)
    ]


def _name(base: str, i: int, count: int) -> str:
    return f"{base}-{i + 1}" if count > 1 else str(base)


def _known(spec: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = set(spec) - allowed
    if unknown:
        raise InvalidSpec(
            f"{where}.{sorted(unknown)[0]}", f"unknown field; known: {sorted(allowed)}"
        )
