"""The command protocol: how a subprocess talks to the agent, one line at a time.

A job's process prints these lines on stdout or stderr; every other line is a
log line. Paths are absolute or relative to the directory the process started in
(the executor's ``workdir``).

=====================================  =============================================
``CORRAL_PROGRESS 0.4 [message]``      progress as a fraction 0..1
``CORRAL_PROGRESS 40/100 [message]``   progress as step/total
``CORRAL_CHECKPOINT <path> [step]``    a checkpoint a later attempt can resume from
``CORRAL_PREVIEW <path>``              an image file to show as a preview (PNG/JPEG)
``CORRAL_RESULT <path>``               a file to return as a result
=====================================  =============================================

A malformed protocol line is passed on as a log line with a note, never fatal.
"""

from __future__ import annotations

import mimetypes
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from corral.agent.executors.base import (
    Checkpoint,
    LogLine,
    Preview,
    Progress,
    Result,
    Update,
    sniff_mime,
)

PREFIX = "CORRAL_"
PREVIEW_LIMIT = 8 << 20
"""Largest preview image read (8 MiB): previews are for eyes, not archives."""


@dataclass(frozen=True, slots=True)
class ResultFile:
    """A ``CORRAL_RESULT`` line: read the file when the process ends."""

    path: Path


def parse_line(line: str, stream: str, cwd: Path | None = None) -> Update | ResultFile:
    """One output line as an update (a log line unless it speaks the protocol).

    Relative paths are resolved against ``cwd``, the process's starting directory.
    """
    if not line.startswith(PREFIX):
        return LogLine(line, stream)
    word, _, rest = line.partition(" ")
    rest = rest.strip()
    try:
        if word == "CORRAL_PROGRESS":
            return _progress(rest)
        if word == "CORRAL_CHECKPOINT":
            return _checkpoint(rest, cwd)
        if word == "CORRAL_PREVIEW":
            return _preview(rest, cwd)
        if word == "CORRAL_RESULT" and rest:
            return ResultFile(_resolve(rest, cwd))
    except (ValueError, OSError) as exc:
        return LogLine(f"{line}  [corral: ignored, {exc}]", stream)
    if word in ("CORRAL_PROGRESS", "CORRAL_CHECKPOINT", "CORRAL_PREVIEW", "CORRAL_RESULT"):
        return LogLine(f"{line}  [corral: ignored, missing argument]", stream)
    return LogLine(line, stream)  # CORRAL_SOMETHING_ELSE is just output


def _progress(rest: str) -> Progress:
    value, _, message = rest.partition(" ")
    if "/" in value:
        step_text, _, total_text = value.partition("/")
        step, total = int(step_text), int(total_text)
        if total <= 0 or step < 0:
            raise ValueError(f"step/total must be positive, got {value}")
        return Progress(min(1.0, step / total), step, total, message.strip())
    fraction = float(value)
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"progress must be within 0..1, got {value}")
    return Progress(fraction, message=message.strip())


def _resolve(path: str, cwd: Path | None) -> Path:
    return cwd / path if cwd is not None else Path(path)


def _checkpoint(rest: str, cwd: Path | None) -> Checkpoint:
    path, _, step = rest.rpartition(" ")
    if path and step.isdigit():
        return Checkpoint(str(_resolve(path, cwd)), int(step))
    if not rest:
        raise ValueError("missing path")
    return Checkpoint(str(_resolve(rest, cwd)))


def _preview(rest: str, cwd: Path | None) -> Preview:
    if not rest:
        raise ValueError("missing path")
    path = _resolve(rest, cwd)
    if path.stat().st_size > PREVIEW_LIMIT:
        raise ValueError(f"preview over {PREVIEW_LIMIT} bytes")
    data = path.read_bytes()
    return Preview(data, mimetypes.guess_type(path.name)[0] or sniff_mime(data))


def read_result(path: Path) -> Result | None:
    """A result file's contents, or None when it vanished."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return Result(path.name, data, mimetypes.guess_type(path.name)[0] or sniff_mime(data))


def file_result(path: Path, keep_in: Path, index: int) -> Result | None:
    """A result that names its file instead of holding its bytes: the file is linked (or,
    across file systems, copied) into ``keep_in``, which outlives the job's own folders, and
    read only when sent. None when it vanished."""
    kept = keep_in / f"{index}-{path.name}"
    try:
        keep_in.mkdir(parents=True, exist_ok=True)
        if path.resolve() != kept.resolve():
            try:
                os.link(path, kept)
            except OSError as exc:
                if isinstance(exc, FileNotFoundError):
                    raise
                shutil.copyfile(path, kept)
        with kept.open("rb") as f:
            head = f.read(512)
    except OSError:
        return None
    mime = mimetypes.guess_type(path.name)[0] or sniff_mime(head)
    return Result(path.name, b"", mime, path=kept)
