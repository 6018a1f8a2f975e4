"""Benchmark of the simulator: simulated jobs per second, and placement quality.

Usage: ``python bench/sim.py [--nodes 1000] [--jobs 100000 | --full] [--policies a,b,c]``

A generated, seeded trace (``corral.sim.generate``: mostly 1-GPU jobs, a tail
of 2/4/8-GPU jobs and 2x8 gangs, half-card jobs, log-normal run times with
users' estimates of 1-2x, arrivals offering ``--load`` x the cluster on
average with a daily swing so busy hours queue) on ``--nodes`` nodes of 8
GPUs shared by four equal-quota teams, replayed through each policy in turn:
the same trace, the same run. ``--full`` is the goal's size: 1,000,000 jobs,
through the three policies as the issue asks (a minute or two per policy
compiled; ``--policies corral`` runs corral's scheduler alone).
corral's scheduler is kept between cycles (``corral.scheduler.Scheduler``);
``corral-rebuild`` calls ``schedule(snapshot)`` afresh every cycle, the
same plans the slow way. The scheduling loop ticks every
``--cycle-interval`` simulated seconds; the run stops when the last job is
expected to arrive, so the GPU allocation ratio measures a loaded cluster
rather than the drain.

Waits are reported two ways: of the jobs that started (``p95``), and
counting the jobs still queued at the end as waiting until then (``p95 incl.
queued``): a policy that never starts some big jobs must not look better for
it. Prints, per policy::

    simulated jobs/s (1000 nodes, 100000 jobs, corral): N   (per CPU second: C)
    gpu_allocation_ratio (corral): R   wait p50/p95 s: A / B   ...
      p95 wait s by size (corral): 0.5: .. 1: .. 2: .. 4: .. 8: .. 2x8: ..
      p95 wait s incl. queued by size (corral): ...

then the headline (corral's scheduler, or the first policy run) and a table::

    simulated jobs/s (1000 nodes, 100000 jobs): N   <- compiled (mypyc, build/native)
    simulated jobs/s (1000 nodes, 100000 jobs, pure Python): M
    compiled and pure Python runs give the same results: yes
    gpu_allocation_ratio corral / first-fit / best-fit: R1 / R2 / R3

Two builds of the same sources run, each in its own process: pure Python (what
the server and tests import) and, when ``scripts/build-native`` has compiled the
current sources into ``build/native``, the mypyc-compiled build (``--build``
chooses; a missing or stale build is said so and skipped). Each line is tagged
``[pure]`` or ``[compiled]``; the headline names the build it measures, and the
two builds' reports (everything but speed) must agree.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import native  # scripts/native.py: the compiled build, if any

from corral.sim import generate
from corral.sim.arenas import use_huge_pages
from corral.sim.policies import POLICIES
from corral.sim.runner import Progress, simulate

DEFAULT_POLICIES = "corral,first-fit,best-fit"
CHILD_MARK = "@@results "
LABELS = {"pure": "pure Python", "native": "compiled (mypyc, build/native)"}
TAGS = {"pure": "[pure]     ", "native": "[compiled] "}


SIZES = ("0.5", "1", "2", "4", "8", "2x8")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.full:
        args.jobs = 1_000_000
    policies = [p.strip() for p in (args.policies or DEFAULT_POLICIES).split(",") if p.strip()]
    for name in policies:
        if name not in POLICIES:
            print(f"unknown policy {name!r} (known: {', '.join(POLICIES)})", file=sys.stderr)
            return 2
    shape = generate.TraceShape(
        jobs=args.jobs, total_gpus=args.nodes * 8, load=args.load, seed=args.seed
    )
    until = args.until if args.until is not None else _last_arrival(shape)
    if args.child:  # one build's runs, in the process this build was imported into
        # the compiled build's small objects on huge pages (corral.sim.arenas), as ``corral sim``
        print(f"  memory: huge pages {use_huge_pages()}", file=sys.stderr, flush=True)
        where = "here" if args.trace_here else "ahead, by a forked process (a spare core)"
        print(f"  trace: drawn {where}", file=sys.stderr, flush=True)
        results = {name: _run(name, args, until) for name in policies}
        print(CHILD_MARK + json.dumps(results), flush=True)
        return 0
    print(
        f"trace: {args.nodes} nodes x 8 GPUs, {args.jobs} jobs, load {args.load:g}, "
        f"seed {args.seed}, cycle every {args.cycle_interval:g} s, until {until:,.0f} s",
        flush=True,
    )
    print(f"python: {_interpreter()}", flush=True)
    builds: dict[str, dict[str, tuple[float, dict[str, Any]]]] = {}
    for build in _builds(args.build):
        builds[build] = _run_build(build, argv, until)
        for name in policies:
            _print_policy(name, args.nodes, *builds[build][name], tag=TAGS[build])
    _print_headline(builds, args.nodes, policies)
    return 0


def _interpreter() -> str:
    """Which Python runs the simulation: its build weighs on the figures (a distribution's,
    built with profile-guided and link-time optimisation, runs the compiled simulator's
    trace in 13% fewer instructions than a plain pyenv build)."""
    version = ".".join(str(v) for v in sys.version_info[:3])
    where = os.path.realpath(sys.executable)
    compiler = sys.version.split("[")[-1].rstrip("]")
    return f"{sys.implementation.name} {version} ({where}; {compiler})"


def _builds(wanted: str) -> list[str]:
    """The builds to run: pure Python always; the compiled one when asked and usable."""
    if wanted == "pure":
        return ["pure"]
    problem = native.stale()
    if problem is None:
        return ["pure", "native"] if wanted == "both" else ["native"]
    print(f"compiled build: not run ({problem})", flush=True)
    if wanted == "native":
        raise SystemExit(2)
    return ["pure"]


def _run_build(
    build: str, argv: Sequence[str] | None, until: float
) -> dict[str, tuple[float, dict[str, Any]]]:
    """Run this bench's policies in a child process importing ``build``'s corral."""
    env = native.env() if build == "native" else _pure_env()
    args = sys.argv[1:] if argv is None else list(argv)
    child = [sys.executable, __file__, *args, "--until", repr(until), "--child"]
    out = subprocess.run(child, env=env, stdout=subprocess.PIPE, text=True, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith(CHILD_MARK))
    results = json.loads(line[len(CHILD_MARK) :])
    return {name: (rate, summary) for name, (rate, summary) in results.items()}


def _pure_env() -> dict[str, str]:
    """The environment of a child that must import pure Python (never ``build/native``)."""
    env = dict(os.environ)
    build = str(native.BUILD)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != build]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def _print_headline(
    builds: dict[str, dict[str, tuple[float, dict[str, Any]]]], nodes: int, policies: list[str]
) -> None:
    """The goal's line (the fastest build run, named), the other build's, quality tables."""
    head = "corral" if "corral" in policies else policies[0]
    order = [b for b in ("native", "pure") if b in builds]
    for i, build in enumerate(order):
        rate, summary = builds[build][head]
        tag = "" if i == 0 else f", {LABELS[build]}"
        print(
            f"simulated jobs/s ({nodes} nodes, {summary['jobs_total']} jobs{tag}): {rate:,.0f}"
            + (f"   <- {LABELS[build]}" if i == 0 else "")
        )
    if len(order) == 2:
        same = all(
            _quality(builds["native"][p][1]) == _quality(builds["pure"][p][1]) for p in policies
        )
        print(f"compiled and pure Python runs give the same results: {'yes' if same else 'NO'}")
    results = builds[order[0]]
    ratios = " / ".join(f"{results[p][1]['gpu_allocation_ratio']:.4f}" for p in policies)
    print(f"gpu_allocation_ratio {' / '.join(policies)}: {ratios}")
    _print_table(results)


def _quality(summary: dict[str, Any]) -> str:
    """Everything a run reports but its speed."""
    return json.dumps({k: v for k, v in summary.items() if k != "cpu_jobs_per_s"}, sort_keys=True)


def _print_table(results: dict[str, tuple[float, dict[str, Any]]]) -> None:
    """p95 waits by job size, every policy side by side (started only / incl. queued)."""
    print(f"{'p95 wait s':<22}" + "".join(f"{size:>16}" for size in SIZES))
    for name, (_, summary) in results.items():
        by = summary["wait_by_gpus"]
        cells = []
        for size in SIZES:
            entry = by.get(size, {})
            cells.append(f"{_num(entry.get('p95_s'))} / {_num(entry.get('p95_incl_queued_s'))}")
        print(f"{name:<22}" + "".join(f"{c:>16}" for c in cells))
    print("(started jobs only / counting jobs still queued at the end)")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--full", action="store_true", help="1,000,000 jobs (the goal's size)")
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cycle-interval", type=float, default=60.0, help="simulated s")
    parser.add_argument("--until", type=float, default=None, help="default: last arrival")
    parser.add_argument("--fragmentation-sample", type=float, default=3600.0, help="simulated s")
    parser.add_argument("--policies", default=None, help=f"default: {DEFAULT_POLICIES}")
    parser.add_argument(
        "--build",
        choices=("both", "pure", "native"),
        default="both",
        help="pure Python, the compiled build of scripts/build-native, or both (default; "
        "the compiled one only when built from the current sources)",
    )
    parser.add_argument(
        "--trace-here",
        action="store_true",
        help="draw the trace in the simulating process (default: a forked one draws it ahead)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _last_arrival(shape: generate.TraceShape) -> float:
    """When the trace's last job arrives (one cheap pass over the stream)."""
    last = 0.0
    for job in generate.trace(shape):
        last = job.submit_at
    return last


