"""CSV and JSONL traces: read as streams, round-tripped, errors naming the line."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from simtest import SCENARIOS, SimRun

from corral.core import DEFAULT_PRIORITY_CLASSES, Job, ResourceRequest
from corral.sim import generate
from corral.sim.baselines import first_fit
from corral.sim.errors import SimInputError
from corral.sim.fields import JobParser
from corral.sim.report import JobRecord
from corral.sim.runner import simulate
from corral.sim.scenario import Scenario, SimJob
from corral.sim.traces import read_trace, write_trace

CLUSTER = """
nodes: [{name: n, count: 4, gpus: 8}]
teams: [{name: team-0}, {name: team-1}, {name: team-2}, {name: team-3}]
"""


def _parser(teams: set[str] | None = None) -> JobParser:
    return JobParser((c.name for c in DEFAULT_PRIORITY_CLASSES), teams)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_written_trace_reads_back_job_for_job(tmp_path: Path, suffix: str) -> None:
    shape = generate.TraceShape(jobs=300, total_gpus=32, seed=7)
    path = tmp_path / f"trace{suffix}"
    assert write_trace(generate.trace(shape), path) == 300
    back = list(read_trace(path, _parser()))
    original = list(generate.trace(shape))
    assert [(j.job, j.duration) for j in back] == [(j.job, j.duration) for j in original]


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_trace_runs_on_a_cluster_file_through_the_cli(
    run_sim: Callable[..., SimRun],
    write: Callable[[str, str], Path],
    tmp_path: Path,
    suffix: str,
) -> None:
    shape = generate.TraceShape(jobs=1000, total_gpus=32, seed=3)
    trace = tmp_path / f"trace{suffix}"
    write_trace(generate.trace(shape), trace)
    cluster = write("cluster.yaml", CLUSTER)
    run = run_sim(trace, "--cluster", str(cluster), "--policy", "first-fit", "--no-jobs")
    assert run.summary["jobs_total"] == 1000
    assert run.summary["jobs_completed"] == 1000
    assert 0 < run.summary["gpu_allocation_ratio"] <= 1


def test_a_scenario_can_point_at_a_trace_next_to_it(run_sim: Callable[..., SimRun]) -> None:
    run = run_sim(SCENARIOS / "greedy_team_reclaimed.yaml", "--policy", "first-fit")
    assert run.summary["jobs_total"] == 50


def test_rows_are_read_one_at_a_time_so_a_bad_row_surfaces_only_when_reached(
    write: Callable[[str, str], Path],
) -> None:
    path = write(
        "t.csv",
        """
        id,submit_at,gpus
        a,0,1
        b,1,1
        c,2,lots
        """,
    )
    jobs = read_trace(path, _parser())
    assert next(jobs).job.id == "a"
    assert next(jobs).job.id == "b"
    with pytest.raises(SimInputError) as info:
        next(jobs)
    assert (info.value.field, info.value.where) == ("gpus", "line 4")


TRACE_ERRORS = [
    ("csv-unsorted", "t.csv", "id,submit_at\na,5\nb,3\n", "submit_at", "line 3"),
    ("csv-unknown-column", "t.csv", "id,gpu\na,1\n", "gpu", "line 1"),
    ("csv-short-row", "t.csv", "id,submit_at,gpus\na,1\n", "row", "line 2"),
    ("csv-undeclared-team", "t.csv", "id,team\na,zzz\n", "team", "line 2"),
    ("jsonl-bad-json", "t.jsonl", '{"id": "a"}\n\n{"id": \n', "line", "line 3"),
    ("jsonl-not-an-object", "t.jsonl", "[1, 2]\n", "job", "line 1"),
    ("jsonl-bad-model-list", "t.jsonl", '{"gpu_models": 3}\n', "gpu_models", "line 1"),
]


@pytest.mark.parametrize(
    ("name", "text", "want_field", "want_where"),
    [pytest.param(n, t, f, w, id=i) for i, n, t, f, w in TRACE_ERRORS],
)
def test_trace_errors_name_the_field_and_the_line(
    write: Callable[[str, str], Path], name: str, text: str, want_field: str, want_where: str
) -> None:
    path = write(name, text)
    with pytest.raises(SimInputError) as info:
        list(read_trace(path, _parser({"team-0"})))
    assert (info.value.field, info.value.where) == (want_field, want_where)


def test_the_runner_pulls_jobs_only_as_simulated_time_reaches_them() -> None:
    # Job k arrives at t=k and runs 0.5 s. When the runner asks for job k, jobs up to
    # k-2 must already be finished: it holds the jobs in flight, not the whole trace.
    finished: list[JobRecord] = []
    finished_when_pulled: list[tuple[int, int]] = []

    def stream() -> Iterator[SimJob]:
        for k in range(1, 2001):
            finished_when_pulled.append((k, len(finished)))
            job = Job(f"j{k}", resources=ResourceRequest(gpus=1), submitted_at=float(k))
            yield SimJob(job, 0.5)

    scenario = Scenario(nodes=generate.cluster(1, 1), jobs=stream)
    summary = simulate(scenario, first_fit, sink=finished.append)
    assert summary["jobs_completed"] == 2000
    assert all(done >= k - 2 for k, done in finished_when_pulled)


def test_the_generated_trace_draws_what_the_stdlib_random_methods_draw() -> None:
    # generate.trace writes out Random.expovariate / lognormvariate / uniform; the same seed
    # must still give the stdlib's values, draw for draw.
    ours, theirs = random.Random(7), random.Random(7)
    for _ in range(2_000):
        assert generate.expovariate(ours.random, 0.3) == theirs.expovariate(0.3)
        assert generate.lognormvariate(ours.random, 6.4, 1.0) == theirs.lognormvariate(6.4, 1.0)
        assert 1.0 + 1.0 * ours.random() == theirs.uniform(1.0, 2.0)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_traces_names_are_one_string_each(tmp_path: Path, suffix: str) -> None:
    # A reader makes a new string per field; the parser interns team, user and class names,
    # so a million jobs of one user hold one string, and the scheduler's maps keyed by a
    # name (quotas, usage, lines) find it by identity, not by comparing characters.
    shape = generate.TraceShape(jobs=400, total_gpus=32, seed=5)
    path = tmp_path / f"trace{suffix}"
    write_trace(generate.trace(shape), path)
    jobs = [s.job for s in read_trace(path, _parser())]
    for field in ("team", "user", "priority"):
        by_name: dict[str, str] = {}
        for job in jobs:
            name = getattr(job, field)
            assert by_name.setdefault(name, name) is name, (field, name)
        assert 1 < len(by_name) < len(jobs)


def test_the_generated_jobs_name_their_team_by_the_teams_own_string() -> None:
    teams = {t.name: t.name for t in generate.teams(4, 32)}
    for sim_job in generate.trace(generate.TraceShape(jobs=200, total_gpus=32, seed=2)):
        assert teams[sim_job.job.team] is sim_job.job.team
