"""``corral sim`` end to end: hand-computed reports, the table, exit codes."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from simtest import SCENARIOS, SimRun
from typer.testing import CliRunner

from corral.cli.main import app
from corral.core.model import Job
from corral.core.resources import ResourceRequest
from corral.sim import report, waits
from corral.sim.report import Metrics, jain
from corral.sim.waits import Ranks, Waits, kth, percentile

HAND = SCENARIOS / "first_fit_waits.yaml"


@pytest.mark.parametrize("policy", ["first-fit", "best-fit", "corral"])
def test_one_node_four_jobs_waits_and_ratio_are_what_a_hand_computes(
    run_sim: Callable[..., SimRun], policy: str
) -> None:
    # n has 4 GPUs. big (3) and small (1) start at 0; late (2) finds no room until
    # big ends at 100, so it waits 90 and ends at 130; the CPU job runs 20..30.
    # GPU-seconds: 3*100 + 1*50 + 2*30 = 410 of 4 GPUs x 130 s = 520.
    run = run_sim(HAND, "--policy", policy)
    s = run.summary
    assert s["jobs_total"] == 4
    assert s["jobs_completed"] == 4
    assert s["jobs_never_placed"] == 0
    assert s["end_s"] == 130
    assert s["gpu_allocation_ratio"] == pytest.approx(410 / 520, abs=1e-6)
    assert run.job("late")["wait_s"] == 90
    assert run.job("late")["placements"] == [
        {"node": "n", "gpus": 2.0, "start": 100.0, "end": 130.0, "preempted": False}
    ]
    assert run.job("cpu")["placements"][0]["gpus"] == 0
    assert s["wait_p50_s"] == 0  # nearest rank of [0, 0, 0, 90]
    assert s["wait_p95_s"] == 90
    assert s["wait_by_priority"]["free"] == {"jobs": 4, "p50_s": 0, "p95_s": 90, "mean_s": 22.5}
    assert s["wait_by_gpus"]["2"] == {
        "jobs": 1,
        "p50_s": 90,
        "p95_s": 90,
        "mean_s": 90,
        "queued_at_end": 0,
        "p95_incl_queued_s": 90,
    }
    assert set(s["wait_by_gpus"]) == {"0", "1", "2", "3"}
    assert s["jain_fairness"] == 1.0  # one team


def test_until_cuts_the_run_and_leaves_jobs_running_with_an_open_placement(
    run_sim: Callable[..., SimRun],
) -> None:
    run = run_sim(HAND, "--policy", "first-fit", "--until", "60")
    s = run.summary
    assert s["end_s"] == 60
    assert s["jobs_total"] == 4  # all four arrived by t=20
    assert s["jobs_completed"] == 2  # small (50) and cpu (30)
    assert run.job("big")["state"] == "running"
    assert run.job("big")["placements"][0]["end"] is None
    assert run.job("late")["state"] == "queued"
    assert s["jobs_never_placed"] == 1
    # 0..60: big 3 GPUs x 60, small 1 GPU x 50 -> 230 of 4 x 60
    assert s["gpu_allocation_ratio"] == pytest.approx(230 / 240, abs=1e-6)
    # late (2 GPUs, came at 10) never started: the placed-only p95 leaves it out; the
    # one counting queued jobs has it waiting the 50 s until the end.
    assert s["wait_p95_s"] == 0
    assert s["wait_p95_incl_queued_s"] == 50
    late = s["wait_by_gpus"]["2"]
    assert (late["jobs"], late["p95_s"], late["queued_at_end"], late["p95_incl_queued_s"]) == (
        0,
        None,
        1,
        50,
    )


def test_a_job_without_duration_runs_until_the_end_of_the_simulation(
    run_sim: Callable[..., SimRun], write: Callable[[str, str], Path]
) -> None:
    path = write(
        "forever.yaml",
        """
        nodes: [{name: n, gpus: 2}]
        until: 500
        jobs:
          - {id: forever, submit_at: 100, gpus: 2}
        """,
    )
    run = run_sim(path, "--policy", "first-fit")
    assert run.job("forever")["state"] == "running"
    assert run.summary["gpu_allocation_ratio"] == pytest.approx(400 * 2 / (400 * 2))
    assert run.summary["start_s"] == 100


def test_the_table_shows_the_summary_and_each_job() -> None:
    result = CliRunner().invoke(app, ["sim", str(HAND), "--policy", "first-fit"])
    assert result.exit_code == 0, result.stderr
    for text in ("gpu_allocation_ratio", "0.788", "wait by team", "late", "100–130"):
        assert text in result.stdout


def test_json_without_jobs_has_only_the_summary(run_sim: Callable[..., SimRun]) -> None:
    run = run_sim(HAND, "--policy", "first-fit", "--no-jobs")
    assert "jobs" not in run.report
    assert run.report["policy"] == "first-fit"
    assert run.summary["jobs_total"] == 4


@pytest.mark.parametrize(
    ("args", "want_code", "want_text"),
    [
        pytest.param(["no/such/file.yaml"], 2, "cannot read", id="missing-file"),
        pytest.param([str(HAND), "--policy", "random"], 2, "unknown policy", id="bad-policy"),
        pytest.param([str(SCENARIOS / "idle_quota.jsonl")], 2, "cluster", id="trace-alone"),
    ],
)
def test_bad_invocations_exit_2_with_the_reason_on_stderr(
    args: list[str], want_code: int, want_text: str
) -> None:
    result = CliRunner().invoke(app, ["sim", *args])
    assert result.exit_code == want_code
    assert want_text in result.stderr
    assert result.stdout == ""


def test_nearest_rank_percentiles_and_jain_index() -> None:
    values = [float(v) for v in range(1, 21)]
    assert percentile(values, 95) == 19
    assert percentile(values, 50) == 10
    assert percentile([], 50) is None
    assert jain([1.0, 1.0, 1.0]) == 1.0
    assert jain([1.0, 0.0]) == pytest.approx(0.5)  # one of two takes everything


@given(
    st.lists(st.integers(0, 20).map(float), max_size=30),
    st.lists(st.integers(0, 20).map(float), max_size=30),
)
def test_the_kth_of_two_sorted_lists_is_that_of_their_sorted_union(
    a: list[float], b: list[float]
) -> None:
    """The p95 counting queued jobs ranks across the sorted waits and the queued ones
    (``waits.kth``) instead of sorting their union: the same value for every rank, ties
    and empty lists included."""
    a.sort()
    b.sort()
    union = sorted(a + b)
    for k in range(1, len(union) + 1):
        assert kth(a, b, k) == union[k - 1]
        assert kth(b, a, k) == union[k - 1]


@given(
    st.lists(st.integers(0, 20).map(float) | st.floats(0, 1e6), max_size=60),
    st.lists(st.integers(0, 20).map(float) | st.floats(0, 1e6), max_size=60),
    st.lists(st.integers(0, 20).map(float), max_size=20),
    st.sampled_from([1, 5, 50, 95, 99, 100]),
    st.integers(0, 8),
)
def test_ranks_give_the_percentile_of_a_group_and_of_more_with_it(
    group: list[float], others: list[float], more: list[float], pct: int, cap: int
) -> None:
    """Counted on the shared records (values repeat) or sorted (few of many distinct
    values), a group's ``Ranks`` answer as ``percentile`` does, with and without the jobs
    still queued; past the book's cap each wait has its own record, and nothing is left
    counted on a record afterwards."""
    book = Waits(cap)
    mine = [book.of(v) for v in group]
    everyone = [book.of(v) for v in others] + mine
    for values, records in ((group, mine), (others + group, everyone)):
        ranks = book.ranks(records)
        assert ranks.n == len(values)
        assert ranks.percentile(pct) == percentile(values, pct)
        assert ranks.percentile(pct, more) == percentile(values + more, pct)
        assert ranks.percentile(pct, []) == percentile(values, pct)
        assert all(w.count == 0 for w in book.ranked())
    plain = Ranks(sorted(group))
    assert plain.percentile(pct, more) == percentile(group + more, pct)


def test_a_group_is_counted_when_its_waits_repeat_and_sorted_when_few_of_many() -> None:
    book = Waits()
    repeated = [book.of(float(v % 7)) for v in range(5000)]
    counted = book.ranks(repeated)
    assert counted.upto is not None, "a few distinct values: counted"
    assert counted.values == [float(v) for v in range(7)]
    assert counted.kth(1) == 0.0
    assert counted.kth(5000) == 6.0
    assert counted.percentile(50, [0.5] * 10) == 3.0
    many = [book.of(float(v)) for v in range(5000, 0, -1)]
    few = many[: len(book.ranked()) // waits.SPARSE - 1]
    assert book.ranks(few).upto is None, "few of many distinct values: sorted as they are"
    assert book.ranks(many).upto is not None
    assert book.ranks(many).percentile(50, [0.5] * 10) == 2495.0


def test_whole_waits_are_found_by_index_and_the_rest_by_value() -> None:
    """A whole number of seconds below the cap is looked up in a list by its value (no
    float hashed); fractional waits and whole ones past the cap in the map; every record
    is ranked, in order, whichever way it was found."""
    book = Waits(100)
    sixty = book.of(60.0)
    assert book.of(60.0) is sixty
    assert book.of(60) is sixty
    assert book.whole[60] is sixty
    assert 60.0 not in book.known
    assert book.of(-0.0) is book.of(0.0), "equal values, one record"
    half = book.of(60.5)
    past = book.of(100.0)
    assert book.known == {60.5: half, 100.0: past}
    assert book.of(60.5) is half
    assert book.of(100.0) is past
    assert [w.value for w in book.ranked()] == [0.0, 60.0, 60.5, 100.0]
    ranks = book.ranks([past, sixty, half, sixty])
    assert ranks.percentile(50) == 60.0
    assert ranks.percentile(100) == 100.0
    assert math.isnan(book.of(math.nan).value), "not a number: the map's (its own record)"


def test_equal_waits_share_one_record_up_to_the_cap() -> None:
    """The summary counts each group's waits on their records; a million scattered records
    would cost it most of a second at the goal's size, a few thousand shared ones little."""
    metrics = Metrics()
    assert metrics.distinct.cap == waits.INTERNED
    metrics.distinct.cap = 2
    for i, (submitted, placed) in enumerate([(0, 60), (30, 90), (10, 90), (0, 80), (5, 90)]):
        metrics.first_placed(Job(f"j{i}", submitted_at=float(submitted)), float(placed))
    records = metrics.waits
    assert [w.value for w in records] == [60.0, 60.0, 80.0, 80.0, 85.0]
    assert records[0] is records[1], "equal waits: one record"
    assert records[2] is records[3]
    assert metrics.waits_by["user"]["anonymous"][1] is records[0], "the groups share it too"
    assert len(metrics.distinct.known) == 2, "85 came after the cap: kept, not remembered"
    assert metrics.distinct.loose == [records[4]]
    summary = metrics.summary(90.0, 1, {})
    assert summary["wait_p50_s"] == 80.0
    assert summary["wait_mean_s"] == 73.0
    assert summary["wait_by_user"]["anonymous"]["p95_s"] == 85.0


