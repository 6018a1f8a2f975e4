"""Groups: queued jobs the planner treats alike, so a pass can skip them together.

A group is one team's jobs of one per-replica need, replica count, CPU fallback and
run-time estimate bucket. When one of them is known not to fit, none of them does, so a
pass skips a whole group at once (``passes.py``) instead of walking its jobs.
"""

from __future__ import annotations

from corral.scheduler.need import Need


class Group:
    """Jobs the planner treats alike when they do not fit (see ``Planner.live``).

    Interned by ``Queue``: equal groups are the same object, so a group is a dictionary
    key by identity.
    """

    __slots__ = ("cpu", "floor", "lowest", "need", "replicas", "team")

    def __init__(
        self, team: str, need: Need, replicas: int, cpu: bool, floor: float | None
    ) -> None:
        self.team = team
        self.need = need
        self.replicas = replicas
        self.cpu = cpu  # may fall back to CPU slots (``cpu_fallback`` of a GPU job)
        self.floor = floor  # a lower bound of the run-time estimates in it; None: none
        self.lowest = need.nominal_milli() * replicas  # the least milli a job of it takes

    def __repr__(self) -> str:
        return f"Group({self.team!r}, {self.need!r}, {self.replicas}, {self.cpu}, {self.floor})"


def runtime_bucket(estimate: float | None) -> int:
    """The bucket of a run-time estimate: powers of two, so a group holds similar run
    times (which decide whether a job may backfill before a reservation). By exponent:
    the bits of the whole seconds, -1 under a second, -2 without an estimate."""
    if estimate is None:
        return -2
    return -1 if estimate < 1 else int(estimate).bit_length()


def bucket_floor(bucket: int) -> float | None:
    """The least estimate of ``bucket`` (``runtime_bucket``): a power of two, 0 under a
    second, None without an estimate."""
    if bucket == -2:
        return None
    return 0.0 if bucket == -1 else float(1 << (bucket - 1))
