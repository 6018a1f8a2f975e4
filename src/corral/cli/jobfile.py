"""Reading jobs from a YAML or JSON file (or stdin) for ``corral submit``.

A file holds one job (a mapping), a list of jobs, or ``{"jobs": [...]}``;
YAML may hold several documents (``---``), each one of those. Pure: text in,
job mappings out, or a ``JobFileError`` saying where the problem is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml

from corral.core.errors import InvalidSpec


class JobFileError(InvalidSpec):
    """The file cannot be read as jobs; ``field`` is the file name, or ``file: jobs[i]``."""


def parse_jobs(text: str, source: str) -> list[dict[str, Any]]:
    """Every job in ``text`` (``source`` names the file in errors)."""
    docs = _documents(text, source)
    jobs: list[Any] = []
    for doc in docs:
        if isinstance(doc, Mapping) and set(doc) == {"jobs"}:
            doc = doc["jobs"]
        jobs += doc if isinstance(doc, list) else [doc]
    if not jobs:
        raise JobFileError(source, "no jobs in it")
    for i, job in enumerate(jobs):
        if not isinstance(job, Mapping):
            where = f"{source}: jobs[{i}]" if len(jobs) > 1 else source
            raise JobFileError(where, f"a job must be a mapping of fields, not {_kind(job)}")
    return [dict(j) for j in jobs]


def _documents(text: str, source: str) -> list[Any]:
    stripped = text.lstrip()
    if source.endswith(".json") or stripped.startswith(("{", "[")):
        try:
            return [json.loads(text)]
        except ValueError as exc:
            if source.endswith(".json"):
                raise JobFileError(source, f"not valid JSON: {exc}") from None
    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise JobFileError(source, f"not valid YAML or JSON: {exc}") from None


def _kind(value: Any) -> str:
    return {str: "a string", int: "a number", float: "a number", list: "a list"}.get(
        type(value), type(value).__name__
    )


def with_defaults(jobs: list[dict[str, Any]], **fields: str | None) -> list[dict[str, Any]]:
    """Set ``fields`` given on the command line on every job (flags win over the file; a
    resource such as ``memory`` is a top-level shortcut that wins over ``resources``)."""
    given = {k: v for k, v in fields.items() if v is not None}
    return [{**job, **given} for job in jobs]
