"""Packing on a real trace: corral's scheduler against best-fit and FGD (Alibaba openb).

Usage: ``python bench/placement.py [--traces DIR] [--variants a,b] [--policies a,b]
[--quick] [--seed 0] [--window 1] [--no-memory]``

The protocol of the FGD paper's Fig. 9 (Weng et al., USENIX ATC 2023), on its
public trace (``/work/shared/traces/alibaba-openb``: 1,213 nodes, 6,212 GPUs
and four workload variants): the variant's tasks arrive in an order shuffled
with a fixed seed (then drawn with replacement once the list runs out), none
leaves, until the GPU compute asked for reaches 130% of the cluster's; a task
that no node fits when it arrives is dropped. At 100%, 110%, 120% and 130% of
arrived load the bench prints, per policy, the share of the cluster's GPU
compute allocated and FGD's fragmentation measure (the free GPU compute that
the variant's typical tasks could not use, as a share of all GPU compute).

Policies (``bench/packing.py`` holds the two baselines and says how they were
written): ``corral`` is ``corral.scheduler.Scheduler`` with its default
configuration, one scheduling cycle per ``--window`` arrivals (1: each task is
decided alone, as the baselines decide it); ``best-fit`` and ``fgd`` are the
simulator's scorers, ties drawn at random with ``--seed``. Every policy sees
the same nodes and tasks: CPUs in milli-CPUs (corral's CPU slots count
milli-CPUs here), memory from the trace's ``memory_mib`` columns (corral's memory
requests; ``--no-memory`` leaves it out for all), cards in milli-GPUs, the GPU models
a task accepts.

``--quick`` keeps every 8th node (the arrivals scale with the cluster) and
one variant: a development run of seconds rather than minutes.

Prints one line per variant, policy and load (wrapped here)::

    multigpu50  fgd       load 130%: allocated 0.9733  fragmentation 0.0266
        (placed 5109 / 6440, 2.1 s)

(the parenthesis: tasks placed / arrived, CPU seconds so far)

then a table of the allocated share at 130% per variant and policy.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from packing import (  # bench/packing.py
    FGD,
    MILLI,
    BestFit,
    Fragmentation,
    NodeState,
    Task,
    arrivals,
    cluster_fragmentation,
    fits,
    load_nodes,
    load_tasks,
    typical_tasks,
)

from corral.core.model import Allocation, Gpu, Job, Node
from corral.core.resources import GIB, ResourceRequest
from corral.scheduler import Config, Scheduler

TRACES = Path("/work/shared/traces/alibaba-openb")
MIB = 1024**2
VARIANTS = ("gpushare40", "multigpu50", "gpuspec33", "cpu050")
POLICIES = ("corral", "best-fit", "fgd")
LOADS = (1.0, 1.1, 1.2, 1.3)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    variants = _names(args.variants, VARIANTS[:1] if args.quick else VARIANTS)
    policies = _names(args.policies, POLICIES)
    every = 8 if args.quick else 1
    table: dict[tuple[str, str], float] = {}
    for variant in variants:
        tasks = load_tasks(args.traces / f"openb_pod_list_{variant}.csv", args.memory)
        for policy in policies:
            nodes = load_nodes(args.traces / "openb_node_list_gpu_node.csv", every, args.memory)
            points = replay(policy, nodes, tasks, seed=args.seed, window=args.window)
            for load, (share, frag, placed, arrived, seconds) in points.items():
                print(
                    f"{variant:<11} {policy:<9} load {load:.0%}: allocated {share:.4f}  "
                    f"fragmentation {frag:.4f}  (placed {placed} / {arrived}, {seconds:.1f} s)",
                    flush=True,
                )
            table[(variant, policy)] = points[LOADS[-1]][0]
    print(f"\nGPU allocation share at {LOADS[-1]:.0%} arrived load")
    print(f"{'variant':<12}" + "".join(f"{p:>10}" for p in policies))
    for variant in variants:
        print(f"{variant:<12}" + "".join(f"{table[(variant, p)]:>10.4f}" for p in policies))
    return 0


Point = tuple[float, float, int, int, float]


def replay(
    policy: str, nodes: list[NodeState], tasks: Sequence[Task], *, seed: int, window: int = 1
) -> dict[float, Point]:
    """Arrivals through ``policy`` on ``nodes`` (changed in place) up to the top load; the
    (allocated share, fragmentation, placed, arrived, seconds) at each load of ``LOADS``."""
    capacity = sum(len(n.free) for n in nodes) * MILLI
    frag = Fragmentation(typical_tasks(tasks))
    place = _placer(policy, nodes, seed, frag, window)
    points: dict[float, Point] = {}
    marks = [(round(load * capacity), load) for load in LOADS]
    asked = placed = 0
    started = time.process_time()
    for arrived, task in enumerate(arrivals(tasks, seed, marks[-1][0]), start=1):
        asked += task.gpu_milli_total
        placed += place(task)
        while marks and asked >= marks[0][0]:
            placed += place(None)  # a cycle for what the window holds
            allocated = capacity - sum(sum(n.free) for n in nodes)
            seconds = time.process_time() - started
            share = allocated / capacity
            points[marks.pop(0)[1]] = (
                share,
                cluster_fragmentation(nodes, frag),
                placed,
                arrived,
                seconds,
            )
    return points


def _placer(
    policy: str, nodes: list[NodeState], seed: int, frag: Fragmentation, window: int
) -> Callable[[Task | None], int]:
    """A function taking a task (None: decide what is waiting) and returning how many tasks
    it placed."""
    if policy == "corral":
        return CorralPacker(nodes, window).offer
    packer = FGD(nodes, seed, frag) if policy == "fgd" else BestFit(nodes, seed)
    if policy not in ("fgd", "best-fit"):
        raise SystemExit(f"unknown policy {policy!r} (known: {', '.join(POLICIES)})")

    def offer(task: Task | None) -> int:
        if task is None:
            return 0
        got = packer.place(task)
        if got is None:
            return 0
        i, cards = got
        node = nodes[i]
        before = node.key()
        _take(node, cards, task.milli, task.cpu, task.memory)
        packer.moved(i, before)
        return 1

    return offer


class CorralPacker:
    """corral's scheduler kept between cycles, told of each arrival; a cycle every ``window``
    arrivals. A task it leaves queued is dropped, as the protocol drops it (no task leaves,
    so capacity only shrinks: it would never fit later)."""

    def __init__(self, nodes: list[NodeState], window: int) -> None:
        self.nodes = nodes
        self.index = {n.name: i for i, n in enumerate(nodes)}
        self.window = window
        self.waiting: dict[str, Task] = {}
        self.seq = 0
        corral_nodes = tuple(
            Node(
                n.name,
                gpus=tuple(Gpu(i, n.model, 32 * GIB) for i in range(len(n.free))),
                cpus=n.cpu_total,
                memory_bytes=n.mem_total * MIB,
            )
            for n in nodes
        )
        # No consolidation moves: the replay places or drops each task once, and a move is a
        # stop and restart it does not model.
        self.scheduler = Scheduler(corral_nodes, (), Config(consolidation_moves=0))

    def offer(self, task: Task | None) -> int:
        if task is not None:
            self.seq += 1
            job_id = f"t{self.seq}"
            self.waiting[job_id] = task
            self.scheduler.submit(Job(job_id, resources=_request(task), submitted_at=self.seq))
            if len(self.waiting) < self.window:
                return 0
        if not self.waiting:
            return 0
        plan = self.scheduler.schedule(float(self.seq), explain=False)
        for p in plan.placements:
            task = self.waiting.pop(p.job_ids[0])
            node = self.nodes[self.index[p.node]]
            assert fits(node, task) or task.gpus == 0, (task, node)
            _take(node, p.gpu_indices, p.gpu_milli, p.cpus, p.memory_bytes // MIB)
            self.scheduler.withdraw(p.job_ids[0])
            alloc = Allocation(
                p.allocation_id,
                p.job_ids,
                p.node,
                gpu_indices=p.gpu_indices,
                gpu_milli=p.gpu_milli,
                cpus=p.cpus,
                memory_bytes=p.memory_bytes,
            )
            self.scheduler.start(alloc, None)
        for job_id in self.waiting:
            self.scheduler.withdraw(job_id)
        placed = len(plan.placements)
        self.waiting.clear()
        return placed


def _request(task: Task) -> ResourceRequest:
    models, memory = frozenset(task.models), task.memory * MIB
    if task.gpus == 1 and task.milli < MILLI:
        return ResourceRequest(
            gpu_milli=task.milli, cpus=task.cpu, gpu_models=models, memory_bytes=memory
        )
    return ResourceRequest(gpus=task.gpus, cpus=task.cpu, gpu_models=models, memory_bytes=memory)


def _take(node: NodeState, cards: Sequence[int], milli: int, cpu: int, memory: int) -> None:
    """Take ``milli`` of each card, ``cpu`` milli-CPUs and ``memory`` MiB of ``node``."""
    for c in cards:
        node.free[c] -= milli
        assert node.free[c] >= 0, node
    node.cpu_free -= cpu
    node.mem_free -= memory
    assert node.cpu_free >= 0, node
    assert node.mem_free >= 0, node


def _names(given: str | None, default: Sequence[str]) -> list[str]:
    return [x.strip() for x in given.split(",") if x.strip()] if given else list(default)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=TRACES)
    parser.add_argument("--variants", default=None, help=f"default: {','.join(VARIANTS)}")
    parser.add_argument("--policies", default=None, help=f"default: {','.join(POLICIES)}")
    parser.add_argument("--quick", action="store_true", help="every 8th node, one variant")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window", type=int, default=1, help="arrivals per corral cycle")
    parser.add_argument(
        "--no-memory",
        dest="memory",
        action="store_false",
        help="leave the trace's memory out for every policy",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
