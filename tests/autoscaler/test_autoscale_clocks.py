"""The clocks a shell keeps for the autoscaler's hysteresis."""

from __future__ import annotations

from corral.autoscaler.clocks import Clocks
from corral.core.model import Job


def test_an_idle_clock_starts_when_first_seen_idle_and_restarts_after_work() -> None:
    clocks = Clocks()
    assert clocks.idle(["a", "b"], {"b"}, 10.0) == {"a": 10.0}
    assert clocks.idle(["a", "b"], set(), 20.0) == {"a": 10.0, "b": 20.0}
    assert clocks.idle(["a", "b"], {"a"}, 30.0) == {"b": 20.0}
    assert clocks.idle(["a"], set(), 40.0) == {"a": 40.0}  # b gone: forgotten
    assert clocks.idle_since == {"a": 40.0}


def test_a_job_waits_from_the_first_decision_that_saw_it() -> None:
    clocks = Clocks()
    a, b = Job("a"), Job("b")
    first = clocks.pending([(a, frozenset({"insufficient_gpus"}))], 5.0)
    assert [(p.job.id, p.since, p.reasons) for p in first] == [
        ("a", 5.0, frozenset({"insufficient_gpus"}))
    ]
    later = clocks.pending([(b, frozenset()), (a, frozenset())], 9.0)
    assert [(p.job.id, p.since) for p in later] == [("b", 9.0), ("a", 5.0)]  # queue order kept
    assert [p.since for p in clocks.pending([(b, frozenset())], 12.0)] == [9.0]
    clocks.forget()
    assert [p.since for p in clocks.pending([(b, frozenset())], 15.0)] == [15.0]