def test_waits_by_size_group_every_job_by_its_size_however_many_requests() -> None:
    # ``first_placed`` finds the first requests' size groups by the request's identity and
    # the replicas; a gang of the same request is another size, and requests past the first
    # few are grouped by name as before.
    requests = [ResourceRequest(gpus=g % 4 + 1) for g in range(report.RECENT_SIZES + 4)]
    requests.append(ResourceRequest(gpu_milli=500))
    metrics, want = Metrics(), {}
    for i in range(120):
        request, replicas = requests[i * 7 % len(requests)], 1 + (i % 5 == 0)
        job = Job(f"j{i}", resources=request, replicas=replicas, submitted_at=0.0)
        metrics.first_placed(job, float(i))
        want.setdefault(size_name(request, replicas), []).append(float(i))
    by_size = metrics.waits_by["gpus"]
    assert {size: [w.value for w in group] for size, group in by_size.items()} == want
    assert {"1", "4", "0.5", "2x1", "2x4"} <= set(want)


def size_name(request: ResourceRequest, replicas: int) -> str:
    """A size group's name: ``"8"``, ``"2x8"`` (a gang of two), ``"0.5"`` (a shared card)."""
    per = str(request.gpus) if request.gpus else f"{request.gpu_milli / 1000:g}"
    return per if replicas == 1 else f"{replicas}x{per}"
