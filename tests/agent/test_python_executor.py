from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from corral.agent.executors.base import (
    Checkpoint,
    Failed,
    Finished,
    JobWork,
    LogLine,
    Progress,
    Update,
)
from corral.agent.executors.python import PythonExecutor, load_handler
from corral.agent.testing import CHECKS, Harness, run_to_end, stop_on_first_progress
from corral.core import InvalidSpec, WallClock
from corral.core.states import StopReason

HANDLERS = "agent_handlers"


def python_harness(tmp_path: Path) -> Harness:
    def make(scenario: str, alloc: str) -> JobWork:
        payload = {"scenario": scenario}
        return JobWork(alloc, 1, (f"job-{alloc}",), payload=payload, checkpoint_dir=tmp_path)

    executor = PythonExecutor(f"{HANDLERS}:by_scenario", WallClock())
    return Harness(executor, WallClock(), make, checkpoints_on_preempt=True)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_python_executor_passes_the_conformance_suite(check, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    asyncio.run(check(python_harness(tmp_path)))


def run(handler: str, assignment: JobWork | None = None, **kwargs: object) -> list[Update]:
    harness = Harness(PythonExecutor(f"{HANDLERS}:{handler}", WallClock()), WallClock(), None)  # type: ignore[arg-type]
    job = assignment or JobWork("a1", 1, ("j1",))
    return asyncio.run(run_to_end(harness, job, **kwargs))  # type: ignore[arg-type]


def test_a_filled_in_default_model_travels_with_the_result() -> None:
    updates = run("quick", JobWork("a1", 1, ("j1",), payload={"prompt": "a cat"}))
    assert isinstance(updates[-1], Finished)
    assert dict(updates[-1].modified) == {"model": "tiny-default"}
    assert updates[-1].results[0].mime == "image/png"
    assert LogLine("working on a cat") in updates


def test_async_generators_and_async_functions_are_handlers_too() -> None:
    gen = run("async_generator")
    assert [u.step for u in gen if isinstance(u, Progress)] == [1, 2, 3]
    assert isinstance(gen[-1], Finished)
    assert gen[-1].results[0].data == b"async generated"
    fn = run("async_function")
    assert isinstance(fn[-1], Finished)
    assert [(r.name, r.data) for r in fn[-1].results] == [("a.txt", b"A"), ("b.bin", b"B")]


def test_returned_files_become_results(tmp_path: Path) -> None:
    updates = run("writes_a_file", JobWork("a1", 1, ("j1",), checkpoint_dir=tmp_path))
    assert isinstance(updates[-1], Finished)
    [result] = updates[-1].results
    assert (result.name, result.mime) == ("image.png", "image/png")


def test_returned_files_are_kept_as_files_where_the_agent_keeps_results(tmp_path: Path) -> None:
    keep = tmp_path / "results" / "a1" / "j1"
    job = JobWork("a1", 1, ("j1",), checkpoint_dir=tmp_path / "ck", results_root=keep.parent.parent)
    updates = run("writes_a_file", job)
    assert isinstance(updates[-1], Finished)
    [result] = updates[-1].results
    assert (result.name, result.mime, result.data) == ("image.png", "image/png", b"")
    assert result.path is not None
    assert result.path.parent == keep
    assert result.read() == (tmp_path / "ck" / "image.png").read_bytes()


def test_a_handler_may_ask_for_a_retry() -> None:
    terminal = run("out_of_memory")[-1]
    assert terminal == Failed("CUDA out of memory", retryable=True)


def test_progress_never_goes_backwards_nor_past_one() -> None:
    fractions = [u.fraction for u in run("goes_backwards") if isinstance(u, Progress)]
    assert fractions == [0.6, 0.6, 1.0]


@pytest.mark.parametrize(
    ("handler", "want"),
    [
        ("yields_junk", "yielded dict; yield a float (progress)"),
        ("returns_a_missing_file", "result file /nonexistent/corral/result.png cannot be read"),
        ("failing", "handler failing raised ValueError: the prompt is empty"),
    ],
)
def test_handler_mistakes_fail_with_a_clear_error(handler: str, want: str) -> None:
    terminal = run(handler)[-1]
    assert isinstance(terminal, Failed)
    assert want in terminal.error
    assert not terminal.retryable


def test_a_handler_that_ignores_a_stop_is_abandoned_after_the_grace_keeping_its_results() -> None:
    updates = run("stubborn", on_update=stop_on_first_progress(StopReason.INTERRUPT, 0.1))
    terminal = updates[-1]
    assert isinstance(terminal, Finished)
    assert terminal.interrupted
    assert [r.data for r in terminal.results] == [b"kept"]


def test_preempted_handler_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    first = run(
        "long",
        JobWork("a1", 1, ("j1",), checkpoint_dir=tmp_path),
        on_update=stop_on_first_progress(StopReason.PREEMPT, 5.0),
    )
    checkpoint = next(u for u in first if isinstance(u, Checkpoint))
    again = JobWork("a2", 2, ("j1",), checkpoint_dir=tmp_path, resume_from=checkpoint.path)
    resumed = run("long", again, on_update=stop_on_first_progress(StopReason.INTERRUPT, 5.0))
    assert isinstance(resumed[-1], Finished)
    step = int(resumed[-1].results[0].data.split()[-1])
    assert step > checkpoint.step


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("no_colon", "write it as 'package.module:function'"),
        ("corral_no_such_module:f", "cannot import 'corral_no_such_module'"),
        ("agent_handlers:nope", "has no function 'nope'"),
        ("agent_handlers:STEP_S", "has no function 'STEP_S'"),
    ],
)
def test_bad_handler_specs_name_the_option(spec: str, want: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        load_handler(spec)
    assert info.value.field == "handler"
    assert want in str(info.value)
