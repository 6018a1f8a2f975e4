"""Reading one record of a scenario: a job, a node, a team.

Every loader (YAML, JSON, CSV, JSONL, generators) goes through these
functions, so the defaults and the error messages are the same whatever the
file format. Values may be typed (YAML/JSON) or text (CSV cells); an empty
cell or a ``null`` means "omitted" and takes the default documented in
``docs/sim.md``. Errors name the field and where it was read.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace
from typing import Any

from corral.core.errors import InvalidSpec
from corral.core.model import DEFAULT_TEAM, Gpu, Job, Node, Team
from corral.core.resources import GIB, MILLI, ResourceRequest, parse_cpus, parse_memory
from corral.sim.errors import SimInputError
from corral.sim.scenario import SimJob

JOB_FIELDS = (
    "id",
    "submit_at",
    "duration",
    "gpus",
    "cpus",
    "memory",
    "vram_gib",
    "gpu_models",
    "team",
    "user",
    "priority",
    "preemptible",
    "replicas",
    "estimate",
)
NODE_FIELDS = ("name", "count", "gpus", "gpu_model", "vram_gib", "cpus", "memory", "labels")
TEAM_FIELDS = ("name", "quota_gpus", "borrow_limit_gpus", "weight")

DEFAULT_JOB_GPUS = 1.0
DEFAULT_JOB_CPUS = 1
DEFAULT_USER = "anonymous"
DEFAULT_PRIORITY = "free"  # the same default as corral.core.Job
DEFAULT_NODE_NAME = "node"
DEFAULT_NODE_GPUS = 1
DEFAULT_GPU_MODEL = "GPU"
DEFAULT_VRAM_GIB = 24.0
CPUS_PER_GPU = 8  # default node CPUs: 8 per GPU, at least MIN_NODE_CPUS
MIN_NODE_CPUS = 8
MEMORY_PER_GPU = 64 * GIB  # default node memory: 64 GiB per GPU, at least MIN_NODE_MEMORY
MIN_NODE_MEMORY = 64 * GIB
_TRUE = frozenset({"true", "yes", "1", "on"})
_FALSE = frozenset({"false", "no", "0", "off"})


def omitted(value: Any) -> bool:
    """None and empty CSV cells mean "use the default"."""
    return value is None or value == ""


def as_float(value: Any, name: str, where: str) -> float:
    """A finite number; text is parsed (CSV)."""
    if isinstance(value, bool):
        raise SimInputError(name, f"expected a number, got {value!r}", where)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SimInputError(name, f"expected a number, got {value!r}", where) from None
    if not math.isfinite(number):
        raise SimInputError(name, f"must be finite, got {value!r}", where)
    return number


def as_int(value: Any, name: str, where: str, minimum: int) -> int:
    """A whole number >= ``minimum``; ``3.0`` is accepted, ``3.5`` is not."""
    number = as_float(value, name, where)
    if number != int(number):
        raise SimInputError(name, f"expected a whole number, got {value!r}", where)
    if number < minimum:
        raise SimInputError(name, f"must be >= {minimum}, got {value!r}", where)
    return int(number)


def as_cpus(value: Any, where: str) -> float:
    """CPUs to a milli-CPU: ``4``, ``11.4``, ``"500m"`` (as the API takes them)."""
    try:
        return parse_cpus(value)
    except InvalidSpec as e:
        raise SimInputError("cpus", e.message, where) from None


def as_memory(value: Any, where: str) -> int:
    """Memory in bytes: ``"16Gi"``, ``"512Mi"``, ``"1G"`` or bytes (as the API takes it)."""
    try:
        return parse_memory(value)
    except InvalidSpec as e:
        raise SimInputError("memory", e.message, where) from None


def as_bool(value: Any, name: str, where: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise SimInputError(name, f"expected true or false, got {value!r}", where)


def as_str(value: Any, name: str, where: str) -> str:
    if isinstance(value, str | int) and not isinstance(value, bool):
        text = str(value).strip()
        if text:
            return text
    raise SimInputError(name, f"expected a non-empty name, got {value!r}", where)


def as_names(value: Any, name: str, where: str) -> frozenset[str]:
    """A list of names, or one string with names separated by ``|`` (CSV cells)."""
    if isinstance(value, str):
        items: Iterable[Any] = value.split("|")
    elif isinstance(value, list | tuple):
        items = value
    else:
        raise SimInputError(name, f"expected a list of names, got {value!r}", where)
    return frozenset(as_str(item, name, where) for item in items)


def as_labels(value: Any, name: str, where: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise SimInputError(name, f"expected a mapping of label: value, got {value!r}", where)
    return {as_str(k, name, where): as_str(v, f"{name}.{k}", where) for k, v in value.items()}


def check_keys(record: Any, allowed: Collection[str], what: str, where: str) -> Mapping[str, Any]:
    """The record as a mapping; a key that is not a known field is an error (typos)."""
    if not isinstance(record, Mapping):
        raise SimInputError(what, f"expected a mapping of fields, got {record!r}", where)
    for key in record:
        if key not in allowed:
            known = ", ".join(allowed)
            raise SimInputError(str(key), f"unknown field of {what} (known: {known})", where)
    return record


class JobParser:
    """Turns job records into ``SimJob`` values, sharing equal resource requests.

    ``priorities`` are the class names the scheduler knows; ``teams`` the
    declared team names, or None when any team name is accepted (it then gets
    a team without quota). Equal requests are interned: a million 1-GPU jobs
    share one ``ResourceRequest``. So are team, user and class names
    (``sys.intern``): a million jobs of one user share one string, and the
    scheduler's maps keyed by name find it by identity instead of comparing
    characters (a trace's reader makes a new string per field read).
    """

    def __init__(self, priorities: Iterable[str], teams: Collection[str] | None) -> None:
        self._priorities = frozenset(priorities)
        self._teams = teams
        self._requests: dict[tuple[Any, ...], ResourceRequest] = {}

    def parse(self, record: Any, number: int, where: str) -> SimJob:
        """Read job ``number`` (1-based position in its file) found at ``where``."""
        row = check_keys(record, JOB_FIELDS, "job", where)
        get = row.get
        value = get("id")
        job_id = f"job-{number}" if omitted(value) else as_str(value, "id", where)
        value = get("submit_at")
        submit_at = 0.0 if omitted(value) else as_float(value, "submit_at", where)
        if submit_at < 0:
            raise SimInputError("submit_at", f"must be >= 0, got {value!r}", where)
        value = get("duration")
        duration = None if omitted(value) else as_float(value, "duration", where)
        if duration is not None and duration <= 0:
            raise SimInputError("duration", "must be > 0 (omit it to run until the end)", where)
        value = get("estimate")
        estimate = None if omitted(value) else as_float(value, "estimate", where)
        if estimate is not None and estimate <= 0:
            raise SimInputError("estimate", "must be > 0 (omit it when unknown)", where)
        team = self._team(get("team"), where)
        try:
            job = Job(
                id=job_id,
                resources=self._request(row, where),
                team=team,
                user=DEFAULT_USER
                if omitted(value := get("user"))
                else sys.intern(as_str(value, "user", where)),
                priority=self._priority(get("priority"), where),
                preemptible=True
                if omitted(v := get("preemptible"))
                else as_bool(v, "preemptible", where),
                replicas=1 if omitted(v := get("replicas")) else as_int(v, "replicas", where, 1),
                submitted_at=submit_at,
                estimated_runtime_s=estimate,
            )
        except InvalidSpec as err:
            raise SimInputError(err.field, err.message, where) from None
        return SimJob(job, duration, where)

    def _request(self, row: Mapping[str, Any], where: str) -> ResourceRequest:
        gpus, cpus, vram, models = (row.get(k) for k in ("gpus", "cpus", "vram_gib", "gpu_models"))
        memory = row.get("memory")
        listed = models if not isinstance(models, list) else tuple(models)
        key = (gpus, cpus, vram, listed, memory)
        cached = self._requests.get(key)
        if cached is not None:
            return cached
        request = _build_request(gpus, cpus, vram, models, where)
        if not omitted(memory):
            request = replace(request, memory_bytes=as_memory(memory, where))
        if len(self._requests) < 10_000:  # traces have few shapes; bound it anyway
            self._requests[key] = request
        return request

    def _team(self, value: Any, where: str) -> str:
        if omitted(value):
            return DEFAULT_TEAM
        team = sys.intern(as_str(value, "team", where))
        if self._teams is not None and team not in self._teams and team != DEFAULT_TEAM:
            known = ", ".join(sorted(self._teams))
            raise SimInputError("team", f"unknown team {team!r} (declared: {known})", where)
        return team

    def _priority(self, value: Any, where: str) -> str:
        if omitted(value):
            return DEFAULT_PRIORITY
        name = sys.intern(as_str(value, "priority", where))
        if name not in self._priorities:
            known = ", ".join(sorted(self._priorities))
            raise SimInputError(
                "priority", f"unknown priority class {name!r} (known: {known})", where
            )
        return name


def _build_request(gpus: Any, cpus: Any, vram: Any, models: Any, where: str) -> ResourceRequest:
    """``gpus`` >= 1 whole cards, 0 < gpus < 1 a share of one card, 0 CPU only."""
    count = DEFAULT_JOB_GPUS if omitted(gpus) else as_float(gpus, "gpus", where)
    if count < 0:
        raise SimInputError("gpus", f"must be >= 0, got {gpus!r}", where)
    if count >= 1 and count != int(count):
        raise SimInputError("gpus", f"{gpus!r}: use a whole number, or a share below 1", where)
    if 0 < count < 1 and round(count * MILLI) < 1:
        raise SimInputError("gpus", f"{gpus!r}: a share must be at least 1/{MILLI} GPU", where)
    vram_gib = 0.0 if omitted(vram) else as_float(vram, "vram_gib", where)
    if vram_gib < 0:
        raise SimInputError("vram_gib", f"must be >= 0, got {vram!r}", where)
    return ResourceRequest(
        gpus=int(count) if count >= 1 else 0,
        gpu_milli=round(count * MILLI) if count < 1 else 0,
        vram_bytes=int(vram_gib * GIB) if count > 0 else 0,
        cpus=DEFAULT_JOB_CPUS if omitted(cpus) else as_cpus(cpus, where),
        gpu_models=frozenset() if omitted(models) else as_names(models, "gpu_models", where),
    )


def parse_nodes(record: Any, where: str) -> list[Node]:
    """One ``nodes`` entry; ``count`` > 1 replicates it as ``name-1``, ``name-2``, ..."""
    row = check_keys(record, NODE_FIELDS, "node", where)
    name = DEFAULT_NODE_NAME if omitted(row.get("name")) else as_str(row["name"], "name", where)
    count = 1 if omitted(row.get("count")) else as_int(row["count"], "count", where, 1)
    gpus = DEFAULT_NODE_GPUS if omitted(row.get("gpus")) else as_int(row["gpus"], "gpus", where, 0)
    model = row.get("gpu_model")
    model = DEFAULT_GPU_MODEL if omitted(model) else as_str(model, "gpu_model", where)
    vram = row.get("vram_gib")
    vram_gib = DEFAULT_VRAM_GIB if omitted(vram) else as_float(vram, "vram_gib", where)
    if vram_gib <= 0:
        raise SimInputError("vram_gib", f"must be > 0, got {vram!r}", where)
    cpus = row.get("cpus")
    default_cpus = max(MIN_NODE_CPUS, CPUS_PER_GPU * gpus)
    cpu_count = default_cpus if omitted(cpus) else as_cpus(cpus, where)
    memory = row.get("memory")
    memory_bytes = default_memory(gpus) if omitted(memory) else as_memory(memory, where)
    labels = {} if omitted(row.get("labels")) else as_labels(row["labels"], "labels", where)
    cards = tuple(Gpu(i, model, int(vram_gib * GIB)) for i in range(gpus))
    names = [name] if count == 1 else [f"{name}-{i}" for i in range(1, count + 1)]
    return [
        Node(n, gpus=cards, cpus=cpu_count, labels=labels, memory_bytes=memory_bytes) for n in names
    ]


def default_memory(gpus: int) -> int:
    """A scenario node's memory when it does not say: 64 GiB per GPU, at least 64 GiB."""
    return max(MIN_NODE_MEMORY, MEMORY_PER_GPU * gpus)


def parse_team(record: Any, where: str) -> Team:
    row = check_keys(record, TEAM_FIELDS, "team", where)
    if omitted(row.get("name")):
        raise SimInputError("name", "a team needs a name", where)
    limit = row.get("borrow_limit_gpus")
    try:
        return Team(
            name=sys.intern(as_str(row["name"], "name", where)),
            quota_gpus=0.0
            if omitted(q := row.get("quota_gpus"))
            else as_float(q, "quota_gpus", where),
            borrow_limit_gpus=None
            if omitted(limit)
            else as_float(limit, "borrow_limit_gpus", where),
            weight=1.0 if omitted(w := row.get("weight")) else as_float(w, "weight", where),
        )
    except InvalidSpec as err:
        raise SimInputError(err.field, err.message, where) from None
