"""Every YAML scenario under tests/scenarios/ runs step by step and meets its wants."""

from __future__ import annotations

from pathlib import Path

import pytest
from scheduler_scenarios import check, load, run_step, world_of

from corral.core import InvalidSpec

SCENARIOS = sorted((Path(__file__).parent.parent / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path: Path) -> None:
    data = load(path)
    world = world_of(data)
    for i, step in enumerate(data["steps"]):
        where = f"{path.name}: steps[{i}]"
        plan = run_step(world, step, where)
        check(world, plan, step.get("want", {}), where)


def test_there_are_scenarios() -> None:
    assert len(SCENARIOS) >= 5


def test_an_unknown_field_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [{submit: [{id: x, gpu: 1}]}]\n")
    with pytest.raises(InvalidSpec) as info:
        run_step(world_of(load(bad)), load(bad)["steps"][0], "steps[0]")
    assert info.value.field == "steps[0].submit[0].gpu"
