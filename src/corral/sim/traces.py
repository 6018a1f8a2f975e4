"""Job traces as CSV or JSONL, read and written as streams.

A trace holds jobs only (the cluster comes from a scenario file). Rows are
read one at a time and handed to the simulator as they are needed, so a
1,000,000-job trace costs the memory of the jobs in flight, not of the file.
A trace must be sorted by ``submit_at``; a row earlier than the one before it
is an error naming its line, because replaying it out of order would be
silently wrong.

CSV: a header row naming job fields (any subset, any order; see
``docs/sim.md``), one job per row, an empty cell for "omitted", ``gpu_models``
separated by ``|``. JSONL: one JSON object per line, blank lines ignored.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from corral.core.resources import GIB, MILLI
from corral.sim.errors import SimInputError
from corral.sim.fields import JOB_FIELDS, JobParser, check_keys
from corral.sim.scenario import SimJob


def read_trace(path: Path, parser: JobParser) -> Iterator[SimJob]:
    """Stream the jobs of a ``.csv`` or ``.jsonl`` trace, in file order."""
    rows = _csv_rows if path.suffix.lower() == ".csv" else _jsonl_rows
    with path.open(encoding="utf-8", newline="") as handle:
        yield from _in_order(parser.parse(row, n, where) for n, where, row in rows(handle))


def _in_order(jobs: Iterable[SimJob]) -> Iterator[SimJob]:
    last = 0.0
    for job in jobs:
        if job.submit_at < last:
            raise SimInputError(
                "submit_at",
                f"{job.submit_at:g} is earlier than the job before it ({last:g}); "
                "a trace must be sorted by submit_at",
                job.where,
            )
        last = job.submit_at
        yield job


def _csv_rows(handle: TextIO) -> Iterator[tuple[int, str, dict[str, str]]]:
    reader = csv.reader(handle)
    header = next(reader, None)
    if header is None:
        return
    names = [h.strip() for h in header]
    check_keys(dict.fromkeys(names, ""), JOB_FIELDS, "job (CSV header)", "line 1")
    width = len(names)
    for number, row in enumerate(reader, start=1):
        if not row:
            continue
        where = f"line {reader.line_num}"
        if len(row) != width:
            raise SimInputError("row", f"{len(row)} cells but the header names {width}", where)
        yield number, where, dict(zip(names, row, strict=True))


def _jsonl_rows(handle: TextIO) -> Iterator[tuple[int, str, Any]]:
    number = 0
    for line_no, line in enumerate(handle, start=1):
        if not line.strip():
            continue
        number += 1
        where = f"line {line_no}"
        try:
            yield number, where, json.loads(line)
        except json.JSONDecodeError as err:
            raise SimInputError("line", f"not valid JSON: {err.msg}", where) from None


def job_record(sim_job: SimJob) -> dict[str, Any]:
    """The trace fields of a job, the inverse of ``JobParser.parse`` (defaults left out)."""
    job, res = sim_job.job, sim_job.job.resources
    gpus: float = res.gpus if res.gpus else res.gpu_milli / MILLI
    record: dict[str, Any] = {"id": job.id, "submit_at": job.submitted_at, "gpus": gpus}
    if sim_job.duration is not None:
        record["duration"] = sim_job.duration
    record["cpus"] = res.cpus
    if res.memory_bytes:
        record["memory"] = res.memory_bytes
    if res.vram_bytes:
        record["vram_gib"] = res.vram_bytes / GIB
    if res.gpu_models:
        record["gpu_models"] = sorted(res.gpu_models)
    record.update(team=job.team, user=job.user, priority=job.priority)
    record.update(preemptible=job.preemptible, replicas=job.replicas)
    if job.estimated_runtime_s is not None:
        record["estimate"] = job.estimated_runtime_s
    return record


def write_trace(jobs: Iterable[SimJob], path: Path) -> int:
    """Write ``jobs`` as a CSV or JSONL trace (by suffix), streaming; returns the count."""
    count = 0
    with path.open("w", encoding="utf-8", newline="") as handle:
        if path.suffix.lower() == ".csv":
            writer = csv.DictWriter(handle, fieldnames=JOB_FIELDS, extrasaction="raise")
            writer.writeheader()
            for sim_job in jobs:
                record = job_record(sim_job)
                if "gpu_models" in record:
                    record["gpu_models"] = "|".join(record["gpu_models"])
                writer.writerow(record)
                count += 1
        else:
            for sim_job in jobs:
                handle.write(json.dumps(job_record(sim_job), separators=(",", ":")) + "\n")
                count += 1
    return count
