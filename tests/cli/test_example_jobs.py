"""The example job files are jobs the server accepts."""

from __future__ import annotations

from pathlib import Path

from corral.cli.jobfile import parse_jobs
from corral.server.api.schemas import JobIn

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_ddp_gang_file_is_a_gang_of_two_training_jobs() -> None:
    path = EXAMPLES / "ddp" / "gang.yaml"
    (job,) = [JobIn.model_validate(j) for j in parse_jobs(path.read_text(), str(path))]
    assert (job.kind, job.replicas, job.max_attempts) == ("train", 2, 5)
    assert job.payload["args"][:2] == ["--steps", "200"]
