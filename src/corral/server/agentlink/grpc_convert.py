"""Wire <-> domain translation for the gRPC agent link (pure functions, no I/O).

The protobuf messages of ``proto/corral/v1/agent.proto`` meet the server's own
types of ``agentlink.base`` here and nowhere else, so the servicer and the
link stay about flow, not field copying.

A checkpoint the agent reports is a path (or an uploaded blob id) and a step;
the server stores the reference (``blob:<id>`` for an upload) and the step
per job, and hands both back (``resume_from``, ``resume_step``) when the job
is assigned again. ``checkpoint_ref`` / ``split_ref`` read and write the
older one-string form ``path#step=N``, still understood.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from corral.core.model import Gpu
from corral.core.resources import MAX_MEMORY, MILLI_CPU, cpu_milli
from corral.core.states import StopReason
from corral.proto.gen.corral.v1 import agent_pb2 as pb
from corral.server.agentlink.base import (
    Assignment,
    HelloReply,
    Inventory,
    JobWork,
    Running,
    StopOrder,
)
from corral.server.store.jsontext import dumps

_STOP_TO_WIRE = {
    StopReason.CANCEL: pb.STOP_REASON_CANCEL,
    StopReason.INTERRUPT: pb.STOP_REASON_INTERRUPT,
    StopReason.PREEMPT: pb.STOP_REASON_PREEMPT,
    StopReason.TIMEOUT: pb.STOP_REASON_TIMEOUT,
}
_REF_STEP = re.compile(r"^(?P<path>.*)#step=(?P<step>\d+)$")


def inventory_from(msg: pb.Inventory, agent_version: str = "") -> Inventory:
    """The server's ``Inventory`` from a hello; models loaded by any backend count as loaded."""
    loaded = {m for models in msg.loaded_by_backend.values() for m in models.models}
    return Inventory(
        node=msg.node,
        gpus=gpus_from(msg.gpus),
        cpus=msg.cpu_milli / MILLI_CPU if msg.cpu_milli else msg.cpus,
        labels=dict(msg.labels),
        models_on_disk=frozenset(msg.models_on_disk),
        models_loaded=frozenset(loaded),
        backends=frozenset(msg.backends),
        agent_version=msg.agent_version or agent_version,
        numa_cpus=numa_cpus_from(msg.numa_cpus),
        memory_bytes=min(max(msg.memory_bytes, 0), MAX_MEMORY),
    )


MAX_NUMA_NODES = 64
"""NUMA nodes kept from a hello (the largest machines have 32): beyond, or with a node
named twice or negative slots, the report is dropped and the node's CPUs are one pool,
so no agent makes every fit on its node walk a long list."""


def numa_cpus_from(report: Iterable[pb.NumaCpus]) -> tuple[tuple[int, float], ...]:
    """An agent's CPU slots per NUMA node, sorted by node; () when not plausible."""
    pairs = sorted((n.numa_node, n.cpu_milli) for n in report)
    if len(pairs) > MAX_NUMA_NODES or len({n for n, _ in pairs}) < len(pairs):
        return ()
    if any(n < 0 or milli < 0 for n, milli in pairs):
        return ()
    return tuple((n, milli / MILLI_CPU) for n, milli in pairs)


def running_from(msg: pb.Inventory) -> list[Running]:
    """What the agent holds: running work and finished work whose end is not yet acknowledged."""
    return [Running(r.allocation_id, r.attempt) for r in msg.running]


def gpus_from(gpus: Iterable[pb.Gpu]) -> tuple[Gpu, ...]:
    return tuple(
        Gpu(
            index=g.index,
            model=g.model,
            vram_bytes=g.vram_total_bytes,
            vram_free_bytes=g.vram_free_bytes,
            utilization=g.utilization,
            temperature_c=g.temperature_c if g.HasField("temperature_c") else None,
            numa=g.numa_node if g.HasField("numa_node") else -1,
            links=tuple(g.links),
        )
        for g in gpus
    )


def welcome_messages(node: str, reply: HelloReply) -> list[pb.ServerMessage]:
    """Welcome first, then what the agent must run and stop, then the intake state."""
    out = [
        pb.ServerMessage(
            welcome=pb.Welcome(
                node=node,
                heartbeat_interval_s=reply.heartbeat_s,
                stop_allocations=[s.allocation_id for s in reply.stop],
            )
        )
    ]
    out += [assign_message(a) for a in reply.assign]
    out += [stop_message(s) for s in reply.stop]
    out.append(intake_message(reply.intake_open))
    return out


def assign_message(a: Assignment) -> pb.ServerMessage:
    return pb.ServerMessage(
        assign=pb.Assign(
            allocation_id=a.allocation_id,
            attempt=a.attempt,
            gpu_indices=list(a.gpu_indices),
            gpu_milli=a.gpu_milli,
            vram_bytes=a.vram_bytes,
            cpus=math.ceil(a.cpus),
            cpu_milli=cpu_milli(a.cpus),
            on_cpu=a.on_cpu,
            memory_bytes=a.memory_bytes,
            jobs=[_work(w) for w in a.jobs],
            replica=a.replica,
            replicas=a.replicas,
            master_addr=a.master_addr,
            master_port=a.master_port,
        )
    )


def _work(w: JobWork) -> pb.Work:
    path, step = split_ref(w.checkpoint)
    step = w.checkpoint_step or step
    return pb.Work(
        job_id=w.job_id,
        kind=w.kind.value,
        payload_json=dumps(dict(w.payload)),
        model=w.model or "",
        backend=w.backend or "",
        timeout_s=w.timeout_s or 0.0,
        resume_from=path,
        resume_step=step,
        inputs=[pb.InputRef(name=f.name, sha256=f.sha256) for f in w.inputs],
    )


def stop_message(order: StopOrder) -> pb.ServerMessage:
    return pb.ServerMessage(
        stop=pb.Stop(
            allocation_id=order.allocation_id,
            reason=_STOP_TO_WIRE[order.reason],
            grace_s=order.grace_s,
            job_id=order.job_id,
        )
    )


def intake_message(open_: bool) -> pb.ServerMessage:
    return pb.ServerMessage(intake=pb.Intake(paused=not open_))


def ack_message(seq: int, allocation_id: str, status: str) -> pb.ServerMessage:
    return pb.ServerMessage(ack=pb.UpdateAck(seq=seq, allocation_id=allocation_id, status=status))


def checkpoint_ref(path: str, step: int) -> str:
    """One reference for a checkpoint: ``path`` alone, or ``path#step=N``."""
    return f"{path}#step={step}" if step > 0 else path


def split_ref(ref: str | None) -> tuple[str, int]:
    """``checkpoint_ref`` read back: (path, step); ("", 0) for no checkpoint."""
    if not ref:
        return "", 0
    match = _REF_STEP.match(ref)
    if match is None:
        return ref, 0
    return match.group("path"), int(match.group("step"))


def progress_message(p: pb.Progress) -> str | None:
    """The words shown with a progress figure: the agent's, or "step 3/20"."""
    if p.message:
        return p.message
    if p.total > 0:
        return f"step {p.step}/{p.total}"
    return None


def log_line(line: pb.LogLine) -> str:
    """stdout lines as they are; other streams tagged (``[stderr] ...``)."""
    if line.stream in ("", "stdout"):
        return line.line
    return f"[{line.stream}] {line.line}"
