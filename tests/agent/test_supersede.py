"""A newer attempt of a job stops an older one still running on the same node."""

from __future__ import annotations

import pytest
from test_supervisor import Bench

from corral.agent.executors.base import Failed, JobWork
from corral.agent.orders import Done, Order

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def attempt(alloc: str, n: int, job: str = "j1") -> Order:
    work = (JobWork(alloc, n, (job,), payload={"steps": 3, "step_s": 60.0}),)
    return Order(alloc, n, work)


async def test_a_zombie_attempt_is_stopped_when_the_next_one_arrives() -> None:
    b = Bench()
    b.sup.assign(attempt("al_old", 1))
    b.clock.advance(0)
    await b.until(lambda: bool(b.of("al_old")))
    b.sup.assign(attempt("al_new", 2))
    b.sup.assign(attempt("al_other", 1, job="j2"))
    await b.until(lambda: b.ended("al_old"))
    last = b.of("al_old")[-1].update
    assert isinstance(last, Failed)
    assert "superseded by attempt 2" in last.error
    await b.until(lambda: b.ended("al_new") and b.ended("al_other"))
    assert isinstance(b.of("al_new")[-1].update, Done)
    assert isinstance(b.of("al_other")[-1].update, Done), "other jobs are left alone"


async def test_an_acknowledged_attempt_is_forgotten_and_a_later_one_still_supersedes() -> None:
    b = Bench()
    b.sup.assign(attempt("al_1", 1))
    await b.until(lambda: b.ended("al_1"))
    b.sup.acknowledge("al_1")
    assert b.sup.held() == []
    b.sup.assign(attempt("al_2", 2))
    await b.until(lambda: bool(b.of("al_2")))
    b.sup.assign(attempt("al_stale", 1))  # an older attempt never stops a newer one
    b.sup.assign(attempt("al_3", 3))
    await b.until(lambda: b.ended("al_2") and b.ended("al_3"))
    assert "superseded by attempt 3" in str(b.of("al_2")[-1].update)
    assert isinstance(b.of("al_3")[-1].update, Done)
