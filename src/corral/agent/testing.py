"""The executor conformance suite: one set of checks every executor passes.

Each executor's tests build a ``Harness`` (the executor, the clock it runs on,
and how to make a quick, a failing and a long assignment for it) and run every
check in ``CHECKS`` against it, so the scripted stub, the Python handler, the
subprocess command and the HTTP backends all keep the same contract (see
``corral.agent.executors.base``). The checks are plain async functions that
raise ``AssertionError``; they need no test framework.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from corral.agent.executors.base import (
    Checkpoint,
    Executor,
    Failed,
    Finished,
    InputPath,
    JobWork,
    Preview,
    Progress,
    Started,
    StopSignal,
    Update,
    is_terminal,
)
from corral.agent.executors.runner import execute
from corral.core import Clock, VirtualClock
from corral.core.model_names import lacked
from corral.core.states import StopReason

Scenario = Literal["quick", "failing", "long", "invalid", "lacking", "input"]
"""quick: succeeds in a moment; failing: fails on its own; long: runs until stopped;
invalid: work the backend takes only in part (made only when ``invalid_reason`` is set);
lacking: work naming a model the backend does not have (only when ``lacking`` is set);
input: quick work that reads the job's input file ``INPUT_NAME`` (made only when
``input_files`` is set)."""
INPUT_NAME = "input.png"

_ids = itertools.count(1)


@dataclass(frozen=True)
class Harness:
    """One executor under test and the assignments that exercise it."""

    executor: Executor
    clock: Clock
    make: Callable[[Scenario, str], JobWork]  # (scenario, allocation id) -> assignment
    failure_retryable: bool = False  # what the "failing" scenario's Failed says
    previews: bool = True  # the quick scenario shows at least one preview
    partial_results: bool = True  # an interrupted long run keeps at least one result
    checkpoints_on_preempt: bool = False  # a preempted long run reports a checkpoint
    grace_s: float = 5.0  # grace given with stops
    timeout_s: float = 0.5  # timeout given to a long run in the timeout check
    # the backend's reason, quoted in the failure of the "invalid" scenario (None: no such
    # scenario): a backend that would do only part of the work (ComfyUI dropping invalid
    # outputs) must fail the run, never finish it with some results missing
    invalid_reason: str | None = None
    # deletes the files the backend saved (None: it keeps none): a backend that answers
    # the same work from a cache must still return results once they are gone
    forget_outputs: Callable[[], None] | None = None
    # the model the "lacking" scenario names, as ``model_names.lacked`` reads it back from
    # the failure (None: the executor runs no models of a backend's own)
    lacking: str | None = None
    # two contents for the "input" scenario's file (None: the executor takes no input
    # files): the backend must read the file the job names, so they give other results
    input_files: tuple[bytes, bytes] | None = None


OnUpdate = Callable[[Update, StopSignal], None]


async def run_to_end(
    harness: Harness,
    assignment: JobWork,
    on_update: OnUpdate | None = None,
    stop: StopSignal | None = None,
) -> list[Update]:
    """Run ``assignment`` through ``execute`` and return every update.

    On a ``VirtualClock`` time jumps to the next timer whenever everything
    waits, so scripted hours pass at once.
    """
    stop = stop or StopSignal()
    updates: list[Update] = []

    async def consume() -> None:
        async for update in execute(harness.executor, assignment, stop, harness.clock):
            updates.append(update)
            if on_update is not None:
                on_update(update, stop)

    task = asyncio.create_task(consume())
    if isinstance(harness.clock, VirtualClock):
        await _autojump(harness.clock, task)
    await task
    return updates


async def _autojump(clock: VirtualClock, task: asyncio.Task[None]) -> None:
    while not task.done():
        for _ in range(20):  # let every runnable callback run before jumping
            await asyncio.sleep(0)
        deadline = clock.next_deadline()
        if deadline is not None and not task.done():
            clock.advance(max(0.0, deadline - clock.now()))
        elif not task.done():
            await asyncio.wait({task}, timeout=0.001)  # waiting on real I/O


def new_id(prefix: str = "alloc") -> str:
    return f"{prefix}-{next(_ids)}"


def stop_on_first_progress(reason: StopReason, grace_s: float) -> OnUpdate:
    def on_update(update: Update, stop: StopSignal) -> None:
        if isinstance(update, Progress):
            stop.request(reason, grace_s)

    return on_update


def assert_well_formed(updates: Sequence[Update]) -> Finished | Failed:
    """Started first, one terminal last, progress within 0..1 and never falling."""
    assert updates, "no updates at all"
    assert isinstance(updates[0], Started), f"first update is {updates[0]!r}, not Started"
    terminals = [u for u in updates if is_terminal(u)]
    assert len(terminals) == 1, f"want exactly one terminal update, got {terminals!r}"
    assert updates[-1] is terminals[0], "the terminal update must be the last"
    fractions = [u.fraction for u in updates if isinstance(u, Progress)]
    assert all(0.0 <= f <= 1.0 for f in fractions), f"progress out of 0..1: {fractions}"
    assert fractions == sorted(fractions), f"progress went backwards: {fractions}"
    last = updates[-1]
    assert isinstance(last, Finished | Failed)
    return last


def assert_stopped(terminal: Finished | Failed, reason: StopReason, *, retryable: bool) -> None:
    """``terminal`` is the failure that obeys a ``reason`` stop."""
    assert isinstance(terminal, Failed), f"a {reason} stop fails, got {terminal!r}"
    assert terminal.stopped is reason, terminal
    assert terminal.retryable is retryable, terminal


# ---- the checks ------------------------------------------------------------


async def check_quick_run_finishes_with_results(h: Harness) -> None:
    updates = await run_to_end(h, h.make("quick", new_id()))
    terminal = assert_well_formed(updates)
    assert isinstance(terminal, Finished), f"quick run did not finish: {terminal!r}"
    assert not terminal.interrupted
    assert terminal.results, "a finished run returns at least one result"
    assert all(r.name and r.data for r in terminal.results), "results need a name and data"
    assert any(isinstance(u, Progress) for u in updates), "no progress reported"
    if h.previews:
        previews = [u for u in updates if isinstance(u, Preview)]
        assert previews, "no preview reported"
        images = all(p.image.startswith((b"\x89PNG", b"\xff\xd8\xff")) for p in previews)
        assert images, "a preview is not a PNG or JPEG image"


async def check_failing_run_says_why(h: Harness) -> None:
    terminal = assert_well_formed(await run_to_end(h, h.make("failing", new_id())))
    assert isinstance(terminal, Failed), f"failing run did not fail: {terminal!r}"
    assert terminal.error.strip(), "a failure needs an error message"
    assert terminal.retryable == h.failure_retryable, terminal
    assert terminal.stopped is None, "a failure of its own is not a stop"


async def check_interrupt_keeps_partial_results(h: Harness) -> None:
    on = stop_on_first_progress(StopReason.INTERRUPT, h.grace_s)
    terminal = assert_well_formed(await run_to_end(h, h.make("long", new_id()), on))
    assert isinstance(terminal, Finished), f"an interrupt finishes: {terminal!r}"
    assert terminal.interrupted, "an interrupted run says so"
    if h.partial_results:
        assert terminal.results, "an interrupt keeps what was produced"


async def check_cancel_fails_for_good(h: Harness) -> None:
    on = stop_on_first_progress(StopReason.CANCEL, h.grace_s)
    terminal = assert_well_formed(await run_to_end(h, h.make("long", new_id()), on))
    assert_stopped(terminal, StopReason.CANCEL, retryable=False)


async def check_preempt_fails_retryably(h: Harness) -> None:
    on = stop_on_first_progress(StopReason.PREEMPT, h.grace_s)
    updates = await run_to_end(h, h.make("long", new_id()), on)
    terminal = assert_well_formed(updates)
    assert_stopped(terminal, StopReason.PREEMPT, retryable=True)
    if h.checkpoints_on_preempt:
        assert any(isinstance(u, Checkpoint) for u in updates), "no checkpoint before preempt"


async def check_timeout_stops_a_long_run(h: Harness) -> None:
    assignment = replace(h.make("long", new_id()), timeout_s=h.timeout_s)
    terminal = assert_well_formed(await run_to_end(h, assignment))
    assert_stopped(terminal, StopReason.TIMEOUT, retryable=False)
    assert isinstance(terminal, Failed)
    assert "timed out" in terminal.error, terminal


async def check_stop_before_start_ends_promptly(h: Harness) -> None:
    stop = StopSignal()
    stop.request(StopReason.CANCEL, 0.0)
    terminal = assert_well_formed(await run_to_end(h, h.make("long", new_id()), stop=stop))
    assert_stopped(terminal, StopReason.CANCEL, retryable=False)


async def check_two_runs_at_once_each_finish(h: Harness) -> None:
    runs = [run_to_end(h, h.make("quick", new_id())) for _ in range(2)]
    for updates in await asyncio.gather(*runs):
        terminal = assert_well_formed(updates)
        assert isinstance(terminal, Finished), terminal
        assert terminal.results, terminal


async def check_work_done_in_part_fails_with_the_backends_reason(h: Harness) -> None:
    if h.invalid_reason is None:
        return
    terminal = assert_well_formed(await run_to_end(h, h.make("invalid", new_id())))
    assert isinstance(terminal, Failed), f"work the backend did in part must fail: {terminal!r}"
    assert not terminal.retryable, "invalid work is invalid on every node"
    assert h.invalid_reason in terminal.error, f"the backend's reason is lost: {terminal.error}"


async def check_the_same_work_twice_gives_results_twice(h: Harness) -> None:
    """Identical work again (a backend may answer from its cache), and again once the
    backend's saved files are gone: results each time, as many as the first time."""
    assignment = h.make("quick", new_id())
    first = assert_well_formed(await run_to_end(h, assignment))
    assert isinstance(first, Finished), first
    again = replace(assignment, allocation_id=new_id())
    for forget in (None, h.forget_outputs):
        if forget is not None:
            forget()
        terminal = assert_well_formed(await run_to_end(h, again))
        assert isinstance(terminal, Finished), f"the same work again: {terminal!r}"
        assert len(terminal.results) == len(first.results), terminal.results
        assert all(r.size for r in terminal.results), "a result came back empty"


