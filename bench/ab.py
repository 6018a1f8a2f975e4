"""A/B: two or more corral builds or settings in turn, in one run (issue 9's method).

    python bench/ab.py [--rounds R] [--jobs N] [--idle N] [--agents K] [--db URL] SPEC SPEC [...]

A SPEC is ``NAME=SOURCE[,KEY=VALUE ...]``: SOURCE is a folder holding the
``corral`` package to run (put first on ``PYTHONPATH``; ``-`` for the one
installed here) and each KEY=VALUE a setting for that server, e.g.::

    python bench/ab.py before=/tmp/before/src after=- \\
        d5=-,CORRAL_SCHEDULING__DEBOUNCE_S=0.005 d2=-,CORRAL_SCHEDULING__DEBOUNCE_S=0.002

(a checkout of the code as it was: ``git archive HEAD src | tar -x -C /tmp/before``).
``--db postgresql://...`` runs every server on PostgreSQL instead of a SQLite file,
each peer in a schema of its own (the URL's ``schema`` or ``ab``, then ``_p1``,
``_p2`` ... in the order given), emptied at its start.

Every peer (a real server and K agents, as ``e2e.py`` starts them) is started
first; then each round runs the idle shape and the concurrent shape on every
peer, the order reversed every other round, so a machine whose speed drifts
weighs on all of them alike. Prints each round, then per peer the medians of
the rounds: idle p50, the server's CPU per idle trip, concurrent jobs/s and
the server's CPU per concurrent job, and for each peer after the first in how
many rounds it beat the first (idle lower, concurrent higher). On this kind of
machine rounds move by 10% or more: compare medians of several rounds, never
one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from corral_peer import CorralPeer
from workload import concurrent, idle

SERVER = "server"


@dataclass(frozen=True)
class Spec:
    name: str
    source: str | None  # a folder put first on PYTHONPATH; None: what is installed
    env: dict[str, str]


@dataclass
class Rounds:
    idle_ms: list[float] = field(default_factory=list)
    idle_cpu_ms: list[float] = field(default_factory=list)
    jobs_per_s: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)


def parse_spec(text: str) -> Spec:
    """``NAME=SOURCE[,KEY=VALUE ...]``; a clear error naming what is wrong."""
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest:
        raise ValueError(f"{text!r}: expected NAME=SOURCE[,KEY=VALUE ...] (SOURCE '-': installed)")
    source, *settings = rest.split(",")
    env = {}
    for kv in settings:
        key, sep, value = kv.partition("=")
        if not sep or not key:
            raise ValueError(f"{text!r}: setting {kv!r} is not KEY=VALUE")
        env[key] = value
    if source != "-" and not os.path.isdir(os.path.join(source, "corral")):
        raise ValueError(f"{text!r}: {source!r} holds no corral package")
    return Spec(name, None if source == "-" else source, env)


@contextmanager
def python_path(source: str | None) -> Iterator[None]:
    """Processes started inside run ``source``'s corral (CorralPeer keeps PYTHONPATH)."""
    old = os.environ.get("PYTHONPATH")
    if source is not None:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (source, old)))
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def peer_db(url: str, index: int) -> str:
    """``url`` for the ``index``-th peer: its ``schema`` (``ab`` if none) suffixed ``_p<index>``,
    so every peer has tables of its own."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query)
    base = next((v for k, v in query if k == "schema"), "ab")
    query = [(k, v) for k, v in query if k != "schema"] + [("schema", f"{base}_p{index}")]
    return urlunsplit(parts._replace(query=urlencode(query)))


def one_round(peer: CorralPeer, rounds: Rounds, jobs: int, trips: int, clients: int) -> str:
    """The idle and concurrent shapes on ``peer``; what they measured, as a line."""
    before = peer.cpu_s()[SERVER]
    f = idle(peer, trips)
    rounds.idle_cpu_ms.append((peer.cpu_s()[SERVER] - before) * 1000 / trips)
    rounds.idle_ms.append(f.done_p50_ms)
    before = peer.cpu_s()[SERVER]
    f = concurrent(peer, jobs, clients)
    rounds.cpu_ms.append((peer.cpu_s()[SERVER] - before) * 1000 / jobs)
    rounds.jobs_per_s.append(f.jobs_per_s)
    return (
        f"idle p50 {rounds.idle_ms[-1]:.2f} ms ({rounds.idle_cpu_ms[-1]:.2f} ms server CPU), "
        f"concurrent {rounds.jobs_per_s[-1]:,.0f} jobs/s ({rounds.cpu_ms[-1]:.3f} ms server CPU)"
    )


def run(
    specs: Sequence[Spec], args: argparse.Namespace, log: Callable[[str], None]
) -> dict[str, Rounds]:
    peers: list[CorralPeer] = []
    results = {s.name: Rounds() for s in specs}
    try:
        for i, spec in enumerate(specs, 1):
            log(f"starting {spec.name} ({spec.source or 'installed'}) with {args.agents} agents")
            with python_path(spec.source):
                db = None if args.db is None else peer_db(args.db, i)
                peers.append(CorralPeer(args.agents, db, spec.name, "", spec.env))
        for r in range(args.rounds):
            for peer in peers if r % 2 == 0 else peers[::-1]:
                line = one_round(peer, results[peer.name], args.jobs, args.idle, args.clients)
                print(f"round {r + 1}/{args.rounds} {peer.name}: {line}", flush=True)
    finally:
        for peer in peers:
            peer.close()
    return results


def report(results: dict[str, Rounds]) -> None:
    """Per peer the medians of its rounds and, for every peer after the first, in how many
    rounds it beat the first (the same round ran both: a drifting machine moves both)."""
    print("\nmedians of the rounds")
    base_name, base = next(iter(results.items()))
    for name, r in results.items():
        line = (
            f"{name}: idle p50 {statistics.median(r.idle_ms):.2f} ms "
            f"({statistics.median(r.idle_cpu_ms):.2f} ms server CPU per trip); "
            f"concurrent {statistics.median(r.jobs_per_s):,.0f} jobs/s "
            f"({statistics.median(r.cpu_ms):.3f} ms server CPU per job)"
        )
        if r is not base:
            n = len(r.idle_ms)
            lower = sum(a < b for a, b in zip(r.idle_ms, base.idle_ms, strict=True))
            higher = sum(a > b for a, b in zip(r.jobs_per_s, base.jobs_per_s, strict=True))
            line += (
                f"; against {base_name} round by round: idle lower in {lower} of {n},"
                f" concurrent higher in {higher} of {n}"
            )
        print(line)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("specs", nargs="+", metavar="SPEC", help="NAME=SOURCE[,KEY=VALUE ...]")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--jobs", type=int, default=2000, help="concurrent jobs per round")
    ap.add_argument("--idle", type=int, default=400, help="idle round trips per round")
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument(
        "--db",
        default=None,
        metavar="URL",
        help="run every server on this PostgreSQL database (a schema per peer) instead of SQLite",
    )
    args = ap.parse_args(argv)
    if args.db is not None and not args.db.startswith(("postgresql://", "postgres://")):
        ap.error(f"--db {args.db!r}: expected a postgresql:// URL (SQLite is the default)")
    if args.rounds < 1 or args.jobs < 1 or args.idle < 1:
        ap.error("--rounds, --jobs and --idle must be at least 1")
    try:
        specs = [parse_spec(s) for s in args.specs]
    except ValueError as exc:
        ap.error(str(exc))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        ap.error(f"peer names must differ: {', '.join(names)}")
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    report(run(specs, args, log))
    return 0


if __name__ == "__main__":
    sys.exit(main())
