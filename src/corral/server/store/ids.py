"""Ids of new rows that sort by when they were made: a job's, an allocation's.

A job's id is the key of the jobs' unique id index and the first column of
the events' index (``ix_events_job_seq``), an allocation's id its table's
primary key. With random ids (``job_`` and 20 random hex digits, as they
were), each job of a group commit went to a random leaf page of each of
those indexes, and every such page was written to the WAL, fsynced, and
later copied back by a checkpoint: about 9.5 pages per job in the concurrent
benchmark shape. An id that starts with the time puts the rows committed
together next to each other, at the right-hand end of every index: 4.6 pages
per job, commits half as long, checkpoints a quarter (docs/performance.md,
item 81). The idea is ULID's and UUIDv7's.

``sortable_id("job_")`` is the prefix, 12 hex digits of the wall clock in
milliseconds (until the year 10889), then 16 random hex digits (64 bits:
ids made in the same millisecond, on one server or several, do not collide).
The clock only orders ids for locality: a clock stepping back makes some ids
sort out of order and costs nothing else. An id is 28 characters past its
prefix; the id columns hold 40.
"""

from __future__ import annotations

import secrets
import time

RANDOM_HEX = 16
"""Random hex digits after the time: 64 bits."""


def sortable_id(prefix: str, now_ns: int | None = None) -> str:
    """``prefix``, the time in milliseconds (12 hex digits), then 16 random hex digits."""
    ms = (time.time_ns() if now_ns is None else now_ns) // 1_000_000
    return f"{prefix}{ms:012x}{secrets.token_hex(RANDOM_HEX // 2)}"