async def check_a_model_the_backend_lacks_is_retryable_elsewhere(h: Harness) -> None:
    """Another node may have the model: the failure is retryable and names it, so the server
    sends the work elsewhere instead of failing it."""
    if h.lacking is None:
        return
    terminal = assert_well_formed(await run_to_end(h, h.make("lacking", new_id())))
    assert isinstance(terminal, Failed), f"work naming a missing model ran: {terminal!r}"
    assert terminal.retryable, "another node may have the model"
    assert h.lacking in lacked(terminal.error), f"the model is not named: {terminal.error}"


async def check_the_jobs_input_file_is_what_the_backend_reads(h: Harness) -> None:
    """The same work with other bytes in its input file gives other results (its images,
    when it makes some: other files may name a counter that differs anyway)."""
    if h.input_files is None:
        return
    outputs = []
    with tempfile.TemporaryDirectory(prefix="corral-inputs-") as tmp:
        for n, data in enumerate(h.input_files):
            path = Path(tmp) / str(n) / INPUT_NAME
            path.parent.mkdir()
            path.write_bytes(data)
            sha = hashlib.sha256(data).hexdigest()
            job = replace(h.make("input", new_id()), inputs=(InputPath(INPUT_NAME, sha, path),))
            terminal = assert_well_formed(await run_to_end(h, job))
            assert isinstance(terminal, Finished), f"work with an input file: {terminal!r}"
            images = [r for r in terminal.results if r.mime.startswith("image/")]
            outputs.append(sorted(r.read() for r in images or terminal.results))
    assert outputs[0] != outputs[1], "other bytes in the input file gave the same results"


CHECKS: tuple[Callable[[Harness], Awaitable[None]], ...] = (
    check_quick_run_finishes_with_results,
    check_failing_run_says_why,
    check_interrupt_keeps_partial_results,
    check_cancel_fails_for_good,
    check_preempt_fails_retryably,
    check_timeout_stops_a_long_run,
    check_stop_before_start_ends_promptly,
    check_two_runs_at_once_each_finish,
    check_work_done_in_part_fails_with_the_backends_reason,
    check_the_same_work_twice_gives_results_twice,
    check_a_model_the_backend_lacks_is_retryable_elsewhere,
    check_the_jobs_input_file_is_what_the_backend_reads,
)
