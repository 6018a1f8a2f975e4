"""The administrator's policy document: YAML in, a checked ``Policy`` out (docs/server.md).

One document holds what an administrator decides about scheduling: the
priority classes and who may use each, per-user weights, caps per user and
team, preemption, scorer weights, reservations and node-pool prices. It is
parsed from YAML's node tree rather than from plain values so that every
error names the line and the field (``classes[1].rank``). Parsing is pure:
the service (``services/policy.py``) stores versions and hands the current
one to the scheduling loop and the job service.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import yaml

from corral.core.errors import InvalidSpec
from corral.core.model import EMPTY, PriorityClass, Team, frozen_map
from corral.scheduler.api import Config
from corral.scheduler.scorers import DEFAULT_SCORERS

FORMAT = 1
"""The document format this server reads (the document's ``format``)."""

MAX_BYTES = 256 * 1024
"""A policy document's size at most: thousands of users' entries, far from a memory risk."""

MAX_ENTRIES = 10_000
"""Classes, users, teams or pools one document may name, each: bounded work per cycle."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ClassRule:
    """A priority class and who may submit to it (``None``: everyone)."""

    pclass: PriorityClass
    default_time_limit_s: float | None = None
    teams: frozenset[str] | None = None
    users: frozenset[str] | None = None

    def allows(self, team: str, user: str) -> bool:
        """Open to everyone, or the team is listed, or the user is."""
        if self.teams is None and self.users is None:
            return True
        return team in (self.teams or ()) or user in (self.users or ())


@dataclass(frozen=True, slots=True)
class Caps:
    """Caps on what one user or team holds (``None``: no cap)."""

    max_running_gpus: float | None = None
    max_queued_jobs: int | None = None


@dataclass(frozen=True, slots=True)
class Policy:
    """A parsed policy document. ``None`` fields keep the server's own settings."""

    classes: tuple[ClassRule, ...]
    user_weights: Mapping[str, float] = field(default_factory=lambda: EMPTY)
    users: Mapping[str, Caps] = field(default_factory=lambda: EMPTY)
    teams: Mapping[str, Caps] = field(default_factory=lambda: EMPTY)
    preemption: bool | None = None
    min_runtime_s: float | None = None
    scorer_weights: Mapping[str, float] = field(default_factory=lambda: EMPTY)
    reserve_min_gpus: int | None = None
    reserve_off: bool = False  # ``reservations.min_gpus: null``: no backfill reservations
    reservations: int | None = None
    gpu_hour_prices: Mapping[str, float] = field(default_factory=lambda: EMPTY)  # by pool

    @property
    def priority_classes(self) -> tuple[PriorityClass, ...]:
        return tuple(r.pclass for r in self.classes)

    def rule(self, name: str) -> ClassRule | None:
        return next((r for r in self.classes if r.pclass.name == name), None)

    def capped(self, teams: Iterable[Team]) -> tuple[Team, ...]:
        """``teams`` with each team's ``max_running_gpus``: its quota and borrowing
        together never pass it (a cap under the quota lowers the guarantee too)."""
        out = []
        for team in teams:
            caps = self.teams.get(team.name)
            cap = caps.max_running_gpus if caps is not None else None
            if cap is not None:
                quota = min(team.quota_gpus, cap)
                room = cap - quota
                borrow = (
                    room if team.borrow_limit_gpus is None else min(team.borrow_limit_gpus, room)
                )
                team = replace(team, quota_gpus=quota, borrow_limit_gpus=borrow)
            out.append(team)
        return tuple(out)

    def config(self, base: Config) -> Config:
        """``base`` (the server's settings) with what this policy sets."""
        changes: dict[str, Any] = {
            "priority_classes": self.priority_classes,
            "user_weights": self.user_weights,
        }
        if self.preemption is not None:
            changes["preemption"] = self.preemption
        if self.min_runtime_s is not None:
            changes["min_runtime_before_preemption_s"] = self.min_runtime_s
        if self.scorer_weights:
            changes["scorer_weights"] = self.scorer_weights
        if self.reserve_off:
            changes["reserve_min_gpus"] = None
        elif self.reserve_min_gpus is not None:
            changes["reserve_min_gpus"] = self.reserve_min_gpus
        if self.reservations is not None:
            changes["reservations"] = self.reservations
        return replace(base, **changes)


DEFAULT_DOCUMENT = """\
# corral's built-in policy: what a server does before any policy is applied.
format: 1
classes:
  - {name: interactive, rank: 40, preemptible: false, may_preempt: true}
  - {name: paid, rank: 30, may_preempt: true}
  - {name: free, rank: 20}
  - {name: batch, rank: 10, cpu_offload: true}
"""


def parse(text: str) -> Policy:
    """The policy ``text`` holds, or ``InvalidSpec`` naming the field and its line."""
    if len(text.encode()) > MAX_BYTES:
        raise InvalidSpec("policy", f"larger than {MAX_BYTES // 1024} KiB")
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise InvalidSpec("policy", f"{where}not YAML: {getattr(e, 'problem', e)}") from None
    if root is None:
        raise InvalidSpec("policy", "empty document: it needs at least `format` and `classes`")
    doc = _Map(root, "policy")
    fmt = doc.req("format", _integer)
    if fmt != FORMAT:
        raise doc.error("format", f"this server reads format {FORMAT}, not {fmt}")
    preemption = doc.sub("preemption")
    reserving = doc.sub("reservations")
    policy = Policy(
        classes=_classes(doc),
        user_weights=frozen_map(_weights(doc, "users")),
        users=frozen_map(_caps(doc, "users")),
        teams=frozen_map(_caps(doc, "teams")),
        preemption=preemption.opt("enabled", _boolean) if preemption else None,
        min_runtime_s=preemption.opt("min_runtime_s", _seconds) if preemption else None,
        scorer_weights=frozen_map(_scorers(doc)),
        reserve_min_gpus=reserving.opt("min_gpus", _positive_int) if reserving else None,
        reserve_off=reserving is not None and reserving.is_null("min_gpus"),
        reservations=reserving.opt("per_class", _count) if reserving else None,
        gpu_hour_prices=frozen_map(_prices(doc)),
    )
    doc.done()
    for part in (preemption, reserving):
        if part is not None:
            part.done()
    _cross_check(policy, doc)
    return policy


def default_policy() -> Policy:
    return parse(DEFAULT_DOCUMENT)


# ---- the document's parts ----------------------------------------------------------------


def _classes(doc: _Map) -> tuple[ClassRule, ...]:
    items = doc.req("classes", _seq)
    if not items:
        raise doc.error("classes", "name at least one priority class")
    rules, names = [], set()
    for i, node in enumerate(items):
        entry = _Map(node, f"classes[{i}]")
        name = entry.req("name", _name)
        if name in names:
            raise entry.error("name", f"class {name!r} is named twice")
        names.add(name)
        pclass = PriorityClass(
            name,
            rank=entry.req("rank", _integer),
            can_preempt=entry.opt("may_preempt", _boolean) or False,
            preemptible=_default(entry.opt("preemptible", _boolean), True),
            cpu_offload=entry.opt("cpu_offload", _boolean) or False,
        )
        allowed = entry.sub("allowed")
        teams = users = None
        if allowed is not None:
            teams = allowed.opt("teams", _names)
            users = allowed.opt("users", _names)
            allowed.done()
        limit = entry.opt("default_time_limit_s", _seconds)
        if limit == 0:
            raise entry.error("default_time_limit_s", "must be > 0 (leave it out for none)")
        rules.append(ClassRule(pclass, limit, teams, users))
        entry.done()
    return tuple(rules)


def _weights(doc: _Map, key: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, entry in doc.entries(key):
        weight = entry.opt("weight", _number)
        if weight is not None:
            if weight <= 0:
                raise entry.error("weight", "must be > 0")
            out[name] = weight
    return out


def _caps(doc: _Map, key: str) -> dict[str, Caps]:
    out: dict[str, Caps] = {}
    for name, entry in doc.entries(key):
        gpus = entry.opt("max_running_gpus", _number)
        if gpus is not None and gpus < 0:
            raise entry.error("max_running_gpus", "must be >= 0")
        queued = entry.opt("max_queued_jobs", _count)
        if key == "users":
            entry.opt("weight", _number)  # read by ``_weights``
        entry.done()
        if gpus is not None or queued is not None:
            out[name] = Caps(gpus, queued)
    return out


def _scorers(doc: _Map) -> dict[str, float]:
    scorers = doc.sub("scorers")
    if scorers is None:
        return {}
    out = {}
    known = sorted(s.name for s in DEFAULT_SCORERS)
    for key in scorers.names():
        if key not in known:
            raise scorers.error(key, f"unknown scorer (known: {', '.join(known)})")
        weight = scorers.req(key, _number)
        if weight < 0:
            raise scorers.error(key, "must be >= 0")
        out[key] = weight
    return out


def _prices(doc: _Map) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, entry in doc.entries("pools"):
        price = entry.req("gpu_hour", _number)
        if price < 0:
            raise entry.error("gpu_hour", "must be >= 0")
        entry.done()
        out[name] = price
    return out


def _cross_check(policy: Policy, doc: _Map) -> None:
    """What only the whole document can tell: the scheduler's own checks, by field."""
    try:
        policy.config(Config())
    except InvalidSpec as e:
        raise InvalidSpec("policy." + e.field.removeprefix("config."), e.message) from None
    if not policy.classes:
        raise doc.error("classes", "name at least one priority class")


# ---- reading YAML nodes with their lines -------------------------------------------------


class _Map:
    """A YAML mapping whose keys are read one by one; ``done`` refuses the unread ones."""

    def __init__(self, node: yaml.Node, where: str) -> None:
        self.where = where
        self.line = node.start_mark.line + 1
        if not isinstance(node, yaml.MappingNode):
            raise InvalidSpec(where, f"line {self.line}: must be a mapping")
        self.items: dict[str, yaml.Node] = {}
        self.keys_at: dict[str, int] = {}
        for key, value in node.value:
            name = str(key.value)
            if name in self.items:
                raise InvalidSpec(_join(where, name), f"line {_line(key)}: given twice")
            self.items[name] = value
            self.keys_at[name] = _line(key)
        self._read: set[str] = set()

    def names(self) -> list[str]:
        self._read.update(self.items)
        return list(self.items)

    def error(self, key: str, message: str) -> InvalidSpec:
        node = self.items.get(key)
        line = _line(node) if node is not None else self.line
        return InvalidSpec(_join(self.where, key), f"line {line}: {message}")

    def req(self, key: str, read: Callable[[yaml.Node, str], T]) -> T:
        if key not in self.items:
            raise InvalidSpec(_join(self.where, key), f"line {self.line}: missing")
        value = self.opt(key, read)
        if value is None:
            raise self.error(key, "must be given")
        return value

    def opt(self, key: str, read: Callable[[yaml.Node, str], T]) -> T | None:
        self._read.add(key)
        node = self.items.get(key)
        if node is None or _is_null(node):
            return None
        return read(node, _join(self.where, key))

    def is_null(self, key: str) -> bool:
        node = self.items.get(key)
        return node is not None and _is_null(node)

    def sub(self, key: str) -> _Map | None:
        self._read.add(key)
        node = self.items.get(key)
        return None if node is None or _is_null(node) else _Map(node, _join(self.where, key))

    def entries(self, key: str) -> list[tuple[str, _Map]]:
        """A mapping of names to mappings (``users``, ``teams``, ``pools``)."""
        table = self.sub(key)
        if table is None:
            return []
        names = table.names()
        if len(names) > MAX_ENTRIES:
            raise self.error(key, f"at most {MAX_ENTRIES} entries")
        out = []
        for name in names:
            if not 1 <= len(name) <= 128:
                raise table.error(name, "a name of 1 to 128 characters")
            out.append((name, _Map(table.items[name], _join(table.where, name))))
        return out

    def done(self) -> None:
        unknown = [k for k in self.items if k not in self._read]
        if unknown:
            key = unknown[0]
            known = ", ".join(sorted(self._read)) or "none"
            raise InvalidSpec(
                _join(self.where, key),
                f"line {self.keys_at[key]}: unknown field (known here: {known})",
            )


def _join(where: str, key: str) -> str:
    return key if where == "policy" else f"{where}.{key}"


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


def _is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"


def _scalar(node: yaml.Node, where: str) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        raise InvalidSpec(where, f"line {_line(node)}: must be a single value")
    return yaml.constructor.SafeConstructor().construct_object(node)


def _seq(node: yaml.Node, where: str) -> list[yaml.Node]:
    if not isinstance(node, yaml.SequenceNode):
        raise InvalidSpec(where, f"line {_line(node)}: must be a list")
    if len(node.value) > MAX_ENTRIES:
        raise InvalidSpec(where, f"line {_line(node)}: at most {MAX_ENTRIES} entries")
    return list(node.value)


def _integer(node: yaml.Node, where: str) -> int:
    value = _scalar(node, where)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSpec(where, f"line {_line(node)}: must be a whole number, not {value!r}")
    return value


def _count(node: yaml.Node, where: str) -> int:
    value = _integer(node, where)
    if value < 0:
        raise InvalidSpec(where, f"line {_line(node)}: must be >= 0")
    return value


def _positive_int(node: yaml.Node, where: str) -> int:
    value = _integer(node, where)
    if value < 1:
        raise InvalidSpec(where, f"line {_line(node)}: must be >= 1 (null: off)")
    return value


def _number(node: yaml.Node, where: str) -> float:
    value = _scalar(node, where)
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise InvalidSpec(where, f"line {_line(node)}: must be a number, not {value!r}")
    return float(value)


def _seconds(node: yaml.Node, where: str) -> float:
    value = _number(node, where)
    if value < 0:
        raise InvalidSpec(where, f"line {_line(node)}: must be >= 0 seconds")
    return value


def _boolean(node: yaml.Node, where: str) -> bool:
    value = _scalar(node, where)
    if not isinstance(value, bool):
        raise InvalidSpec(where, f"line {_line(node)}: must be true or false, not {value!r}")
    return value


def _name(node: yaml.Node, where: str) -> str:
    value = _scalar(node, where)
    if not isinstance(value, str) or not 1 <= len(value) <= 128:
        raise InvalidSpec(where, f"line {_line(node)}: must be a name of 1 to 128 characters")
    return value


def _names(node: yaml.Node, where: str) -> frozenset[str]:
    return frozenset(_name(item, f"{where}[{i}]") for i, item in enumerate(_seq(node, where)))


def _default(value: T | None, default: T) -> T:
    return default if value is None else value


def describe(policy: Policy) -> dict[str, Any]:
    """The policy as JSON: what the API, the CLI and the dashboard show."""
    classes = [
        {
            "name": r.pclass.name,
            "rank": r.pclass.rank,
            "preemptible": r.pclass.preemptible,
            "may_preempt": r.pclass.can_preempt,
            "cpu_offload": r.pclass.cpu_offload,
            "default_time_limit_s": r.default_time_limit_s,
            "allowed": None
            if r.teams is None and r.users is None
            else {"teams": sorted(r.teams or ()), "users": sorted(r.users or ())},
        }
        for r in policy.classes
    ]
    return {
        "classes": classes,
        "user_weights": dict(policy.user_weights),
        "users": {k: _caps_json(v) for k, v in policy.users.items()},
        "teams": {k: _caps_json(v) for k, v in policy.teams.items()},
        "preemption": {"enabled": policy.preemption, "min_runtime_s": policy.min_runtime_s},
        "scorers": dict(policy.scorer_weights),
        "reservations": {
            "min_gpus": None if policy.reserve_off else policy.reserve_min_gpus,
            "per_class": policy.reservations,
        },
        "pools": {k: {"gpu_hour": v} for k, v in policy.gpu_hour_prices.items()},
    }


def _caps_json(caps: Caps) -> dict[str, Any]:
    return {"max_running_gpus": caps.max_running_gpus, "max_queued_jobs": caps.max_queued_jobs}
