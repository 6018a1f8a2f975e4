"""Loading scenarios from YAML or JSON (the format is in ``docs/sim.md``).

A scenario file declares ``nodes``, ``teams`` and ``jobs`` inline, and may
point at a CSV/JSONL ``trace`` for its jobs (read as a stream, see
``corral.sim.traces``). Errors name the field and its line (YAML) or its
position (JSON, whose parser does not report lines).
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import yaml

from corral.autoscaler import Config as AutoscaleConfig
from corral.autoscaler import Pool
from corral.autoscaler.config import pools_from_json
from corral.core.errors import InvalidSpec
from corral.core.model import PriorityClass, Team
from corral.scheduler.api import Config
from corral.sim.errors import SimInputError
from corral.sim.fields import (
    JobParser,
    as_bool,
    as_float,
    as_int,
    check_keys,
    omitted,
    parse_nodes,
    parse_team,
)
from corral.sim.scenario import (
    DEFAULT_BOOT_S,
    DEFAULT_TICK_S,
    Autoscaling,
    Scenario,
    SimJob,
    fixed_jobs,
)
from corral.sim.traces import read_trace

SCENARIO_KEYS = (
    "name",
    "description",
    "nodes",
    "teams",
    "jobs",
    "trace",
    "until",
    "seed",
    "cycle_interval_s",
    "fragmentation_sample_s",
    "config",
    "pools",
    "autoscale",
)
AUTOSCALE_KEYS = (*(f.name for f in fields(AutoscaleConfig)), "tick_s", "boot_s")
PRIORITY_CLASS_KEYS = ("name", "rank", "can_preempt", "preemptible", "cpu_offload")
Lines = Callable[[object], str]


def load_scenario(path: Path, *, cluster: Path | None = None) -> Scenario:
    """A scenario from ``path``: YAML/JSON, or a CSV/JSONL trace run on ``cluster``."""
    suffix = path.suffix.lower()
    if suffix in (".csv", ".jsonl"):
        if cluster is None:
            raise SimInputError("cluster", f"{path.name} holds jobs only: give a cluster file")
        base = load_scenario(cluster)
        return _with_trace(base, path, cluster.name)
    if cluster is not None:
        raise SimInputError("cluster", "only a CSV or JSONL trace takes a separate cluster file")
    document, where = _read_document(path)
    return scenario_from_document(document, where, base_dir=path.parent, name=path.stem)


def scenario_from_document(
    document: Any, where: Lines, *, base_dir: Path, name: str = ""
) -> Scenario:
    """Validate a parsed scenario document and build the ``Scenario``."""
    top = check_keys(document, SCENARIO_KEYS, "scenario", "scenario")
    config = parse_config(top.get("config"), where)
    pools = _pools(top.get("pools"), where)
    autoscaling = parse_autoscale(top.get("autoscale"), where, pools)
    nodes = _nodes(top.get("nodes"), where, required=not pools)
    teams = _teams(top.get("teams"), where)
    declared = {t.name for t in teams} if teams else None
    parser = JobParser((c.name for c in config.priority_classes), declared)
    inline = _inline_jobs(top.get("jobs"), parser, where)
    stream = fixed_jobs(inline)
    trace = top.get("trace")
    if not omitted(trace):
        stream = _merged(stream, _trace_stream(base_dir / str(trace), parser))
    return Scenario(
        nodes=nodes,
        jobs=stream,
        teams=teams,
        config=config,
        until=None if omitted(top.get("until")) else _seconds(top, "until", 0.0),
        seed=0 if omitted(s := top.get("seed")) else as_int(s, "seed", "scenario", 0),
        cycle_interval_s=_seconds(top, "cycle_interval_s", 0.0),
        fragmentation_sample_s=_seconds(top, "fragmentation_sample_s", 60.0),
        auto_teams=declared is None,
        name=str(top.get("name") or name),
        pools=pools,
        autoscaling=autoscaling,
    )


def parse_config(value: Any, where: Lines) -> Config:
    """The scheduler's ``Config`` knobs; omitted ones keep ``Config``'s defaults."""
    if omitted(value):
        return Config()
    known = {f.name: f for f in fields(Config)}
    row = check_keys(value, tuple(known), "config", f"config {where(value)}".strip())
    defaults = Config()
    kwargs: dict[str, Any] = {}
    for key, raw in row.items():
        spot = f"config {where(value)}".strip()
        if key == "priority_classes":
            kwargs[key] = _priority_classes(raw, where)
        elif key == "user_weights":
            if not isinstance(raw, Mapping):
                raise SimInputError(key, "expected a mapping of user: weight", spot)
            kwargs[key] = {str(u): as_float(w, f"{key}.{u}", spot) for u, w in raw.items()}
        else:
            kwargs[key] = _like(getattr(defaults, key), raw, key, spot)
    try:
        return Config(**kwargs)
    except (TypeError, ValueError) as err:
        raise SimInputError("config", str(err), "scenario") from None


def parse_autoscale(value: Any, where: Lines, pools: tuple[Pool, ...]) -> Autoscaling:
    """The ``autoscale`` mapping: ``corral.autoscaler.Config``'s fields, ``tick_s`` and
    ``boot_s``; omitted ones keep their defaults. Errors name ``autoscale.<field>``."""
    if omitted(value):
        return Autoscaling()
    spot = f"autoscale {where(value)}".strip()
    if not pools:
        raise SimInputError("autoscale", "needs pools to launch machines from", spot)
    if not isinstance(value, Mapping):
        raise SimInputError("autoscale", f"expected a mapping of fields, got {value!r}", spot)
    for key in value:
        if key not in AUTOSCALE_KEYS:
            known = ", ".join(AUTOSCALE_KEYS)
            raise SimInputError(f"autoscale.{key}", f"unknown field (known: {known})", spot)
    defaults, kwargs = AutoscaleConfig(), {}
    for key, raw in value.items():
        if key in ("tick_s", "boot_s"):
            continue
        kwargs[key] = _like(getattr(defaults, key), raw, f"autoscale.{key}", spot)
    try:
        config = AutoscaleConfig(**kwargs)
    except InvalidSpec as err:
        raise SimInputError(err.field, err.message, spot) from None
    tick = _autoscale_seconds(value, "tick_s", DEFAULT_TICK_S, spot, zero_ok=False)
    boot = _autoscale_seconds(value, "boot_s", DEFAULT_BOOT_S, spot, zero_ok=True)
    if boot >= config.boot_timeout_s:
        raise SimInputError(
            "autoscale.boot_s",
            f"must be less than boot_timeout_s ({config.boot_timeout_s:g}): a machine that "
            "boots slower never joins",
            spot,
        )
    return Autoscaling(config, tick, boot)


def _autoscale_seconds(
    row: Mapping[str, Any], key: str, default: float, spot: str, *, zero_ok: bool
) -> float:
    """``autoscale.<key>`` in seconds: > 0 (>= 0 when ``zero_ok``)."""
    raw = row.get(key)
    if omitted(raw):
        return default
    number = as_float(raw, f"autoscale.{key}", spot)
    if number < 0 or (number == 0 and not zero_ok):
        bound = ">= 0" if zero_ok else "> 0"
        raise SimInputError(f"autoscale.{key}", f"must be {bound}, got {raw!r}", spot)
    return number


def _pools(value: Any, where: Lines) -> tuple[Pool, ...]:
    """The ``pools`` list, read as the server reads its pools file."""
    if omitted(value):
        return ()
    try:
        return pools_from_json(value)
    except InvalidSpec as err:
        raise SimInputError(err.field, err.message, _pool_line(value, err.field, where)) from None


def _pool_line(value: Any, culprit: str, where: Lines) -> str:
    """The line of the pool entry ``culprit`` (``pools[1].vram``, ``pools[g].vram``) names."""
    for i, item in enumerate(value if isinstance(value, list) else []):
        name = item.get("name") if isinstance(item, Mapping) else None
        if culprit.startswith((f"pools[{i}]", f"pools[{name}]")):
            return where(item).strip("()")
    return ""


def _read_document(path: Path) -> tuple[Any, Lines]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise SimInputError("scenario", f"cannot read {path}: {err.strerror}") from None
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text), lambda _: ""
        except json.JSONDecodeError as err:
            where = f"line {err.lineno} column {err.colno}"
            raise SimInputError("scenario", f"not valid JSON: {err.msg}", where) from None
    loader = _LineLoader(text)
    try:
        document = loader.get_single_data()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        raise SimInputError("scenario", f"not valid YAML: {err}", where) from None
    finally:
        loader.dispose()
    lines = loader.lines
    return document, lambda obj: f"(line {lines[id(obj)]})" if id(obj) in lines else ""


class _LineLoader(yaml.SafeLoader):
    """A safe YAML loader that remembers the line of every mapping it builds."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.lines: dict[int, int] = {}

    def construct_yaml_map(self, node: yaml.MappingNode) -> Generator[dict[Any, Any], None, None]:
        data: dict[Any, Any] = {}
        self.lines[id(data)] = node.start_mark.line + 1
        yield data
        data.update(self.construct_mapping(node))


