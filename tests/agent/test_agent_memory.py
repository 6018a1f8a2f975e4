"""The host memory an agent offers: RAM (or its container's limit) less a reserve, or an
amount it is told; what it tells a command job."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from corral.agent.memory import allocatable, cgroup_limit, default_reserve, host_memory, offered
from corral.core import GIB, InvalidSpec


def test_the_default_reserve_is_a_twentieth_of_ram_and_at_least_a_gib() -> None:
    assert default_reserve(8 * GIB) == GIB
    assert default_reserve(512 * GIB) == 512 * GIB // 20


def test_allocatable_is_ram_less_the_reserve() -> None:
    assert allocatable(64 * GIB) == 64 * GIB - default_reserve(64 * GIB)
    assert allocatable(64 * GIB, 4 * GIB) == 60 * GIB


def test_a_reserve_of_all_the_ram_offers_nothing_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="corral.agent"):
        assert allocatable(GIB // 2) == 0
    (record,) = caplog.records
    assert "--memory-reserve" in record.getMessage()


def test_a_container_limit_is_read_from_its_cgroup(tmp_path: Path) -> None:
    v2, v1 = tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    assert cgroup_limit((v2, v1)) is None  # no cgroup files: no limit
    v2.write_text("max\n")
    assert cgroup_limit((v2, v1)) is None  # unlimited
    v1.write_text(f"{4 * GIB}\n")
    assert cgroup_limit((v2, v1)) == 4 * GIB


def test_the_machine_offers_its_own_memory_by_default() -> None:
    total = host_memory()
    assert total > 0
    assert offered(None, None) == allocatable(total)


def test_a_stated_amount_wins_and_both_options_together_are_refused() -> None:
    assert offered(16 * GIB, None) == 16 * GIB
    with pytest.raises(InvalidSpec) as info:
        offered(16 * GIB, GIB)
    assert info.value.field == "--memory-reserve"
