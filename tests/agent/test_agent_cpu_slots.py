"""An agent's default CPU slots: its CPU count, and at least one per GPU (it says so)."""

from __future__ import annotations

import logging

import pytest

from corral.agent.main import cpu_slots


def test_a_box_with_more_cores_than_gpus_offers_its_cores(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="corral.agent"):
        assert cpu_slots(gpus=2, cpu_count=16) == 16
    assert not caplog.records


def test_a_small_box_with_many_gpus_offers_a_slot_per_gpu_and_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="corral.agent"):
        assert cpu_slots(gpus=10, cpu_count=2) == 10  # 2 slots would run 2 jobs on 10 GPUs
    (record,) = caplog.records
    assert "2 CPUs for 10 GPUs" in record.getMessage()
    assert "--cpus" in record.getMessage()
