"""``Need``: what one replica of a job asks of a node, as a hashable key.

Two jobs with equal needs are treated alike by every filter and by the fit
search, so the scheduler caches per need rather than per job: static filter
verdicts per node class, and "did not fit" until capacity is given back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from corral.core.model import Job
from corral.core.resources import MILLI, cpus_text

if TYPE_CHECKING:
    from mypy_extensions import i64


@dataclass(frozen=True, slots=True)
class Need:
    """One replica's demand. ``on_cpu`` is the CPU-offload variant of a GPU job.

    ``shared`` and ``cpu_only`` are derived once at construction, and the hash
    is kept: needs are dictionary keys on the hot path of every cycle.
    """

    gpus: i64 = 0  # whole cards
    milli: i64 = 0  # compute share of one card (shared jobs)
    vram: i64 = 0  # bytes: minimum per card (whole) or reserved on the card (shared)
    cpus: i64 = 0  # milli-CPUs
    gpu_models: frozenset[str] = frozenset()
    selector: tuple[tuple[str, str], ...] = ()
    backend: str | None = None
    on_cpu: bool = False
    shared: bool = field(init=False, compare=False)
    cpu_only: bool = field(init=False, compare=False)
    picky: bool = field(init=False, compare=False, repr=False)  # a VRAM floor or models named
    _hash: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        shared = self.gpus == 0 and not self.on_cpu and (self.milli > 0 or self.vram > 0)
        object.__setattr__(self, "shared", shared)
        object.__setattr__(self, "cpu_only", self.on_cpu or (self.gpus == 0 and not shared))
        object.__setattr__(self, "picky", self.vram != 0 or len(self.gpu_models) > 0)
        key = (self.gpus, self.milli, self.vram, self.cpus, self.gpu_models, self.selector)
        object.__setattr__(self, "_hash", hash((key, self.backend, self.on_cpu)) >> 2)

    def __hash__(self) -> int:
        return self._hash

    def nominal_milli(self) -> int:
        """Milli-GPUs before the card is known (a lower bound for shared jobs)."""
        if self.on_cpu:
            return 0
        if self.gpus:
            return self.gpus * MILLI
        return max(self.milli, 1) if self.shared else 0

    def describe(self) -> str:
        """``"2 GPUs"``, ``"0.25 GPU + 12 GiB VRAM"``, ``"4 CPUs"``: for messages."""
        if self.cpu_only:
            return cpus_text(self.cpus)
        if self.gpus:
            return f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}"
        parts = [f"{self.milli / MILLI:g} GPU"] if self.milli else []
        if self.vram:
            parts.append(f"{self.vram / 1024**3:g} GiB VRAM")
        return " + ".join(parts)


def need_of(job: Job, *, on_cpu: bool = False) -> Need:
    """The ``Need`` of one replica of ``job`` (on CPU slots when ``on_cpu``)."""
    r = job.resources
    selector = tuple(sorted(job.node_selector.items()))
    if on_cpu:
        return Need(cpus=r.cpu_milli, selector=selector, backend=job.backend, on_cpu=True)
    return Need(
        gpus=r.gpus,
        milli=r.gpu_milli,
        vram=r.vram_bytes,
        cpus=r.cpu_milli,
        gpu_models=r.gpu_models,
        selector=selector,
        backend=job.backend,
    )


def on_cpu(need: Need) -> Need:
    """The CPU-offload variant of ``need`` (as ``need_of(job, on_cpu=True)`` gives it)."""
    return Need(cpus=need.cpus, selector=need.selector, backend=need.backend, on_cpu=True)
