"""GPU inventory: the NVML reader against a fake pynvml module, and fake GPUs."""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import pytest

from corral.agent.fingerprint import (
    FakeGpus,
    GpuStatus,
    NoGpus,
    NvmlInventory,
    ProcessVram,
    detect_inventory,
    short_model,
)
from corral.core import GIB, InvalidSpec


class NVMLError(Exception):
    pass


@dataclass
class FakeDevice:
    name: str | bytes
    total: int
    free: int
    util: int | None  # percent; None: NOT_SUPPORTED
    compute: list[tuple[int, int | None]] = field(default_factory=list)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    temperature: int | None = None  # degrees Celsius; None: NOT_SUPPORTED


def fake_pynvml(devices: list[FakeDevice], init_error: Exception | None = None) -> types.ModuleType:
    """Just enough of pynvml's surface, with its shapes (named tuples, bytes names, errors)."""
    nvml = types.ModuleType("pynvml")
    nvml.NVMLError = NVMLError  # type: ignore[attr-defined]
    calls: list[str] = []
    nvml.calls = calls  # type: ignore[attr-defined]

    def init() -> None:
        calls.append("init")
        if init_error:
            raise init_error

    def processes(kind: str):  # type: ignore[no-untyped-def]
        def query(handle: FakeDevice):  # type: ignore[no-untyped-def]
            return [types.SimpleNamespace(pid=p, usedGpuMemory=u) for p, u in getattr(handle, kind)]

        return query

    def utilization(handle: FakeDevice):  # type: ignore[no-untyped-def]
        if handle.util is None:
            raise NVMLError("Not Supported")
        return types.SimpleNamespace(gpu=handle.util, memory=0)

    def temperature(handle: FakeDevice, sensor: int):  # type: ignore[no-untyped-def]
        if handle.temperature is None or sensor != nvml.NVML_TEMPERATURE_GPU:
            raise NVMLError("Not Supported")
        return handle.temperature

    nvml.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetTemperature = temperature  # type: ignore[attr-defined]
    nvml.nvmlInit = init  # type: ignore[attr-defined]
    nvml.nvmlShutdown = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetCount = lambda: len(devices)  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetHandleByIndex = lambda i: devices[i]  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetName = lambda h: h.name  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(  # type: ignore[attr-defined]
        total=h.total, free=h.free, used=h.total - h.free
    )
    nvml.nvmlDeviceGetUtilizationRates = utilization  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetComputeRunningProcesses = processes("compute")  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetGraphicsRunningProcesses = processes("graphics")  # type: ignore[attr-defined]
    return nvml


def test_nvml_inventory_reads_every_gpu_and_process() -> None:
    nvml = fake_pynvml(
        [
            FakeDevice("NVIDIA GeForce RTX 4090", 24 * GIB, 20 * GIB, 37, [(101, 3 * GIB)], [], 64),
            FakeDevice(b"NVIDIA A100-SXM4-80GB", 80 * GIB, 80 * GIB, None, [], [(202, None)]),
        ]
    )
    snap = NvmlInventory(nvml).snapshot()
    assert snap.source == "nvml"
    assert snap.gpus == (
        GpuStatus(0, "RTX 4090", 24 * GIB, 20 * GIB, 0.37, 64.0),
        GpuStatus(1, "A100-SXM4-80GB", 80 * GIB, 80 * GIB, None),
    )
    # a process whose usage the driver hides counts as 0 rather than crashing
    assert snap.processes == (ProcessVram(101, 0, 3 * GIB), ProcessVram(202, 1, 0))


def test_a_process_listed_as_compute_and_graphics_is_counted_once() -> None:
    both = FakeDevice("RTX 3090", 24 * GIB, 10 * GIB, 90, [(7, 5 * GIB)], [(7, 5 * GIB)])
    assert NvmlInventory(fake_pynvml([both])).snapshot().processes == (ProcessVram(7, 0, 5 * GIB),)


def test_figures_are_read_fresh_on_every_snapshot() -> None:
    device = FakeDevice("RTX 4090", 24 * GIB, 24 * GIB, 0)
    inventory = NvmlInventory(fake_pynvml([device]))
    device.free, device.util = 4 * GIB, 99
    assert inventory.snapshot().gpus[0].vram_free_bytes == 4 * GIB
    assert inventory.snapshot().gpus[0].utilization == pytest.approx(0.99)


def test_without_nvml_the_node_is_cpu_only_and_says_why() -> None:
    broken = fake_pynvml([], init_error=NVMLError("Driver Not Loaded"))
    inventory = detect_inventory(nvml=broken)
    assert isinstance(inventory, NoGpus)
    snap = inventory.snapshot()
    assert snap.gpus == ()
    assert snap.source == "none"
    assert "Driver Not Loaded" in snap.note


