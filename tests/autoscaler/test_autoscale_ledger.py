"""The ledger's pure rules: what is in flight, what vanished, who backs off, what was spent."""

from __future__ import annotations

import pytest

from corral.autoscaler import Member, Pool
from corral.autoscaler.ledger import Launched, Outcome, backoff, fleet, rate, spent, vanished

CLOUD = Pool("g4090", cost_per_hour=0.5, provider="cloud")
CLOUD_BIG = Pool("a100", cost_per_hour=20.0, provider="cloud")
LOCAL = Pool("home", cost_per_hour=0.1, provider="local")
POOLS = (CLOUD, CLOUD_BIG, LOCAL)


def entry(name: str, pool: Pool = CLOUD, at: float = 0.0, **fields: object) -> Launched:
    return Launched(name, pool.name, pool.provider, "req", at, pool.cost_per_hour, **fields)  # type: ignore[arg-type]


def test_the_fleet_is_what_is_listed_and_what_is_asked_for_but_not_listed() -> None:
    listed = [Member("a", "g4090", 50.0), Member("mine", "g4090", 10.0)]
    entries = [entry("a", at=40.0), entry("b", at=60.0), entry("c", ended_at=70.0)]
    got = {m.name: m.launched_at for m in fleet(listed, entries)}
    assert got == {"a": 40.0, "mine": 10.0, "b": 60.0}  # c ended: it no longer counts


def test_an_entry_listed_once_and_no_more_vanished_one_never_listed_did_not() -> None:
    entries = [entry("seen", listed=True), entry("lagging"), entry("here", listed=True)]
    assert vanished([Member("here", "g4090", 0.0)], entries) == ["seen"]


@pytest.mark.parametrize(
    ("outcome", "want"),
    [
        pytest.param(Outcome.NOT_JOINED, {"g4090": 400.0}, id="not-joined-backs-off-its-pool"),
        pytest.param(
            Outcome.LAUNCH_FAILED,
            {"g4090": 400.0, "a100": 400.0},
            id="failed-launch-backs-off-its-provider",
        ),
        pytest.param(Outcome.REMOVED, {}, id="an-idle-removal-is-no-failure"),
    ],
)
def test_failures_back_off(outcome: str, want: dict[str, float]) -> None:
    entries = [entry("x", ended_at=100.0, outcome=outcome)]
    assert backoff(entries, POOLS, now=200.0, backoff_s=300.0) == want
    assert backoff(entries, POOLS, now=400.0, backoff_s=300.0) == {}  # over


def test_spend_is_cost_over_the_time_in_the_window() -> None:
    entries = [
        entry("ran-an-hour", at=0.0, ended_at=3600.0),
        entry("half-in-window", at=5400.0),  # still running at 7200: half an hour
        entry("failed", at=0.0, ended_at=10.0, outcome=Outcome.LAUNCH_FAILED),
        entry("home", LOCAL, at=3600.0),
    ]
    got = spent(entries, since=1800.0, now=7200.0)
    assert got == pytest.approx({"g4090": 0.5 * 0.5 + 0.5 * 0.5, "home": 0.1})


def test_rate_is_what_the_members_cost_per_hour_now() -> None:
    members = [Member("a", "g4090", 0), Member("b", "g4090", 0), Member("c", "gone", 0)]
    assert rate(members, {p.name: p for p in POOLS}) == {"g4090": 1.0}
