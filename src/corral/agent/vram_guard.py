"""The VRAM guard: stop an allocation before it starves its neighbours.

Shared GPUs are handed out by VRAM reservation. A job that reserved 8 GiB but
grows to 14 GiB on a 24 GiB card it shares will make its neighbour run out of
memory, so the agent compares NVML's per-process figures with reservations
every heartbeat and stops the offender with a clear error.

``find_violations`` is the pure decision; ``VramGuard`` adds the only state
(strikes: a reading must be over for ``strikes`` heartbeats in a row, so a
momentary spike while a CUDA context is created does not kill a job);
``process_tree`` maps an allocation's root process to all its pids.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from corral.agent.fingerprint import GpuSnapshot
from corral.core import GIB


@dataclass(frozen=True, slots=True)
class Reservation:
    """What one allocation may use: ``vram_bytes`` per listed GPU (0: the whole card)."""

    allocation_id: str
    gpu_indices: tuple[int, ...]
    vram_bytes: int = 0


@dataclass(frozen=True, slots=True)
class VramViolation:
    allocation_id: str
    gpu_index: int
    used_bytes: int
    allowed_bytes: int  # 0 when the GPU was not given to it at all

    @property
    def error(self) -> str:
        """The message the job fails with."""
        used = f"{self.used_bytes / GIB:.1f} GiB"
        if self.allowed_bytes == 0:
            return (
                f"allocation {self.allocation_id} uses {used} of VRAM on GPU {self.gpu_index}, "
                "which it was not given; stopped so it does not starve that GPU's jobs"
            )
        return (
            f"allocation {self.allocation_id} uses {used} of VRAM on GPU {self.gpu_index} "
            f"but reserved {self.allowed_bytes / GIB:.1f} GiB; stopped so it does not starve "
            "its neighbours (ask for more VRAM)"
        )


def find_violations(
    snapshot: GpuSnapshot,
    reservations: Iterable[Reservation],
    owners: Mapping[int, str],
    slack_bytes: int = 0,
) -> list[VramViolation]:
    """Allocations using more VRAM than reserved (plus ``slack_bytes``), per GPU.

    ``owners`` maps a pid to the allocation it belongs to; processes of no
    allocation (the desktop, a backend between jobs) are not judged here.
    """
    used: dict[tuple[str, int], int] = {}
    for proc in snapshot.processes:
        alloc = owners.get(proc.pid)
        if alloc is not None:
            used[alloc, proc.gpu_index] = used.get((alloc, proc.gpu_index), 0) + proc.used_bytes
    totals = {g.index: g.vram_total_bytes for g in snapshot.gpus}
    by_id = {r.allocation_id: r for r in reservations}
    found = []
    for (alloc, gpu), amount in sorted(used.items()):
        res = by_id.get(alloc)
        if res is None:
            continue
        allowed = _allowed(res, gpu, totals)
        if amount > (allowed + slack_bytes if allowed else 0):
            found.append(VramViolation(alloc, gpu, amount, allowed))
    return found


def _allowed(res: Reservation, gpu: int, totals: Mapping[int, int]) -> int:
    if gpu not in res.gpu_indices:
        return 0
    return res.vram_bytes if res.vram_bytes else totals.get(gpu, 0)


class VramGuard:
    """Reports an allocation once it has been over its reservation ``strikes`` times in a row."""

    def __init__(self, strikes: int = 2, slack_bytes: int = 0) -> None:
        if strikes < 1:
            raise ValueError("strikes must be >= 1")
        self._strikes = strikes
        self._slack = slack_bytes
        self._counts: dict[tuple[str, int], int] = {}

    def observe(
        self,
        snapshot: GpuSnapshot,
        reservations: Iterable[Reservation],
        owners: Mapping[int, str],
    ) -> list[VramViolation]:
        """Feed one reading; return the violations that must be stopped now."""
        over = find_violations(snapshot, reservations, owners, self._slack)
        keys = [(v.allocation_id, v.gpu_index) for v in over]
        self._counts = {k: self._counts.get(k, 0) + 1 for k in keys}  # under the limit: reset
        return [v for v, k in zip(over, keys, strict=True) if self._counts[k] >= self._strikes]


def process_tree(root_pid: int, proc: Path = Path("/proc")) -> set[int]:
    """``root_pid`` and all its descendants, read from ``/proc`` (Linux)."""
    children: dict[int, list[int]] = {}
    for stat in proc.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # the process ended while we looked
        fields = text[text.rfind(")") + 2 :].split()  # after "pid (comm) "
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = set(), [root_pid]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, []))
    return tree
