import asyncio
from pathlib import Path

import pytest

from corral.agent.executors.base import (
    Checkpoint,
    Failed,
    Finished,
    JobWork,
    LogLine,
    Preview,
    Progress,
)
from corral.agent.executors.scripted import Script, ScriptedExecutor
from corral.agent.testing import CHECKS, Harness, run_to_end, stop_on_first_progress
from corral.core import InvalidSpec, VirtualClock
from corral.core.states import StopReason


def scripted_harness() -> Harness:
    clock = VirtualClock()

    def make(scenario: str, alloc: str) -> JobWork:
        payload = {
            "quick": {"steps": 3, "step_s": 2.0},
            "failing": {"steps": 3, "fail_at": 2, "error": "out of memory"},
            "long": {"steps": 10_000, "step_s": 60.0},
        }[scenario]
        return JobWork(alloc, 1, (f"job-{alloc}",), payload=payload)

    return Harness(ScriptedExecutor(clock), clock, make, checkpoints_on_preempt=True)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_scripted_executor_passes_the_conformance_suite(check) -> None:  # type: ignore[no-untyped-def]
    asyncio.run(check(scripted_harness()))


def test_an_hour_of_scripted_work_takes_no_wall_time_on_a_virtual_clock() -> None:
    h = scripted_harness()
    job = JobWork("a1", 1, ("j1",), payload={"steps": 60, "step_s": 60.0, "log_every": 30})
    updates = asyncio.run(run_to_end(h, job))
    assert h.clock.now() == pytest.approx(3600.0)
    assert [u.step for u in updates if isinstance(u, Progress)] == list(range(1, 61))
    assert [u.line for u in updates if isinstance(u, LogLine)] == ["step 30/60", "step 60/60"]
    assert sum(isinstance(u, Preview) for u in updates) == 60


def test_filled_in_default_model_is_reported_as_a_modification() -> None:
    h = scripted_harness()
    updates = asyncio.run(run_to_end(h, JobWork("a1", 1, ("j1",), payload={"steps": 1})))
    assert isinstance(updates[-1], Finished)
    assert dict(updates[-1].modified) == {"model": "scripted-model"}
    named = asyncio.run(run_to_end(h, JobWork("a2", 1, ("j2",), model="sdxl")))
    assert isinstance(named[-1], Finished)
    assert dict(named[-1].modified) == {}


def test_preempted_run_resumes_from_its_checkpoint_on_the_next_attempt(tmp_path: Path) -> None:
    h = scripted_harness()
    first = JobWork("a1", 1, ("j1",), payload={"steps": 8}, checkpoint_dir=tmp_path)
    stopped = 0

    def preempt_at_step_5(update: object, stop) -> None:  # type: ignore[no-untyped-def]
        nonlocal stopped
        if isinstance(update, Progress) and update.step == 5:
            stop.request(StopReason.PREEMPT, 30.0)
            stopped += 1

    updates = asyncio.run(run_to_end(h, first, preempt_at_step_5))
    checkpoint = next(u for u in updates if isinstance(u, Checkpoint))
    assert checkpoint.step == 5
    assert checkpoint.path.startswith(str(tmp_path))
    second = JobWork(
        "a2", 2, ("j1",), payload={"steps": 8}, resume_from=checkpoint.path, resume_step=5
    )
    resumed = asyncio.run(run_to_end(h, second))
    assert [u.step for u in resumed if isinstance(u, Progress)] == [6, 7, 8]
    assert isinstance(resumed[-1], Finished)
    assert resumed[-1].results[0].data == b"j1: scripted-model steps 5..8"


def test_checkpoints_every_n_steps_carry_progress() -> None:
    h = scripted_harness()
    job = JobWork("a1", 1, ("j1",), payload={"steps": 6, "checkpoint_every": 3})
    checkpoints = [u for u in asyncio.run(run_to_end(h, job)) if isinstance(u, Checkpoint)]
    assert [(c.step, c.progress) for c in checkpoints] == [(3, 0.5), (6, 1.0)]


def test_retryable_failures_say_so() -> None:
    h = scripted_harness()
    job = JobWork("a1", 1, ("j1",), payload={"fail_at": 1, "retryable": True})
    terminal = asyncio.run(run_to_end(h, job))[-1]
    assert isinstance(terminal, Failed)
    assert terminal.retryable
    assert terminal.error == "scripted failure at step 1"


def test_a_stop_with_a_grace_is_obeyed_at_once_by_the_stub() -> None:
    h = scripted_harness()
    job = JobWork("a1", 1, ("j1",), payload={"steps": 100, "step_s": 10.0})
    updates = asyncio.run(run_to_end(h, job, stop_on_first_progress(StopReason.INTERRUPT, 600)))
    assert h.clock.now() == pytest.approx(10.0)  # stopped right after step 1, not after grace
    assert isinstance(updates[-1], Finished)
    assert updates[-1].results[0].data == b"j1: partial 1/100"


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"steps": 0}, "payload.steps"),
        ({"steps": "many"}, "payload.steps"),
        ({"step_s": -1}, "payload.step_s"),
        ({"retryable": "yes"}, "payload.retryable"),
        ({"preview_every": True}, "payload.preview_every"),
    ],
)
def test_bad_script_payloads_name_the_field(payload: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        Script().overridden_by(payload)
    assert info.value.field == field
