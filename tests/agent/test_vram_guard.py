"""The VRAM guard's decision, its strikes, and the process tree it relies on."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from corral.agent.fingerprint import FakeGpus
from corral.agent.vram_guard import Reservation, VramGuard, find_violations, process_tree
from corral.core import GIB

SHARED_4090 = "1x RTX 4090 24GiB"


def shared_card(**used_by_pid: tuple[int, float]) -> FakeGpus:
    gpus = FakeGpus.parse("2x RTX 4090 24GiB")
    for pid, (gpu, gib) in used_by_pid.items():
        gpus.use(int(pid.removeprefix("p")), gpu, int(gib * GIB))
    return gpus


TWO_NEIGHBOURS = [Reservation("small", (0,), 8 * GIB), Reservation("big", (0,), 12 * GIB)]
OWNERS = {1: "small", 2: "small", 3: "big"}


@pytest.mark.parametrize(
    ("usage", "want"),
    [
        pytest.param({"p1": (0, 6), "p3": (0, 11)}, [], id="both-within-their-reservation"),
        pytest.param(
            {"p1": (0, 5), "p2": (0, 4)}, [("small", 0, 9)], id="two-processes-add-up-over"
        ),
        pytest.param({"p3": (0, 14)}, [("big", 0, 14)], id="one-process-over"),
        pytest.param({"p1": (1, 1)}, [("small", 1, 1)], id="uses-a-gpu-it-was-not-given"),
        pytest.param({"p9": (0, 20)}, [], id="a-process-of-no-allocation-is-not-judged"),
    ],
)
def test_allocations_over_their_reservation_are_found(
    usage: dict[str, tuple[int, float]], want: list[tuple[str, int, float]]
) -> None:
    snap = shared_card(**usage).snapshot()
    found = find_violations(snap, TWO_NEIGHBOURS, OWNERS)
    assert [(v.allocation_id, v.gpu_index, v.used_bytes / GIB) for v in found] == want


def test_slack_forgives_a_little_overshoot() -> None:
    snap = shared_card(p1=(0, 8.2)).snapshot()
    assert find_violations(snap, TWO_NEIGHBOURS, OWNERS, slack_bytes=GIB // 2) == []
    assert len(find_violations(snap, TWO_NEIGHBOURS, OWNERS)) == 1


def test_a_whole_card_allocation_may_use_the_whole_card() -> None:
    snap = shared_card(p1=(0, 23.5)).snapshot()
    assert find_violations(snap, [Reservation("small", (0,), 0)], OWNERS) == []


def test_the_error_says_what_was_used_and_reserved() -> None:
    [violation] = find_violations(shared_card(p3=(0, 14)).snapshot(), TWO_NEIGHBOURS, OWNERS)
    assert violation.error == (
        "allocation big uses 14.0 GiB of VRAM on GPU 0 but reserved 12.0 GiB; "
        "stopped so it does not starve its neighbours (ask for more VRAM)"
    )
    [stray] = find_violations(shared_card(p1=(1, 1)).snapshot(), TWO_NEIGHBOURS, OWNERS)
    assert "which it was not given" in stray.error


def test_the_guard_stops_only_after_consecutive_strikes() -> None:
    guard = VramGuard(strikes=2)
    gpus = shared_card(p3=(0, 14))
    assert guard.observe(gpus.snapshot(), TWO_NEIGHBOURS, OWNERS) == []  # strike 1
    gpus.use(3, 0, 10 * GIB)
    assert guard.observe(gpus.snapshot(), TWO_NEIGHBOURS, OWNERS) == []  # back under: reset
    gpus.use(3, 0, 14 * GIB)
    assert guard.observe(gpus.snapshot(), TWO_NEIGHBOURS, OWNERS) == []  # strike 1 again
    [stop] = guard.observe(gpus.snapshot(), TWO_NEIGHBOURS, OWNERS)
    assert stop.allocation_id == "big"


def test_process_tree_finds_grandchildren() -> None:
    if not os.path.isdir("/proc/self"):
        pytest.skip("needs /proc")
    child = subprocess.Popen(["sh", "-c", "sleep 30; true"], start_new_session=True)
    try:
        for _ in range(500):
            tree = process_tree(child.pid)
            if len(tree) == 2:
                break
            subprocess.run(["true"], check=True)  # give the grandchild time to appear
        assert child.pid in tree
        assert len(tree) == 2
        assert os.getpid() not in tree
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
