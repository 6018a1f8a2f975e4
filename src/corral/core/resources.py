"""Resource requests and their arithmetic.

GPU compute is counted in milli-GPUs (``MILLI`` = one whole GPU) so that
shared-GPU jobs (half a card, a tenth of a card) add up exactly, with no
float drift. VRAM is counted in bytes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Final

from corral.core.errors import InvalidSpec

MILLI: Final = 1000
"""Milli-GPUs in one whole GPU."""

GIB: Final = 1024**3
MILLI_CPU: Final = 1000
"""Milli-CPUs in one CPU: requests like Kubernetes' ``500m`` and trace rows like 11.4 CPUs
are exact in it; the scheduler counts CPU slots in milli-CPUs."""
MAX_CPUS: Final = 1_000_000
_CPU_TEXT = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(m?)\s*$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
MAX_MEMORY: Final = 1 << 60
"""An exbibyte: more host memory than any machine has (a request above it is a typo)."""
_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:[eE]([+-]?\d+))?\s*([A-Za-z]*)\s*$")
_QUANTITY_UNITS: Final = {
    "": 1,
    "b": 1,
    "k": 1000,
    "m": 1000**2,
    "g": 1000**3,
    "t": 1000**4,
    "p": 1000**5,
    "e": 1000**6,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
    "ti": 1024**4,
    "pi": 1024**5,
    "ei": 1024**6,
}


def parse_bytes(text: str | int | float, *, field_name: str = "size") -> int:
    """Parse ``"24GiB"``, ``"512 MiB"``, ``"8G"`` or a plain number into bytes."""
    if isinstance(text, int | float):
        if text < 0:
            raise InvalidSpec(field_name, f"must not be negative, got {text}")
        return int(text)
    match = _SIZE.match(text)
    if not match:
        raise InvalidSpec(field_name, f"not a size: {text!r} (try '24GiB' or '512MiB')")
    number, unit = float(match.group(1)), (match.group(2) or "B").upper()
    letter = unit[0]
    if letter == "B":
        return int(number)
    base = 1024 if "I" in unit else 1000
    scale = base ** ("KMGT".index(letter) + 1)
    return int(number * scale)


def parse_memory(value: object, *, field_name: str = "memory") -> int:
    """Host memory in bytes from a Kubernetes quantity: ``"512Mi"``, ``"16Gi"``, ``"1G"``,
    ``"1.5Gi"``, ``"129e6"``, a plain number of bytes, or ``"16GiB"``/``"512 MB"`` as
    ``parse_bytes`` reads sizes.

    ``M``, ``G``, ... are decimal (10^6, 10^9), ``Mi``, ``Gi``, ... binary, as Kubernetes
    reads them; a fraction of a byte rounds up (Kubernetes does too). Refuses, naming the
    field: a negative or absurd amount, text that is not a quantity, and ``m`` (Kubernetes'
    milli: ``500m`` of memory is half a byte, always a typo for ``500M`` or ``500Mi``).
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidSpec(field_name, f"expected bytes or a quantity like '16Gi', got {value!r}")
    if isinstance(value, str):
        match = _QUANTITY.match(value)
        unit = match.group(3) if match else ""
        if unit == "m":
            amount = value.strip()[:-1].strip()
            raise InvalidSpec(
                field_name, f"{value!r} is milli-bytes; write {amount}Mi or {amount}M"
            )
        key = unit.lower()
        if key.endswith("b") and key != "b":  # "16GiB", "512MB": sizes as parse_bytes reads
            key = key[:-1]
        scale = _QUANTITY_UNITS.get(key)
        if match is None or scale is None:
            raise InvalidSpec(
                field_name, f"not a memory quantity: {value!r} (try '512Mi', '16Gi' or '1G')"
            )
        exponent = int(match.group(2) or 0)
        if abs(exponent) > 30:
            raise InvalidSpec(field_name, f"{value!r} is more memory than any machine has")
        number = Fraction(match.group(1)) * Fraction(10) ** exponent * scale  # exact
    else:
        if not math.isfinite(value) or value < 0:
            raise InvalidSpec(field_name, f"must be a finite amount >= 0, got {value!r}")
        number = Fraction(value)
    if number > MAX_MEMORY:
        raise InvalidSpec(field_name, f"{value!r} is more memory than any machine has")
    return math.ceil(number)


