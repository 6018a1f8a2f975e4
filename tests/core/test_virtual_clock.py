"""The virtual clock fires timers in the order of (instant, order set), clamped to now."""

from __future__ import annotations

import asyncio
import heapq

from hypothesis import given
from hypothesis import strategies as st

from corral.core.clock import VirtualClock

STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.integers(0, 20)),  # a timer this many seconds from 10
        st.tuples(st.just("advance"), st.integers(0, 5)),  # time moves on, due timers fire
    ),
    max_size=60,
)


@given(STEPS)
def test_timers_fire_as_a_heap_of_when_and_seq_would(steps: list[tuple[str, int]]) -> None:
    """``VirtualClock`` gives what one heap of ``(max(when, now), seq, ...)`` tuples gives:
    instants in order, a shared instant's timers in the order they were set."""
    clock = VirtualClock()
    reference: list[tuple[float, int, str, int]] = []
    for seq, (step, value) in enumerate(steps):
        if step == "set":
            when = 10.0 + value - 5
            clock.set_timer(when, f"j{seq}", seq)
            heapq.heappush(reference, (max(when, clock.now()), seq, f"j{seq}", seq))
        else:
            clock.advance_to(clock.now() + value)
            want = []
            while reference and reference[0][0] <= clock.now():
                _, _, job_id, token = heapq.heappop(reference)
                want.append((job_id, token))
            assert [(timer.key, timer.token) for timer in clock.pop_due()] == want
        assert clock.next_time() == (reference[0][0] if reference else None)


def test_advance_wakes_the_due_sleepers_and_skips_a_cancelled_one() -> None:
    async def scenario() -> tuple[list[str], bool, float | None]:
        clock = VirtualClock(100.0)
        woke: list[str] = []

        async def sleeper(name: str, seconds: float) -> None:
            await clock.sleep(seconds)
            woke.append(name)

        tasks = {n: asyncio.create_task(sleeper(n, s)) for n, s in [("a", 5), ("b", 3), ("c", 9)]}
        await asyncio.sleep(0)
        tasks["b"].cancel()
        await asyncio.sleep(0)
        clock.advance(6)  # a (due at 105) wakes; b was cancelled; c waits for 109
        await asyncio.sleep(0)
        waiting = not tasks["c"].done()
        clock.advance(3)
        await asyncio.gather(tasks["a"], tasks["c"])
        return woke, waiting, clock.next_time()

    assert asyncio.run(scenario()) == (["a", "c"], True, None)