_LineLoader.add_constructor("tag:yaml.org,2002:map", _LineLoader.construct_yaml_map)


def _entries(value: Any, section: str) -> list[Any]:
    if omitted(value):
        return []
    if not isinstance(value, list):
        raise SimInputError(section, "expected a list", "scenario")
    return value


def _nodes(value: Any, where: Lines, *, required: bool) -> tuple[Any, ...]:
    nodes = []
    for i, entry in enumerate(_entries(value, "nodes")):
        nodes.extend(parse_nodes(entry, f"nodes[{i}] {where(entry)}".strip()))
    if not nodes and required:
        raise SimInputError("nodes", "a scenario needs at least one node (or pools)", "scenario")
    seen: set[str] = set()
    for node in nodes:
        if node.name in seen:
            raise SimInputError("nodes", f"node name {node.name!r} is used twice", "scenario")
        seen.add(node.name)
    return tuple(nodes)


def _teams(value: Any, where: Lines) -> tuple[Team, ...]:
    teams = [
        parse_team(e, f"teams[{i}] {where(e)}".strip())
        for i, e in enumerate(_entries(value, "teams"))
    ]
    names = [t.name for t in teams]
    for name in names:
        if names.count(name) > 1:
            raise SimInputError("teams", f"team {name!r} is declared twice", "scenario")
    return tuple(teams)