def memory_text(size: int) -> str:
    """``"512 MiB"``, ``"16 GiB"``, ``"1.5 TiB"``, ``"100 bytes"``: for messages."""
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= scale:
            return f"{size / scale:.4g} {unit}"
    return f"{size} byte{'' if size == 1 else 's'}"


def parse_cpus(value: object, *, field_name: str = "cpus") -> float:
    """CPUs as a number of milli-CPU precision: ``2``, ``0.5``, ``"0.5"``, ``"500m"``.

    Returns the count in CPUs, an int when whole (``cpu_milli`` gives it exactly in
    milli-CPUs); refuses, naming the field, a negative, non-finite or absurd count, one
    finer than a milli-CPU, and text that is not a number.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidSpec(field_name, f"expected a number of CPUs or '500m', got {value!r}")
    if isinstance(value, str):
        match = _CPU_TEXT.match(value)
        if not match:
            raise InvalidSpec(field_name, f"not a CPU count: {value!r} (try 2, 0.5 or '500m')")
        number = float(match.group(1)) / (MILLI_CPU if match.group(2) else 1)
    else:
        number = float(value)
    if not math.isfinite(number) or number < 0:
        raise InvalidSpec(field_name, f"must be a finite number >= 0, got {value!r}")
    if number > MAX_CPUS:
        raise InvalidSpec(field_name, f"{value!r} is more CPUs than any machine has")
    milli = round(number * MILLI_CPU)
    if abs(milli - number * MILLI_CPU) > 1e-6 * max(1.0, number):
        raise InvalidSpec(field_name, f"{value!r} is finer than a milli-CPU (0.001)")
    whole, part = divmod(milli, MILLI_CPU)
    return whole if not part else milli / MILLI_CPU  # a whole count stays an int (JSON "2")


def cpus_text(milli: int) -> str:
    """``"1 CPU"``, ``"0.5 CPUs"``, ``"11.4 CPUs"`` for a count in milli-CPUs (messages)."""
    return f"{milli / MILLI_CPU:g} CPU{'' if milli == MILLI_CPU else 's'}"


def cpu_milli(cpus: float) -> int:
    """``cpus`` (of milli-CPU precision, as ``parse_cpus`` gives) in milli-CPUs."""
    return round(cpus * MILLI_CPU)


@dataclass(frozen=True, slots=True)
class ResourceRequest:
    """What ONE replica of a job needs.

    Three shapes:
      * whole GPUs: ``gpus >= 1``; ``vram_bytes`` is the minimum VRAM of each GPU;
      * a shared GPU: ``gpus == 0`` with ``gpu_milli`` (a compute share of one card,
        0 < x < 1000) and/or ``vram_bytes`` (VRAM reserved on that card);
      * CPU only: no GPU at all.
    ``cpu_fallback`` lets a GPU job run on CPU slots when no GPU is free and
    its priority class allows CPU offload. ``cpus`` may be fractional, to a milli-CPU
    (``parse_cpus``); the scheduler counts it in milli-CPUs (``cpu_milli``).
    ``memory_bytes`` is host memory (``parse_memory``), 0 when the job asks for none.
    """

    gpus: int = 0
    gpu_milli: int = 0
    vram_bytes: int = 0
    cpus: float = 1
    gpu_models: frozenset[str] = field(default_factory=frozenset)
    cpu_fallback: bool = False
    memory_bytes: int = 0

    def __post_init__(self) -> None:
        if self.gpus < 0:
            raise InvalidSpec("resources.gpus", f"must be >= 0, got {self.gpus}")
        if not 0 <= self.gpu_milli < MILLI:
            raise InvalidSpec(
                "resources.gpu_milli", f"must be in [0, {MILLI}) (a share of one GPU)"
            )
        if self.gpus and self.gpu_milli:
            raise InvalidSpec(
                "resources.gpu_milli", "a job takes whole GPUs or a share of one, not both"
            )
        if self.vram_bytes < 0:
            raise InvalidSpec("resources.vram_bytes", "must be >= 0")
        if not 0 <= self.memory_bytes <= MAX_MEMORY:
            raise InvalidSpec("resources.memory", f"must be in [0, 2^60], got {self.memory_bytes}")
        cpus = self.cpus
        if cpus.__class__ is not int or not 0 <= cpus <= MAX_CPUS:  # else nothing to check
            parse_cpus(cpus, field_name="resources.cpus")

    def __hash__(self) -> int:
        """The hash ``dataclass`` would generate, written out: compiled, it is one of the
        simulator's per-job costs (the queue's cache of needs is keyed by request)."""
        return hash(
            (
                self.gpus,
                self.gpu_milli,
                self.vram_bytes,
                self.cpus,
                self.gpu_models,
                self.cpu_fallback,
                self.memory_bytes,
            )
        )

    def __eq__(self, other: object) -> bool:
        """What ``dataclass`` would generate (every field compared, in order; another class
        not equal), written out as ``__hash__`` is: a dict hit on the cache of needs compares
        the request found with the job's, and a generated ``__eq__`` stays interpreted."""
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, ResourceRequest)
        return (
            self.gpus == other.gpus
            and self.gpu_milli == other.gpu_milli
            and self.vram_bytes == other.vram_bytes
            and self.cpus == other.cpus
            and self.gpu_models == other.gpu_models
            and self.cpu_fallback == other.cpu_fallback
            and self.memory_bytes == other.memory_bytes
        )

    @property
    def cpu_milli(self) -> int:
        """Milli-CPUs one replica takes."""
        return round(self.cpus * MILLI_CPU)

    @property
    def shared(self) -> bool:
        """True when the job reserves a share of one GPU rather than whole cards."""
        return self.gpus == 0 and (self.gpu_milli > 0 or self.vram_bytes > 0)

    @property
    def wants_gpu(self) -> bool:
        return self.gpus > 0 or self.shared

    def milli_on(self, gpu_vram_bytes: int) -> int:
        """Milli-GPUs this replica occupies on a GPU with ``gpu_vram_bytes`` of VRAM.

        A shared job takes the larger of its compute share and its VRAM share,
        so a job reserving 12 GiB of a 24 GiB card counts as half a GPU.
        """
        if self.gpus:
            return self.gpus * MILLI
        if not self.shared:
            return 0
        vram_share = math.ceil(self.vram_bytes * MILLI / gpu_vram_bytes) if gpu_vram_bytes else 0
        return max(self.gpu_milli, min(vram_share, MILLI), 1)

    def nominal_milli(self) -> int:
        """Milli-GPUs counted against quotas when the card is not known yet."""
        if self.gpus:
            return self.gpus * MILLI
        return self.gpu_milli if self.gpu_milli else (1 if self.shared else 0)

    @staticmethod
    def from_gpus(gpus: float, **kwargs: object) -> ResourceRequest:
        """Build from a float GPU count: ``2`` whole GPUs, ``0.25`` a quarter of one."""
        if gpus < 0:
            raise InvalidSpec("gpus", f"must be >= 0, got {gpus}")
        if gpus >= 1:
            if gpus != int(gpus):
                raise InvalidSpec("gpus", f"{gpus}: use a whole number, or a share below 1")
            return ResourceRequest(gpus=int(gpus), **kwargs)  # type: ignore[arg-type]
        return ResourceRequest(gpu_milli=round(gpus * MILLI), **kwargs)  # type: ignore[arg-type]
