"""Small pure helpers for results: which file, where to save it, did the job succeed."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from corral.core.states import JobState
from corral.sdk.errors import ClientError, JobFailed
from corral.sdk.models import ResultFile, ResultStatus


def check_result(status: ResultStatus) -> None:
    """Raise ``JobFailed`` unless the job succeeded."""
    if status.state is not JobState.SUCCEEDED:
        raise JobFailed(status.id, status.state.value, status.error)


def pick_file(files: list[ResultFile], name: str | None, job_id: str) -> ResultFile:
    """File ``name``, or the first when no name is given."""
    if not files:
        raise ClientError(f"job {job_id} has no result files")
    if name is None:
        return files[0]
    for f in files:
        if f.name == name:
            return f
    known = ", ".join(f.name for f in files)
    raise ClientError(f"job {job_id} has no result file {name!r} (it has: {known})")


def save_path(directory: Path, name: str) -> Path:
    """Where to write result file ``name`` under ``directory``; never outside it."""
    parts = [
        p for p in PurePosixPath(name.replace("\\", "/")).parts if p not in ("", ".", "..", "/")
    ]
    if not parts:
        raise ClientError(f"cannot save a result file named {name!r}")
    path = directory.joinpath(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
