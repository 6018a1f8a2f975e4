"""Wire <-> agent translation for the link (pure functions, no I/O).

Server messages become supervisor ``Order``s and stop orders; supervisor
``Report``s become ``AllocationUpdate``s; the machine's identity and GPU
readings become the hello's ``Inventory`` and heartbeats.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.agent.executors.base import (
    Checkpoint,
    Failed,
    Gang,
    InputPath,
    JobWork,
    LogLine,
    Preview,
    Progress,
    Ready,
    Started,
)
from corral.agent.fingerprint import GpuSnapshot
from corral.agent.model_gate import SpecOrError
from corral.agent.model_report import spec_from
from corral.agent.orders import Done, Held, Order, Report
from corral.agent.topology import Topology
from corral.core import InvalidSpec
from corral.core.model import EMPTY
from corral.core.resources import cpu_milli
from corral.core.states import StopReason
from corral.proto.gen.corral.v1 import agent_pb2 as pb

_STOP_FROM_WIRE = {
    pb.STOP_REASON_CANCEL: StopReason.CANCEL,
    pb.STOP_REASON_INTERRUPT: StopReason.INTERRUPT,
    pb.STOP_REASON_PREEMPT: StopReason.PREEMPT,
    pb.STOP_REASON_TIMEOUT: StopReason.TIMEOUT,
}


@dataclass(frozen=True, slots=True)
class Identity:
    """What the agent says about itself besides its GPUs."""

    node: str
    cpus: float  # CPU slots, to a milli-CPU
    labels: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    backends: tuple[str, ...] = ()
    models_on_disk: tuple[str, ...] = ()
    version: str = ""
    loaded: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: EMPTY)  # per backend
    key: str = ""  # this installation's secret (``node_key``): the node name is bound to it
    topology: Topology | None = None  # how the GPUs sit, when known
    memory_bytes: int = 0  # host memory offered to jobs' requests (agent/memory.py)


def order_from(
    msg: pb.Assign,
    checkpoint_root: Path | None = None,
    api_base: str = "",
    results_root: Path | None = None,
) -> Order:
    """The supervisor's order for an assignment; each job is given its checkpoint directory
    and (``results_root``) the folder where its result files wait to be sent
    (``<results_root>/<allocation>/<job>``, deleted once the server has the end).

    The directories are named, not made: whoever writes there first creates them (the
    handler's ``ctx.checkpoint_dir``, the command and demo executors), so a job
    that never checkpoints costs no file-system call.

    ``api_base`` resolves the sources of models the server holds (``/v1/models/...``).
    """
    gpus = tuple(msg.gpu_indices)
    jobs = tuple(_job(msg, w, gpus, checkpoint_root, results_root) for w in msg.jobs)
    whole = msg.gpu_milli >= 1000 or msg.gpu_milli == 0
    return Order(
        model_specs=model_specs(msg, api_base),
        allocation_id=msg.allocation_id,
        attempt=msg.attempt,
        jobs=jobs,
        kind=(msg.jobs[0].kind if msg.jobs else "") or "custom",
        backend=msg.jobs[0].backend if msg.jobs else "",
        gpu_indices=gpus,
        vram_bytes=0 if whole else msg.vram_bytes,
    )


def _job(
    msg: pb.Assign, w: pb.Work, gpus: tuple[int, ...], root: Path | None, results: Path | None
) -> JobWork:
    return JobWork(
        allocation_id=msg.allocation_id,
        attempt=msg.attempt,
        job_ids=(w.job_id,),
        kind=w.kind or "custom",
        payload=_payload(w.payload_json),
        model=w.model or None,
        gpu_indices=gpus,
        checkpoint_dir=None if root is None else root / w.job_id,
        resume_from=w.resume_from or None,
        resume_step=w.resume_step,
        timeout_s=w.timeout_s or None,
        results_root=results,
        inputs=tuple(InputPath(i.name, i.sha256) for i in w.inputs),
        gang=_gang(msg),
        memory_bytes=msg.memory_bytes,
    )


def _gang(msg: pb.Assign) -> Gang | None:
    if msg.replicas <= 1:
        return None
    return Gang(msg.replica, msg.replicas, msg.master_addr, msg.master_port)


def model_specs(msg: pb.Assign, api_base: str) -> dict[str, SpecOrError]:
    """Each job's registered model as a ``ModelSpec``, or why the agent cannot read it."""
    out: dict[str, SpecOrError] = {}
    for w in msg.jobs:
        if w.HasField("model_ref"):
            try:
                out[w.job_id] = spec_from(w.model_ref, api_base)
            except InvalidSpec as exc:
                out[w.job_id] = f"the server's registry entry is not usable: {exc}"
    return out


def _payload(text: str) -> Mapping[str, Any]:
    value = json.loads(text) if text else {}
    return value if isinstance(value, dict) else {"value": value}


def stop_from(msg: pb.Stop) -> tuple[str, StopReason, float]:
    """(allocation id, reason, grace); an unknown reason is taken as a cancel."""
    return msg.allocation_id, _STOP_FROM_WIRE.get(msg.reason, StopReason.CANCEL), msg.grace_s


def inventory(identity: Identity, snapshot: GpuSnapshot, held: Sequence[Held]) -> pb.Inventory:
    return pb.Inventory(
        node=identity.node,
        gpus=placed(gpus(snapshot), identity.topology),
        cpus=math.floor(identity.cpus),  # what a server from before milli-CPUs reads
        cpu_milli=cpu_milli(identity.cpus),
        numa_cpus=numa_cpus(identity),
        memory_bytes=identity.memory_bytes,
        labels=dict(identity.labels),
        models_on_disk=list(identity.models_on_disk),
        backends=list(identity.backends),
        loaded_by_backend={
            name: pb.BackendModels(models=list(models)) for name, models in identity.loaded.items()
        },
        running=[
            pb.RunningAllocation(
                allocation_id=h.allocation_id,
                attempt=h.attempt,
                observed=h.observed,
                progress=h.progress,
            )
            for h in held
        ],
        agent_version=identity.version,
    )


def numa_cpus(identity: Identity) -> list[pb.NumaCpus]:
    """Each NUMA node's share of the agent's CPU slots; none when the topology is unknown."""
    if identity.topology is None:
        return []
    shares = identity.topology.cpu_shares(cpu_milli(identity.cpus))
    return [pb.NumaCpus(numa_node=n, cpu_milli=m) for n, m in shares]


def placed(cards: list[pb.Gpu], topology: Topology | None) -> list[pb.Gpu]:
    """``cards`` with their NUMA node and links, when the topology is known."""
    if topology is None:
        return cards
    for card in cards:
        if 0 <= card.index < len(topology.numa):
            card.numa_node = topology.numa[card.index]
            card.links.extend(topology.row(card.index))
    return cards


def gpus(snapshot: GpuSnapshot) -> list[pb.Gpu]:
    return [
        pb.Gpu(
            index=g.index,
            model=g.model,
            vram_total_bytes=g.vram_total_bytes,
            vram_free_bytes=g.vram_free_bytes,
            utilization=g.utilization or 0.0,
            temperature_c=g.temperature_c,
        )
        for g in snapshot.gpus
    ]


def heartbeat(snapshot: GpuSnapshot, owners: Mapping[int, str], now: float) -> pb.Heartbeat:
    """Live GPU figures, and the VRAM each allocation's processes use."""
    return pb.Heartbeat(
        gpus=gpus(snapshot),
        processes=[
            pb.ProcessVram(
                allocation_id=owners[p.pid], gpu_index=p.gpu_index, used_bytes=p.used_bytes
            )
            for p in snapshot.processes
            if p.pid in owners
        ],
        sent_at=now,
    )


def update_message(
    seq: int, report: Report, blob_ids: Mapping[int, str] | None = None
) -> pb.AgentMessage:
    """``report`` on the wire. ``blob_ids`` maps a result's index to its uploaded blob."""
    u = pb.AllocationUpdate(
        allocation_id=report.allocation_id, attempt=report.attempt, job_id=report.job_id
    )
    x = report.update
    if isinstance(x, Started):
        u.started.SetInParent()
    elif isinstance(x, Ready):
        u.ready.SetInParent()
    elif isinstance(x, Progress):
        u.progress.CopyFrom(
            pb.Progress(fraction=x.fraction, step=x.step, total=x.total, message=x.message)
        )
    elif isinstance(x, Preview):
        u.preview.CopyFrom(pb.Preview(image=x.image, mime=x.mime, step=x.step))
    elif isinstance(x, LogLine):
        u.log.CopyFrom(pb.LogLine(stream=x.stream, line=x.line))
    elif isinstance(x, Checkpoint):
        blob = (blob_ids or {}).get(0, "")  # an uploaded checkpoint (see checkpoints.py)
        u.checkpoint.CopyFrom(
            pb.Checkpoint(path=x.path, blob_id=blob, step=x.step, progress=x.progress)
        )
    elif isinstance(x, Done):
        u.finished.CopyFrom(_finished(x, blob_ids or {}))
    elif isinstance(x, Failed):
        u.failed.CopyFrom(pb.Failed(error=x.error, retryable=x.retryable))
        if report.before is not None:  # a batch cut short: what finished before the failure
            u.failed.finished_jobs.extend(report.before.jobs)
            u.failed.results.extend(_results(report.before, blob_ids or {}))
    else:
        raise TypeError(f"cannot send {type(x).__name__}")  # Finished is folded into Done
    return pb.AgentMessage(seq=seq, update=u)


def _finished(done: Done, blob_ids: Mapping[int, str]) -> pb.Finished:
    return pb.Finished(
        results=_results(done, blob_ids),
        modified=dict(done.modified),
        interrupted=done.interrupted,
        stopped_jobs=done.stopped,
    )


def _results(done: Done, blob_ids: Mapping[int, str]) -> list[pb.Result]:
    """``done``'s results on the wire: inline, or by the blob each was uploaded into."""
    results = []
    for i, jr in enumerate(done.results):
        blob = blob_ids.get(i, "")
        results.append(
            pb.Result(
                name=jr.result.name,
                mime=jr.result.mime,
                data=b"" if blob else jr.result.read(),
                blob_id=blob,
                job_id=jr.job_id,
            )
        )
    return results
