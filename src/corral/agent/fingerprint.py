"""What GPUs this node has, and how busy they are.

Three sources behind one small protocol, ``GpuInventory.snapshot()``:

* ``NvmlInventory``: the real thing, through NVML (``pynvml`` from
  ``nvidia-ml-py``): index, model, VRAM total/free, utilisation, temperature and the VRAM
  each process uses (the VRAM guard's input);
* ``FakeGpus``: ``--fake-gpus "2x RTX 4090 24GiB, 1x A100 80GiB"`` for tests
  and demos, whose figures tests can change, and which an agent makes look as busy
  (utilisation, temperature) as the work it runs on them;
* ``NoGpus``: no NVML (no driver, no library): the node offers CPU slots only.

Model names are shortened the same way for all three (``"NVIDIA GeForce RTX
4090"`` becomes ``"RTX 4090"``) so a job asking for ``RTX 4090`` matches real
and fake cards alike.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Collection
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any, Protocol

from corral.agent.topology import Topology, read_nvml
from corral.core import InvalidSpec, parse_bytes


@dataclass(frozen=True, slots=True)
class GpuStatus:
    index: int
    model: str
    vram_total_bytes: int
    vram_free_bytes: int
    utilization: float | None = None  # 0..1; None when the driver cannot say
    temperature_c: float | None = None  # the GPU die's, degrees Celsius; None: cannot say


@dataclass(frozen=True, slots=True)
class ProcessVram:
    pid: int
    gpu_index: int
    used_bytes: int


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """One reading of every GPU and every process using one."""

    gpus: tuple[GpuStatus, ...] = ()
    processes: tuple[ProcessVram, ...] = ()
    source: str = "none"  # "nvml" | "fake" | "none"
    note: str = ""  # e.g. why there is no GPU


class GpuInventory(Protocol):
    def snapshot(self) -> GpuSnapshot:
        """Read the current figures (cheap enough to call every heartbeat)."""
        ...


def detect_inventory(fake_gpus: str | None = None, nvml: ModuleType | None = None) -> GpuInventory:
    """The inventory this agent should use: fake when asked, else NVML, else none."""
    if fake_gpus:
        return FakeGpus.parse(fake_gpus)
    try:
        module = nvml or importlib.import_module("pynvml")
        return NvmlInventory(module)
    except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded...
        return NoGpus(f"no NVML ({type(exc).__name__}: {exc}); CPU only")


def short_model(name: str | bytes) -> str:
    """``"NVIDIA GeForce RTX 4090"`` -> ``"RTX 4090"``; NVML may return bytes."""
    text = name.decode() if isinstance(name, bytes) else name
    return re.sub(r"^(NVIDIA\s+)?(GeForce\s+)?", "", text.strip()) or text.strip()


class NoGpus:
    """A node without usable GPUs."""

    def __init__(self, note: str = "") -> None:
        self._note = note

    def snapshot(self) -> GpuSnapshot:
        return GpuSnapshot(source="none", note=self._note)


class NvmlInventory:
    """GPU figures from NVML. ``nvml`` is the ``pynvml`` module (a fake in tests)."""

    def __init__(self, nvml: ModuleType) -> None:
        self._nvml = nvml
        nvml.nvmlInit()
        count = nvml.nvmlDeviceGetCount()
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self._models = [short_model(nvml.nvmlDeviceGetName(h)) for h in self._handles]

    def snapshot(self) -> GpuSnapshot:
        gpus, processes = [], []
        for index, handle in enumerate(self._handles):
            memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            status = GpuStatus(index, self._models[index], int(memory.total), int(memory.free))
            gpus.append(
                replace(
                    status,
                    utilization=self._utilization(handle),
                    temperature_c=self._temperature(handle),
                )
            )
            processes.extend(self._processes(index, handle))
        return GpuSnapshot(tuple(gpus), tuple(processes), source="nvml")

    def topology(self) -> Topology:
        """How the GPUs are linked and which NUMA node each is on (``topology.py``)."""
        return read_nvml(self._nvml, self._handles)

    def close(self) -> None:
        self._nvml.nvmlShutdown()

    def _utilization(self, handle: Any) -> float | None:
        try:
            return float(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu) / 100.0
        except self._nvml.NVMLError:
            return None  # e.g. NVML_ERROR_NOT_SUPPORTED on some consumer cards

    def _temperature(self, handle: Any) -> float | None:
        try:
            return float(
                self._nvml.nvmlDeviceGetTemperature(handle, self._nvml.NVML_TEMPERATURE_GPU)
            )
        except self._nvml.NVMLError:
            return None  # NVML_ERROR_NOT_SUPPORTED: no sensor the driver exposes

    def _processes(self, index: int, handle: Any) -> list[ProcessVram]:
        """Compute and graphics processes on one GPU, each pid once."""
        seen: dict[int, ProcessVram] = {}
        for query in (
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetGraphicsRunningProcesses",
        ):
            try:
                found = getattr(self._nvml, query)(handle)
            except (self._nvml.NVMLError, AttributeError):
                continue
            for proc in found:
                used = proc.usedGpuMemory  # None when the driver hides it (e.g. in containers)
                seen.setdefault(proc.pid, ProcessVram(int(proc.pid), index, int(used or 0)))
        return list(seen.values())


# Fake cards' temperatures: a consumer card idles near 35 degrees Celsius and settles near
# 75 under full load, about half a minute after the load changes.
IDLE_C = 35.0
HOT_C = 75.0
WARM_S = 30.0

_GROUP = re.compile(r"^\s*(?:(\d+)\s*x\s+)?(.+?)\s+(\d+(?:\.\d+)?\s*[KMGT]i?B?)\s*$", re.I)


class FakeGpus:
    """Invented GPUs for tests and demos. Figures change through the setters."""

    def __init__(self, cards: list[tuple[str, int]]) -> None:
        self._cards = cards
        self._utilization: dict[int, float] = {}
        self._temperature: dict[int, float] = {}
        self._used: dict[int, tuple[int, int]] = {}  # pid -> (gpu index, bytes)

    @classmethod
    def parse(cls, text: str) -> FakeGpus:
        """``"2x RTX 4090 24GiB, 1x A100 80GiB"``: comma-separated ``[N x] MODEL SIZE``."""
        cards: list[tuple[str, int]] = []
        for group in text.split(","):
            match = _GROUP.match(group)
            if not match or re.fullmatch(r"\d+\s*x", match.group(2), re.I):
                raise InvalidSpec(
                    "fake_gpus", f"cannot read {group.strip()!r}: write e.g. '2x RTX 4090 24GiB'"
                )
            count = int(match.group(1) or 1)
            if count < 1:
                raise InvalidSpec("fake_gpus", f"{group.strip()!r}: count must be >= 1")
            size = parse_bytes(match.group(3), field_name="fake_gpus")
            cards += [(match.group(2).strip(), size)] * count
        return cls(cards)

    def snapshot(self) -> GpuSnapshot:
        gpus = tuple(
            GpuStatus(
                i,
                model,
                total,
                max(0, total - self._used_on(i)),
                self._utilization.get(i),
                self._temperature.get(i),
            )
            for i, (model, total) in enumerate(self._cards)
        )
        procs = tuple(ProcessVram(pid, i, used) for pid, (i, used) in sorted(self._used.items()))
        return GpuSnapshot(gpus, procs, source="fake")

    def use(self, pid: int, gpu_index: int, used_bytes: int) -> None:
        """Pretend process ``pid`` holds ``used_bytes`` of VRAM on GPU ``gpu_index``."""
        self._check_index(gpu_index)
        self._used[pid] = (gpu_index, used_bytes)

    def release(self, pid: int) -> None:
        self._used.pop(pid, None)

    def set_utilization(self, gpu_index: int, fraction: float) -> None:
        self._check_index(gpu_index)
        if not 0.0 <= fraction <= 1.0:
            raise InvalidSpec("utilization", f"must be within 0..1, got {fraction}")
        self._utilization[gpu_index] = fraction

    def follow_work(self, busy: Collection[int], elapsed_s: float) -> None:
        """Look like cards doing the agent's work: fully used while work holds them, idle
        otherwise, warming towards ``HOT_C`` or cooling towards ``IDLE_C`` with a time
        constant of ``WARM_S`` (so a demo's plots show work as a real card's would)."""
        step = 1.0 - math.exp(-max(0.0, elapsed_s) / WARM_S)
        for i in range(len(self._cards)):
            target = HOT_C if i in busy else IDLE_C
            now = self._temperature.get(i, IDLE_C)
            self._temperature[i] = round(now + (target - now) * step, 1)
            self._utilization[i] = 1.0 if i in busy else 0.0

    def set_temperature(self, gpu_index: int, celsius: float) -> None:
        self._check_index(gpu_index)
        if not -50.0 <= celsius <= 150.0:  # past what any GPU sensor reads: a test's typo
            raise InvalidSpec("temperature_c", f"must be within -50..150, got {celsius}")
        self._temperature[gpu_index] = celsius

    def _used_on(self, gpu_index: int) -> int:
        return sum(b for i, b in self._used.values() if i == gpu_index)

    def _check_index(self, gpu_index: int) -> None:
        if not 0 <= gpu_index < len(self._cards):
            raise InvalidSpec("gpu_index", f"no fake GPU {gpu_index} (have {len(self._cards)})")