def test_detect_prefers_fake_gpus_then_nvml() -> None:
    nvml = fake_pynvml([FakeDevice("RTX 4090", 24 * GIB, 24 * GIB, 0)])
    assert detect_inventory("1x H100 80GiB", nvml=nvml).snapshot().gpus[0].model == "H100"
    assert detect_inventory(None, nvml=nvml).snapshot().source == "nvml"
    assert nvml.calls == ["init"]  # type: ignore[attr-defined]


def test_detect_on_this_machine_finds_no_gpu_without_raising() -> None:
    assert detect_inventory().snapshot().source in ("none", "nvml")


def test_fake_gpus_parse_several_groups() -> None:
    snap = FakeGpus.parse("2x RTX 4090 24GiB, 1x A100 80GiB, L4 24 GiB").snapshot()
    assert [(g.index, g.model, g.vram_total_bytes) for g in snap.gpus] == [
        (0, "RTX 4090", 24 * GIB),
        (1, "RTX 4090", 24 * GIB),
        (2, "A100", 80 * GIB),
        (3, "L4", 24 * GIB),
    ]
    assert all(g.vram_free_bytes == g.vram_total_bytes for g in snap.gpus)


def test_fake_gpu_figures_change_when_tests_say_so() -> None:
    gpus = FakeGpus.parse("2x RTX 4090 24GiB")
    gpus.use(pid=11, gpu_index=1, used_bytes=6 * GIB)
    gpus.use(pid=12, gpu_index=1, used_bytes=2 * GIB)
    gpus.set_utilization(1, 0.5)
    gpus.set_temperature(1, 71.5)
    snap = gpus.snapshot()
    assert snap.gpus[1].vram_free_bytes == 16 * GIB
    assert snap.gpus[1].utilization == 0.5
    assert (snap.gpus[0].temperature_c, snap.gpus[1].temperature_c) == (None, 71.5)
    assert snap.gpus[0].vram_free_bytes == 24 * GIB
    assert snap.processes == (ProcessVram(11, 1, 6 * GIB), ProcessVram(12, 1, 2 * GIB))
    gpus.release(11)
    assert gpus.snapshot().gpus[1].vram_free_bytes == 22 * GIB


@pytest.mark.parametrize(
    "text",
    ["", "2x RTX 4090", "0x RTX 4090 24GiB", "2x 24GiB", "RTX 4090 24 parsecs"],
    ids=["empty", "no-size", "zero-count", "no-model", "bad-unit"],
)
def test_unreadable_fake_gpus_name_the_option(text: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        FakeGpus.parse(text)
    assert info.value.field == "fake_gpus"


def test_fake_gpu_setters_refuse_unknown_gpus_and_bad_fractions() -> None:
    gpus = FakeGpus.parse("1x RTX 4090 24GiB")
    with pytest.raises(InvalidSpec, match="no fake GPU 3"):
        gpus.use(1, 3, GIB)
    with pytest.raises(InvalidSpec, match=r"within 0\.\.1"):
        gpus.set_utilization(0, 1.5)
    with pytest.raises(InvalidSpec, match="temperature_c"):
        gpus.set_temperature(0, 900)


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        (b"NVIDIA H100 80GB HBM3", "H100 80GB HBM3"),
        ("Tesla T4", "Tesla T4"),
    ],
)
def test_model_names_are_shortened_alike(raw: str | bytes, want: str) -> None:
    assert short_model(raw) == want


def test_fake_gpus_follow_the_agent_s_work_warming_and_cooling() -> None:
    from corral.agent.fingerprint import HOT_C, IDLE_C, WARM_S

    gpus = FakeGpus.parse("2x RTX 4090 24GiB")
    gpus.follow_work({1}, WARM_S)  # one time constant: 63% of the way
    idle, busy = gpus.snapshot().gpus
    assert (idle.utilization, busy.utilization) == (0.0, 1.0)
    assert idle.temperature_c == IDLE_C
    assert busy.temperature_c == pytest.approx(IDLE_C + 0.632 * (HOT_C - IDLE_C), abs=0.1)
    for _ in range(20):
        gpus.follow_work({1}, WARM_S)
    assert gpus.snapshot().gpus[1].temperature_c == pytest.approx(HOT_C, abs=0.1)
    gpus.follow_work(set(), WARM_S)
    cooling = gpus.snapshot().gpus[1]
    assert cooling.utilization == 0.0
    assert IDLE_C < (cooling.temperature_c or 0) < HOT_C
