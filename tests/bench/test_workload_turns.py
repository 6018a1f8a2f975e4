"""bench/workload.py: the systems take turns through each shape, and the parts join up."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from workload import Timing, round_ratios, run_interleaved  # noqa: E402


class FakePeer:
    """Answers at once; notes who ran which shape, in order."""

    def __init__(self, name: str, calls: list[tuple[str, str]], delay: float) -> None:
        self.name = name
        self._calls = calls
        self._delay = delay

    def round_trip(self) -> Timing:
        self._calls.append((self.name, "one"))
        return Timing(self._delay, 2 * self._delay)

    def submit_all_then_wait(self, n: int) -> list[Timing]:
        self._calls.append((self.name, f"batch {n}"))
        return [Timing(self._delay, 2 * self._delay)] * n


def test_each_shape_runs_in_parts_with_the_systems_in_turn() -> None:
    calls: list[tuple[str, str]] = []
    a, b = FakePeer("a", calls, 0.001), FakePeer("b", calls, 0.004)

    out = run_interleaved([a, b], n=10, clients=2, idle_n=3, rounds=2, log=lambda _: None)

    batches = [c for c in calls if c[1].startswith("batch")]
    assert batches == [("a", "batch 5"), ("b", "batch 5"), ("a", "batch 5"), ("b", "batch 5")]
    trips = [name for name, what in calls if what == "one"]
    # idle: parts of 2 and 1 round trips, each after one warm-up; then concurrent parts of 5
    assert trips[:3] == ["a"] * 3
    assert trips[3:6] == ["b"] * 3
    assert trips[6:8] == ["a"] * 2
    assert trips[8:10] == ["b"] * 2
    assert trips[10:15] == ["a"] * 5
    assert trips[15:20] == ["b"] * 5
    for name, delay in (("a", 1.0), ("b", 4.0)):
        idle, concurrent, batch = out[name]
        assert (idle.shape, idle.jobs) == ("idle", 3)
        assert (concurrent.jobs, batch.jobs) == (10, 10)
        assert concurrent.start_p50_ms == delay
        assert concurrent.done_p50_ms == 2 * delay


def test_joined_figures_keep_their_rounds_for_per_round_ratios() -> None:
    calls: list[tuple[str, str]] = []
    a, b = FakePeer("a", calls, 0.001), FakePeer("b", calls, 0.004)

    out = run_interleaved([a, b], n=10, clients=2, idle_n=4, rounds=2, log=lambda _: None)

    idle_a, conc_a, _ = out["a"]
    idle_b, conc_b, _ = out["b"]
    assert [p.jobs for p in conc_a.parts] == [5, 5]
    assert [p.jobs for p in idle_b.parts] == [2, 2]
    assert conc_a.jobs == sum(p.jobs for p in conc_a.parts)
    ratios = round_ratios(conc_a, conc_b)
    assert len(ratios) == 2
    for ratio, pa, pb in zip(ratios, conc_a.parts, conc_b.parts, strict=True):
        assert ratio == pytest.approx(pa.jobs_per_s / pb.jobs_per_s)
    not_in_rounds = dataclasses.replace(idle_b, parts=())
    assert round_ratios(idle_a, not_in_rounds) == []
