"""Worker threads for plain handlers: calls run at once, outcomes come back intact."""

from __future__ import annotations

import asyncio
import threading

import pytest

from corral.agent.executors.workers import Workers


def test_calls_run_at_once_and_answers_come_back_in_their_futures() -> None:
    async def scenario() -> None:
        workers = Workers(max_threads=4)
        both = threading.Barrier(2, timeout=10)  # each call waits for the other: they overlap
        answers = await asyncio.gather(
            workers.submit(lambda x: both.wait() * 0 + x, 1),
            workers.submit(lambda x: both.wait() * 0 + x, 2),
        )
        assert answers == [1, 2]
        many = await asyncio.gather(*(workers.submit(pow, i, 2) for i in range(50)))
        assert many == [i * i for i in range(50)]

    asyncio.run(scenario())


def test_a_call_that_raises_raises_in_its_future() -> None:
    def broken() -> None:
        raise ValueError("no")

    def stops() -> None:
        raise StopIteration

    async def scenario() -> None:
        workers = Workers()
        with pytest.raises(ValueError, match="no"):
            await workers.submit(broken)
        with pytest.raises(RuntimeError, match="StopIteration"):
            await workers.submit(stops)

    asyncio.run(scenario())


def test_spare_threads_end_when_idle() -> None:
    async def scenario() -> set[int]:
        workers = Workers(idle_exit_s=0.01)
        return set(await asyncio.gather(*(workers.submit(threading.get_ident) for _ in range(3))))

    ran_on = asyncio.run(scenario())

    def alive() -> set[int]:
        return ran_on & {t.ident for t in threading.enumerate() if t.ident is not None}

    for _ in range(500):
        if not alive():
            break
        threading.Event().wait(0.01)
    assert not alive(), "the worker threads outlived their idle time"
