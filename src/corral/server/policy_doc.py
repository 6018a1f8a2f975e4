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

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from corral.core.errors import InvalidSpec
from corral.core.model import EMPTY, PriorityClass, Team, frozen_map
from corral.scheduler.api import Config
from corral.scheduler.scorers import DEFAULT_SCORERS
from corral.server import yaml_fields as yf
from corral.server.yaml_fields import Fields

FORMAT = 1
"""The document format this server reads (the document's ``format``)."""

MAX_BYTES = 256 * 1024
"""A policy document's size at most: thousands of users' entries, far from a memory risk."""


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
    doc = Fields(root, "")
    fmt = doc.req("format", yf.integer)
    if fmt != FORMAT:
        raise doc.error("format", f"this server reads format {FORMAT}, not {fmt}")
    preemption = doc.sub("preemption")
    reserving = doc.sub("reservations")
    policy = Policy(
        classes=_classes(doc),
        user_weights=frozen_map(_weights(doc, "users")),
        users=frozen_map(_caps(doc, "users")),
        teams=frozen_map(_caps(doc, "teams")),
        preemption=preemption.opt("enabled", yf.boolean) if preemption else None,
        min_runtime_s=preemption.opt("min_runtime_s", yf.seconds) if preemption else None,
        scorer_weights=frozen_map(_scorers(doc)),
        reserve_min_gpus=reserving.opt("min_gpus", yf.positive_int) if reserving else None,
        reserve_off=reserving is not None and reserving.is_null("min_gpus"),
        reservations=reserving.opt("per_class", yf.count) if reserving else None,
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


def _classes(doc: Fields) -> tuple[ClassRule, ...]:
    items = doc.req("classes", yf.seq)
    if not items:
        raise doc.error("classes", "name at least one priority class")
    rules, names = [], set()
    for i, node in enumerate(items):
        entry = Fields(node, f"classes[{i}]")
        name = entry.req("name", yf.a_name)
        if name in names:
            raise entry.error("name", f"class {name!r} is named twice")
        names.add(name)
        pclass = PriorityClass(
            name,
            rank=entry.req("rank", yf.integer),
            can_preempt=entry.opt("may_preempt", yf.boolean) or False,
            preemptible=yf.default(entry.opt("preemptible", yf.boolean), True),
            cpu_offload=entry.opt("cpu_offload", yf.boolean) or False,
            preempt_other_teams=entry.opt("preempt_other_teams", yf.boolean) or False,
        )
        allowed = entry.sub("allowed")
        teams = users = None
        if allowed is not None:
            teams = allowed.opt("teams", yf.name_list)
            users = allowed.opt("users", yf.name_list)
            allowed.done()
        limit = entry.opt("default_time_limit_s", yf.seconds)
        if limit == 0:
            raise entry.error("default_time_limit_s", "must be > 0 (leave it out for none)")
        rules.append(ClassRule(pclass, limit, teams, users))
        entry.done()
    return tuple(rules)


def _weights(doc: Fields, key: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, entry in doc.entries(key):
        weight = entry.opt("weight", yf.number)
        if weight is not None:
            if weight <= 0:
                raise entry.error("weight", "must be > 0")
            out[name] = weight
    return out


def _caps(doc: Fields, key: str) -> dict[str, Caps]:
    out: dict[str, Caps] = {}
    for name, entry in doc.entries(key):
        gpus = entry.opt("max_running_gpus", yf.number)
        if gpus is not None and gpus < 0:
            raise entry.error("max_running_gpus", "must be >= 0")
        queued = entry.opt("max_queued_jobs", yf.count)
        if key == "users":
            entry.opt("weight", yf.number)  # read by ``_weights``
        entry.done()
        if gpus is not None or queued is not None:
            out[name] = Caps(gpus, queued)
    return out


def _scorers(doc: Fields) -> dict[str, float]:
    scorers = doc.sub("scorers")
    if scorers is None:
        return {}
    out = {}
    known = sorted(s.name for s in DEFAULT_SCORERS)
    for key in scorers.names():
        if key not in known:
            raise scorers.error(key, f"unknown scorer (known: {', '.join(known)})")
        weight = scorers.req(key, yf.number)
        if weight < 0:
            raise scorers.error(key, "must be >= 0")
        out[key] = weight
    return out


def _prices(doc: Fields) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, entry in doc.entries("pools"):
        price = entry.req("gpu_hour", yf.number)
        if price < 0:
            raise entry.error("gpu_hour", "must be >= 0")
        entry.done()
        out[name] = price
    return out


def _cross_check(policy: Policy, doc: Fields) -> None:
    """What only the whole document can tell: the scheduler's own checks, by field."""
    try:
        policy.config(Config())
    except InvalidSpec as e:
        raise InvalidSpec("policy." + e.field.removeprefix("config."), e.message) from None
    if not policy.classes:
        raise doc.error("classes", "name at least one priority class")


def describe(policy: Policy) -> dict[str, Any]:
    """The policy as JSON: what the API, the CLI and the dashboard show."""
    classes = [
        {
            "name": r.pclass.name,
            "rank": r.pclass.rank,
            "preemptible": r.pclass.preemptible,
            "may_preempt": r.pclass.can_preempt,
            "cpu_offload": r.pclass.cpu_offload,
            "preempt_other_teams": r.pclass.preempt_other_teams,
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
