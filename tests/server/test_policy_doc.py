"""The policy document: what each part sets in the scheduler's Config, and mistakes named by
line and field."""

from __future__ import annotations

import pytest

from corral.core.errors import InvalidSpec
from corral.core.model import DEFAULT_PRIORITY_CLASSES, Team
from corral.scheduler.api import Config
from corral.server.policy_doc import default_policy, parse

HEAD = "format: 1\nclasses:\n  - {name: free, rank: 20}\n"


def test_the_built_in_policy_leaves_the_scheduler_as_it_was() -> None:
    base = Config(preemption=False, max_batch_size=4)
    assert default_policy().config(base) == Config(
        priority_classes=DEFAULT_PRIORITY_CLASSES, preemption=False, max_batch_size=4
    )


def test_every_part_reaches_the_config() -> None:
    policy = parse(
        HEAD
        + "users: {ana: {weight: 3}}\n"
        + "preemption: {enabled: false, min_runtime_s: 120}\n"
        + "scorers: {locality: 0, best_fit: 2.5}\n"
        + "reservations: {min_gpus: 4, per_class: 2}\n"
    )
    config = policy.config(Config())
    assert dict(config.user_weights) == {"ana": 3.0}
    assert config.preemption is False
    assert config.min_runtime_before_preemption_s == 120
    assert dict(config.scorer_weights) == {"locality": 0.0, "best_fit": 2.5}
    assert (config.reserve_min_gpus, config.reservations) == (4, 2)
    off = parse(HEAD + "reservations: {min_gpus: null}\n").config(Config())
    assert off.reserve_min_gpus is None


def test_a_team_cap_bounds_quota_and_borrowing_together() -> None:
    policy = parse(HEAD + "teams: {lab: {max_running_gpus: 3}, ops: {max_queued_jobs: 5}}\n")
    lab, ops = Team("lab", quota_gpus=2), Team("ops", quota_gpus=8)
    capped = policy.capped([lab, ops, Team("big", quota_gpus=10, borrow_limit_gpus=1)])
    assert capped[0] == Team("lab", quota_gpus=2, borrow_limit_gpus=1)
    assert capped[1:] == (ops, Team("big", quota_gpus=10, borrow_limit_gpus=1))
    under = policy.capped([Team("lab", quota_gpus=5, borrow_limit_gpus=4)])
    assert under == (Team("lab", quota_gpus=3, borrow_limit_gpus=0),)


@pytest.mark.parametrize(
    ("text", "want_field", "want_line"),
    [
        pytest.param("format: 2\nclasses: []\n", "format", 1, id="unknown format"),
        pytest.param("format: 1\n", "classes", 1, id="no classes"),
        pytest.param(HEAD + "  - {name: free, rank: 3}\n", "classes[1].name", 4, id="twice"),
        pytest.param(HEAD + "scorers: {speed: 1}\n", "scorers.speed", 4, id="unknown scorer"),
        pytest.param(
            HEAD + "teams: {lab: {max_queued_jobs: -1}}\n",
            "teams.lab.max_queued_jobs",
            4,
            id="negative cap",
        ),
        pytest.param(
            HEAD + "preemption: {min_runtime_s: soon}\n",
            "preemption.min_runtime_s",
            4,
            id="not seconds",
        ),
        pytest.param(
            HEAD + "pools: {home: {price: 1}}\n", "pools.home.gpu_hour", 4, id="missing price"
        ),
        pytest.param(HEAD + "classes: []\n", "classes", 4, id="key twice"),
        pytest.param("format: 1\nclasses: [\n", "policy", 3, id="not yaml"),
    ],
)
def test_a_mistake_names_its_field_and_line(text: str, want_field: str, want_line: int) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse(text)
    assert caught.value.field == want_field
    assert caught.value.message.startswith(f"line {want_line}:")