def _inline_jobs(value: Any, parser: JobParser, where: Lines) -> tuple[SimJob, ...]:
    jobs = []
    seen: set[str] = set()
    for i, entry in enumerate(_entries(value, "jobs")):
        spot = f"jobs[{i}] {where(entry)}".strip()
        if where(entry) == "" and isinstance(entry, Mapping) and "id" in entry:
            spot = f"jobs[{i}] (id {entry['id']!r})"
        job = parser.parse(entry, i + 1, spot)
        if job.job.id in seen:
            raise SimInputError("id", f"job id {job.job.id!r} is used twice", spot)
        seen.add(job.job.id)
        jobs.append(job)
    jobs.sort(key=lambda j: j.submit_at)  # stable: equal times keep file order
    return tuple(jobs)


def _trace_stream(path: Path, parser: JobParser) -> Callable[[], Iterator[SimJob]]:
    if not path.exists():
        raise SimInputError("trace", f"no such file: {path}", "scenario")
    return lambda: read_trace(path, parser)


def _merged(
    first: Callable[[], Iterator[SimJob]], second: Callable[[], Iterator[SimJob]]
) -> Callable[[], Iterator[SimJob]]:
    return lambda: heapq.merge(first(), second(), key=lambda j: j.submit_at)


def _with_trace(base: Scenario, trace: Path, cluster_name: str) -> Scenario:
    declared = {t.name for t in base.teams} if base.teams else None
    parser = JobParser((c.name for c in base.config.priority_classes), declared)
    stream = _merged(base.jobs, _trace_stream(trace, parser))
    return replace(base, jobs=stream, name=f"{trace.stem} on {cluster_name}")


def _priority_classes(value: Any, where: Lines) -> tuple[PriorityClass, ...]:
    if not isinstance(value, list) or not value:
        raise SimInputError("priority_classes", "expected a non-empty list", "config")
    classes = []
    for i, entry in enumerate(value):
        spot = f"config.priority_classes[{i}] {where(entry)}".strip()
        row = check_keys(entry, PRIORITY_CLASS_KEYS, "priority class", spot)
        if omitted(row.get("name")) or omitted(row.get("rank")):
            raise SimInputError("name", "a priority class needs a name and a rank", spot)
        classes.append(
            PriorityClass(
                name=str(row["name"]),
                rank=as_int(row["rank"], "rank", spot, -(10**9)),
                **{k: as_bool(row[k], k, spot) for k in PRIORITY_CLASS_KEYS[2:] if k in row},
            )
        )
    return tuple(classes)


def _like(default: Any, raw: Any, key: str, where: str) -> Any:
    """Coerce ``raw`` to the type of the knob's default value."""
    if omitted(raw):
        if default is None:
            return None
        raise SimInputError(key, "must not be empty (omit the key for its default)", where)
    if isinstance(default, bool):
        return as_bool(raw, key, where)
    if isinstance(default, int) or default is None:
        return as_int(raw, key, where, 0)
    if isinstance(default, float):
        return as_float(raw, key, where)
    return raw


def _seconds(top: Mapping[str, Any], name: str, default: float) -> float:
    """A top-level duration in seconds, >= 0."""
    value = top.get(name)
    if omitted(value):
        return default
    number = as_float(value, name, "scenario")
    if number < 0:
        raise SimInputError(name, f"must be >= 0, got {value!r}", "scenario")
    return number
