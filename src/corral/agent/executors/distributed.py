"""What a gang replica's process is told: its rank and where the ranks meet.

A replica runs one process (``RANK`` = the replica, ``WORLD_SIZE`` = the
gang) unless its payload asks for ``"launcher": "torchrun"``; then the
replica runs ``torchrun`` with ``--nnodes`` / ``--node-rank`` /
``--rdzv-endpoint`` filled in, one worker per GPU of the replica (one on a
CPU-only node), and torchrun gives each worker its own ``RANK`` and
``LOCAL_RANK``. Either way ``MASTER_ADDR:MASTER_PORT`` is replica 0's node and
the port the server handed out there, and the ``CORRAL_*`` names carry the
same values for scripts that read corral's own.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from corral.agent.executors.base import Gang, JobWork
from corral.core import InvalidSpec

LAUNCHERS = ("", "torchrun")


def gang_env(job: JobWork) -> dict[str, str]:
    """The variables ``torch.distributed`` reads with its ``env://`` init, for one process
    per replica (torchrun overrides the per-worker ones); empty outside a gang."""
    gang = job.gang
    if gang is None:
        return {}
    shared = {
        "WORLD_SIZE": str(gang.size),
        "RANK": str(gang.rank),
        "NODE_RANK": str(gang.rank),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": gang.master_addr,
        "MASTER_PORT": str(gang.master_port),
    }
    return shared | {f"CORRAL_{k}": v for k, v in shared.items()}


def launcher_of(payload: Mapping[str, object]) -> str:
    """The payload's ``launcher``: "" (run the command as is) or "torchrun"."""
    value = payload.get("launcher", "")
    if value not in LAUNCHERS:
        raise InvalidSpec("payload.launcher", f"must be one of {', '.join(map(repr, LAUNCHERS))}")
    return str(value)


def launch_argv(argv: list[str], job: JobWork, launcher: str) -> list[str]:
    """``argv`` as this replica runs it: wrapped in torchrun when asked (and in a gang)."""
    if launcher != "torchrun":
        return argv
    gang = job.gang or Gang(0, 1, "127.0.0.1", 29400)  # a lone job: a gang of one, here
    workers = max(1, len(job.gpu_indices))
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={gang.size}",
        f"--node-rank={gang.rank}",
        f"--nproc-per-node={workers}",
        "--rdzv-backend=static",
        f"--rdzv-endpoint={gang.master_addr}:{gang.master_port}",
        "--no-python",
        *argv,
    ]
