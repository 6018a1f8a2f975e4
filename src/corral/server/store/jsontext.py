"""JSON text for stored columns, event rows and SSE frames, written by orjson.

A job's life writes JSON about twenty times on the server (its JSON columns
on every insert and guarded update, each event's data, each SSE frame):
``json.dumps`` took 5 us each, orjson 0.4 us. It writes compact text
(``{"a":1}``), which every reader (``json``, SQLAlchemy's JSON type,
PostgreSQL) reads alike, so rows written before and after read the same.

What orjson refuses, ``json`` still writes, so nothing accepted before is
refused now: integers past 64 bits and types orjson does not know. Keys
that are not strings become strings, as ``json`` makes them. NaN and the
infinities become ``null`` (valid JSON; ``json`` wrote ``NaN``, which only
Python reads; the API refuses them in payloads, see schemas.py).

Reading stays with ``json.loads``: orjson reads integers past 64 bits as
floats, and telling such text apart costs more than orjson saves.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

_OPTIONS = orjson.OPT_NON_STR_KEYS


def dumps(value: Any) -> str:
    """``value`` as JSON text."""
    try:
        return orjson.dumps(value, option=_OPTIONS).decode()
    except TypeError:  # a 65-bit integer, a type orjson does not know: json decides
        return json.dumps(value)
