"""The demo executor keeps the executor contract and paints real PNGs."""

from __future__ import annotations

import asyncio
import zlib
from pathlib import Path

import pytest

from corral.agent.demo import DemoExecutor, DemoRequest, encode_png
from corral.agent.executors.base import Checkpoint, Finished, JobWork, Preview
from corral.agent.testing import CHECKS, Harness, run_to_end, stop_on_first_progress
from corral.core import InvalidSpec, VirtualClock
from corral.core.states import StopReason


def demo_harness() -> Harness:
    clock = VirtualClock()

    def make(scenario: str, alloc: str) -> JobWork:
        payload = {
            "quick": {"steps": 4, "step_s": 1.0, "preview_every": 2},
            "failing": {"steps": -1},  # refused: a clear error naming the field
            "long": {"steps": 500, "step_s": 60.0},
        }[scenario]
        return JobWork(alloc, 1, (f"job-{alloc}",), payload=payload)

    return Harness(DemoExecutor(clock), clock, make, checkpoints_on_preempt=True)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_demo_executor_passes_the_conformance_suite(check) -> None:  # type: ignore[no-untyped-def]
    asyncio.run(check(demo_harness()))


def test_the_final_image_is_a_png_of_the_asked_size_and_the_seed_is_reported() -> None:
    h = demo_harness()
    job = JobWork("a1", 1, ("j1",), payload={"steps": 3, "size": 16, "preview_every": 1})
    updates = asyncio.run(run_to_end(h, job))
    end = updates[-1]
    assert isinstance(end, Finished)
    [image] = end.results
    assert image.mime == "image/png"
    assert image.data[16:24] == (16).to_bytes(4, "big") * 2  # IHDR width and height
    assert set(end.modified) == {"seed", "model"}  # filled in, so reported
    previews = [u for u in updates if isinstance(u, Preview)]
    assert [p.step for p in previews] == [1, 2]  # the last step's picture is the result
    again = asyncio.run(run_to_end(h, job))[-1]
    assert isinstance(again, Finished)
    assert again.results == end.results  # the same prompt paints the same picture


def test_a_preempted_run_checkpoints_and_the_next_attempt_resumes(tmp_path: Path) -> None:
    h = demo_harness()
    job = JobWork("a1", 1, ("j1",), payload={"steps": 10}, checkpoint_dir=tmp_path)
    first = asyncio.run(run_to_end(h, job, stop_on_first_progress(StopReason.PREEMPT, 5.0)))
    [ckpt] = [u for u in first if isinstance(u, Checkpoint)]
    assert Path(ckpt.path).read_text() == '{"step": 1}'
    resumed = JobWork("a2", 2, ("j1",), payload={"steps": 10}, resume_from=ckpt.path,
                         resume_step=ckpt.step)  # fmt: skip
    steps = [u.step for u in asyncio.run(run_to_end(h, resumed)) if hasattr(u, "fraction")]
    assert steps == list(range(2, 11))


@pytest.mark.parametrize(
    ("payload", "want_field"),
    [
        pytest.param({"steps": 0}, "payload.steps", id="no-steps"),
        pytest.param({"size": 4096}, "payload.size", id="too-big"),
        pytest.param({"prompt": 7}, "payload.prompt", id="prompt-not-text"),
        pytest.param({"seed": True}, "payload.seed", id="seed-not-a-number"),
    ],
)
def test_a_bad_payload_is_refused_naming_the_field(
    payload: dict[str, object], want_field: str
) -> None:
    with pytest.raises(InvalidSpec) as caught:
        DemoRequest.from_payload(payload)
    assert caught.value.field == want_field


def test_encode_png_round_trips_the_pixels() -> None:
    rgb = bytes(range(2 * 2 * 3))
    png = encode_png(2, 2, rgb)
    idat = png[png.index(b"IDAT") + 4 : png.index(b"IEND") - 8]
    rows = zlib.decompress(idat)
    assert rows == b"\x00" + rgb[:6] + b"\x00" + rgb[6:]
