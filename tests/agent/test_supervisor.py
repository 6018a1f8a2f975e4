"""The supervisor runs exactly what it is given, reports every update, holds ends until acked."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from corral.agent.executors.base import Checkpoint, Failed, JobWork, Progress, Started
from corral.agent.executors.command import CommandExecutor
from corral.agent.executors.python import HandlerContext, PythonExecutor
from corral.agent.executors.scripted import ScriptedExecutor
from corral.agent.orders import Done, Order, Report
from corral.agent.supervisor import Supervisor
from corral.core import VirtualClock, WallClock
from corral.core.states import StopReason


def order(alloc: str, *jobs: str, steps: int = 3, backend: str = "", **payload: object) -> Order:
    """An order of ``jobs`` (one each, run in turn) taking ``steps`` minute-long steps."""
    work = tuple(
        JobWork(alloc, 1, (j,), payload={"steps": steps, "step_s": 60.0, **payload}) for j in jobs
    )
    return Order(alloc, 1, work, backend=backend)


class Bench:
    """A supervisor on a virtual clock with the scripted executor; reports are collected."""

    def __init__(self) -> None:
        self.clock = VirtualClock()
        self.sup = Supervisor(
            {"scripted": ScriptedExecutor(self.clock)}, self.clock, default="scripted"
        )
        self.reports: list[Report] = []
        self.sup.sink = self.reports.append

    async def until(self, done: Callable[[], bool], limit: float = 100_000.0) -> None:
        """Let time jump from timer to timer until ``done()`` (nothing really sleeps)."""
        while not done():
            for _ in range(20):
                await asyncio.sleep(0)
            deadline = self.clock.next_deadline()
            if done():
                return
            assert deadline is not None, "stuck: nothing left to wait for"
            assert deadline < limit, "ran past the time limit"
            self.clock.advance(max(0.0, deadline - self.clock.now()))

    def of(self, alloc: str) -> list[Report]:
        return [r for r in self.reports if r.allocation_id == alloc]

    def ended(self, alloc: str) -> bool:
        return any(r.terminal for r in self.of(alloc))


def test_an_order_runs_reports_and_stays_held_until_acknowledged() -> None:
    async def scenario() -> None:
        b = Bench()
        assert b.sup.assign(order("al-1", "job-1"))
        await b.until(lambda: b.ended("al-1"))
        kinds = [type(r.update).__name__ for r in b.of("al-1")]
        assert kinds[0] == "Started"
        assert kinds[-1] == "Done"
        assert "Progress" in kinds
        done = b.of("al-1")[-1].update
        assert isinstance(done, Done)
        assert [jr.job_id for jr in done.results] == ["job-1"]
        assert dict(done.modified) == {"model": "scripted-model"}
        assert [(h.allocation_id, h.observed) for h in b.sup.held()] == [("al-1", "finished")]
        b.sup.acknowledge("al-1")
        assert b.sup.held() == []

    asyncio.run(scenario())


def test_a_batch_runs_its_jobs_in_turn_and_ends_once() -> None:
    async def scenario() -> None:
        b = Bench()
        b.sup.assign(order("al-b", "j1", "j2", "j3", steps=2))
        await b.until(lambda: b.ended("al-b"))
        reports = b.of("al-b")
        assert sum(isinstance(r.update, Started) for r in reports) == 1
        progress_jobs = [r.job_id for r in reports if isinstance(r.update, Progress)]
        assert progress_jobs == ["j1", "j1", "j2", "j2", "j3", "j3"]
        done = reports[-1].update
        assert isinstance(done, Done)
        assert [jr.job_id for jr in done.results] == ["j1", "j2", "j3"]
        assert b.clock.now() == pytest.approx(6 * 60.0)  # one after another, not at once

    asyncio.run(scenario())


def test_a_batch_cut_short_by_a_failure_reports_what_finished_before_it() -> None:
    async def scenario() -> None:
        b = Bench()
        jobs = order("al-b", "j1", "j2", "j3", "j4", steps=2).jobs
        failing = JobWork("al-b", 1, ("j3",), payload={"steps": 2, "fail_at": 1})
        b.sup.assign(Order("al-b", 1, (*jobs[:2], failing, jobs[3])))
        await b.until(lambda: b.ended("al-b"))
        end = b.of("al-b")[-1]
        assert isinstance(end.update, Failed)
        assert end.job_id == "j3", "the job that failed"
        assert end.before is not None
        assert end.before.jobs == ("j1", "j2")
        assert [jr.job_id for jr in end.before.results] == ["j1", "j2"]
        progress = {r.job_id for r in b.of("al-b") if isinstance(r.update, Progress)}
        assert "j4" not in progress, "j4 never ran"

    asyncio.run(scenario())


def test_a_single_job_or_a_failure_before_anything_finished_reports_no_batch() -> None:
    async def scenario() -> None:
        b = Bench()
        b.sup.assign(order("al-1", "j1", steps=2, fail_at=1))
        b.sup.assign(order("al-2", "j1", "j2", steps=2, fail_at=1))
        await b.until(lambda: b.ended("al-1") and b.ended("al-2"))
        one, two = b.of("al-1")[-1], b.of("al-2")[-1]
        assert (one.job_id, one.before) == ("", None)
        assert (two.job_id, two.before) == ("j1", None)  # a batch: names the failing job

    asyncio.run(scenario())


def test_a_stop_between_a_batchs_jobs_reports_what_finished() -> None:
    async def scenario() -> None:
        b = Bench()
        b.sup.assign(order("al-b", "j1", "j2", "j3", steps=2))
        await b.until(lambda: any(r.job_id == "j2" for r in b.of("al-b")))
        assert b.sup.stop("al-b", StopReason.PREEMPT, grace_s=0.0)
        await b.until(lambda: b.ended("al-b"))
        end = b.of("al-b")[-1]
        assert isinstance(end.update, Failed)
        assert end.job_id == "", "a stop is no job's fault"
        assert end.before is not None
        assert end.before.jobs == ("j1",)

    asyncio.run(scenario())


def test_a_job_of_a_batch_cancelled_on_its_own_is_skipped_or_stopped_and_the_rest_runs() -> None:
    async def scenario() -> None:
        b = Bench()
        b.sup.assign(order("al-b", "j1", "j2", "j3", "j4", steps=3))
        await b.until(lambda: any(r.job_id == "j1" for r in b.of("al-b")))
        assert b.sup.stop_job("al-b", "j1", StopReason.CANCEL)  # running: stopped now
        assert b.sup.stop_job("al-b", "j3", StopReason.CANCEL)  # not yet run: skipped
        assert not b.sup.stop_job("al-b", "j3", StopReason.CANCEL), "stopped already"
        assert not b.sup.stop_job("al-b", "j9", StopReason.CANCEL), "not in this batch"
        await b.until(lambda: b.ended("al-b"))
        done = b.of("al-b")[-1].update
        assert isinstance(done, Done)
        assert [jr.job_id for jr in done.results] == ["j2", "j4"]
        assert done.stopped == ("j1", "j3")
        ran = {r.job_id for r in b.of("al-b") if isinstance(r.update, Progress)}
        assert "j3" not in ran
        assert b.clock.now() < 10 * 60.0, "j1 stopped early, j3 never ran"

    asyncio.run(scenario())


def test_an_interrupt_of_one_job_of_a_batch_keeps_what_it_made_and_the_rest_runs() -> None:
    async def scenario() -> None:
        b = Bench()
        b.sup.assign(order("al-b", "j1", "j2", "j3", steps=50))
        await b.until(lambda: any(r.job_id == "j1" for r in b.of("al-b")))
        assert b.sup.stop_job("al-b", "j1", StopReason.INTERRUPT, grace_s=30.0)
        assert b.sup.stop_job("al-b", "j2", StopReason.INTERRUPT, grace_s=30.0)
        await b.until(lambda: b.ended("al-b"))
        done = b.of("al-b")[-1].update
        assert isinstance(done, Done)
        assert not done.interrupted, "the batch itself ran to its end"
        assert [jr.job_id for jr in done.results] == ["j1", "j3"]  # j1's picture so far
        assert done.stopped == ("j2",)  # never ran
        assert b.clock.now() < 100 * 60.0, "j1 stopped early, j2 never ran"

    asyncio.run(scenario())


def test_a_stop_of_the_whole_batch_reaches_the_job_running_now() -> None:
    async def scenario() -> None:
        b = Bench()
        b.sup.assign(order("al-b", "j1", "j2", steps=100))
        await b.until(lambda: any(r.job_id == "j1" for r in b.of("al-b")))
        assert b.sup.stop("al-b", StopReason.CANCEL, grace_s=0.0)
        await b.until(lambda: b.ended("al-b"))
        assert isinstance(b.of("al-b")[-1].update, Failed)
        assert b.clock.now() < 100 * 60.0

    asyncio.run(scenario())


def test_an_allocations_results_folder_lasts_until_its_end_is_acknowledged(
    tmp_path: Path,
) -> None:
    async def writes_weights(ctx: HandlerContext) -> Path:
        path = tmp_path / "work" / "weights.bin"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"w" * 100)
        return path

    async def scenario() -> None:
        sup = Supervisor({"py": PythonExecutor(writes_weights, b.clock)}, b.clock, default="py")
        reports: list[Report] = []
        sup.sink = reports.append
        job = JobWork("al-1", 1, ("j1",), results_root=tmp_path / "results")
        sup.assign(Order("al-1", 1, (job,)))
        await b.until(lambda: any(r.terminal for r in reports))
        done = reports[-1].update
        assert isinstance(done, Done)
        [kept] = done.results
        assert kept.result.path == tmp_path / "results" / "al-1" / "j1" / "0-weights.bin"
        assert kept.result.path.exists(), "kept until the server has the end"
        sup.acknowledge("al-1")
        assert not (tmp_path / "results" / "al-1").exists()

    b = Bench()
    asyncio.run(scenario())


def test_files_a_failed_command_left_go_once_its_end_is_acknowledged(tmp_path: Path) -> None:
    async def scenario() -> None:
        clock = WallClock()
        sup = Supervisor({"cmd": CommandExecutor(clock)}, clock, default="cmd")
        reports: list[Report] = []
        sup.sink = reports.append
        body = 'echo w > "$CORRAL_OUTPUT_DIR/half.bin"; exit 3'
        job = JobWork(
            "al-f", 1, ("j1",), payload={"command": ["sh", "-c", body]},
            results_root=tmp_path / "results",
        )  # fmt: skip
        sup.assign(Order("al-f", 1, (job,)))
        for _ in range(500):
            if any(r.terminal for r in reports):
                break
            await asyncio.sleep(0.01)
        assert isinstance(reports[-1].update, Failed)
        assert (tmp_path / "results" / "al-f" / "j1" / "0-half.bin").exists()
        sup.acknowledge("al-f")
        assert not (tmp_path / "results" / "al-f").exists()

    asyncio.run(scenario())


def test_orders_run_at_once_exactly_as_assigned_and_a_resent_one_is_ignored() -> None:
    async def scenario() -> None:
        b = Bench()
        assert b.sup.assign(order("al-1", "j1", steps=5))
        assert b.sup.assign(order("al-2", "j2", steps=5))
        assert not b.sup.assign(order("al-1", "j1", steps=5))  # the same assignment again
        await b.until(lambda: b.ended("al-1") and b.ended("al-2"))
        assert b.clock.now() == pytest.approx(5 * 60.0)  # side by side
        assert sum(isinstance(r.update, Started) for r in b.reports) == 2

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("reason", "want_done", "want_retryable", "want_checkpoint"),
    [
        pytest.param(StopReason.INTERRUPT, True, None, False, id="interrupt-keeps-partial"),
        pytest.param(StopReason.CANCEL, False, False, False, id="cancel-fails-for-good"),
        pytest.param(StopReason.PREEMPT, False, True, True, id="preempt-checkpoints-and-requeues"),
    ],
)
def test_a_stop_order_ends_the_run_as_its_reason_says(
    reason: StopReason, want_done: bool, want_retryable: bool | None, want_checkpoint: bool
) -> None:
    async def scenario() -> None:
        b = Bench()
        b.sup.assign(order("al-s", "j1", steps=100))
        await b.until(lambda: any(isinstance(r.update, Progress) for r in b.reports))
        assert b.sup.stop("al-s", reason, grace_s=30.0)
        await b.until(lambda: b.ended("al-s"))
        end = b.of("al-s")[-1].update
        assert isinstance(end, Done) is want_done
        if isinstance(end, Done):
            assert end.interrupted
            assert end.results
        else:
            assert isinstance(end, Failed)
            assert end.retryable is want_retryable
        checkpoints = [r for r in b.of("al-s") if isinstance(r.update, Checkpoint)]
        assert bool(checkpoints) is want_checkpoint
        assert not b.sup.stop("al-s", StopReason.CANCEL, 0.0)  # already over

    asyncio.run(scenario())


def test_an_order_for_a_backend_this_node_lacks_fails_retryably_and_says_which() -> None:
    async def scenario() -> None:
        b = Bench()
        b.sup.assign(order("al-x", "j1", backend="comfyui"))
        kinds = [type(r.update) for r in b.of("al-x")]
        assert kinds == [Started, Failed]
        end = b.of("al-x")[-1].update
        assert isinstance(end, Failed)
        assert end.retryable
        assert "no 'comfyui' executor" in end.error

    asyncio.run(scenario())


def test_shutdown_preempts_running_work_so_it_checkpoints() -> None:
    async def scenario() -> None:
        b = Bench()
        b.sup.assign(order("al-1", "j1", steps=100))
        await b.until(lambda: any(isinstance(r.update, Progress) for r in b.reports))
        stopping = asyncio.create_task(b.sup.shutdown(grace_s=30.0))
        await b.until(stopping.done)
        assert any(isinstance(r.update, Checkpoint) for r in b.of("al-1"))
        end = b.of("al-1")[-1].update
        assert isinstance(end, Failed)
        assert end.retryable
        assert b.sup.running() == []

    asyncio.run(scenario())