def _run(name: str, args: argparse.Namespace, until: float) -> tuple[float, dict[str, Any]]:
    """Simulate the trace through ``name``; return jobs/s of wall time and the summary."""
    scenario = generate.scenario(
        args.nodes,
        args.jobs,
        load=args.load,
        seed=args.seed,
        cycle_interval_s=args.cycle_interval,
        fragmentation_sample_s=args.fragmentation_sample,
        ahead=not args.trace_here,
    )
    started, cpu = time.perf_counter(), time.process_time()
    summary = simulate(scenario, name, until=until, progress=_progress(name))
    elapsed = time.perf_counter() - started
    summary["cpu_jobs_per_s"] = summary["jobs_total"] / (time.process_time() - cpu)
    return summary["jobs_total"] / elapsed, summary


def _progress(name: str) -> Any:
    def show(p: Progress) -> None:
        if not p.done and p.arrived % 100_000 == 0:
            print(
                f"  {name}: t={p.now:,.0f}s jobs {p.arrived:,} queued {p.queued:,}",
                file=sys.stderr,
                flush=True,
            )

    return show


def _print_policy(name: str, nodes: int, rate: float, summary: dict[str, Any], *, tag: str) -> None:
    frag = summary.get("fragmentation") or {}
    print(
        f"{tag}simulated jobs/s ({nodes} nodes, {summary['jobs_total']} jobs, {name}): {rate:,.0f}"
        f"   (per CPU second: {summary['cpu_jobs_per_s']:,.0f})"
    )
    print(
        f"{tag}gpu_allocation_ratio ({name}): {summary['gpu_allocation_ratio']:.4f}   "
        f"wait p50/p95 s: {summary['wait_p50_s']} / {summary['wait_p95_s']}   "
        f"preemptions: {summary['preemptions']}   "
        f"fragmentation: {frag.get('score_mean', '-')}   cycles: {summary['cycles']}",
        flush=True,
    )
    by = summary["wait_by_gpus"]
    started = " ".join(f"{k}: {_num(by.get(k, {}).get('p95_s'))}" for k in SIZES)
    queued = " ".join(f"{k}: {_num(by.get(k, {}).get('p95_incl_queued_s'))}" for k in SIZES)
    print(f"{tag}  p95 wait s by size ({name}): {started}")
    print(
        f"{tag}  p95 wait s incl. queued by size ({name}): {queued}   "
        f"(all jobs: {_num(summary['wait_p95_incl_queued_s'])})",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
