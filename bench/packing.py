"""The cluster, the tasks and the two published packers of ``bench/placement.py``.

Written from the FGD paper (Weng et al., "Beware of Fragmentation: Scheduling
GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC 2023)
and the behaviour of its simulator (hkust-adsl/kubernetes-scheduler-simulator),
read, not copied:

* a task asks for CPU (milli-CPUs), memory (``memory_mib``), ``num_gpu`` cards
  and, when it asks for one card, ``gpu_milli`` of it (1000: the whole card), and
  may name the GPU models it accepts;
* a node fits a task when it has the CPU and the memory, accepts the model, and
  has ``num_gpu`` cards each with ``gpu_milli`` free (the simulator's
  NodeResourcesFit filter checks memory as it checks CPU);
* **FGD** scores a node by how much the placement lowers the node's
  fragmentation for the *target workload* ``M`` (the task shapes of the trace
  making up 95% of its tasks, with their frequencies): ``F_n(M) = sum_m p_m
  F_n(m)``, where ``F_n(m)`` is all the node's free GPU compute when ``m``
  cannot run there (CPU, memory, model or cards short; a CPU-only ``m`` counts it too),
  else the free compute of the cards with less than ``m``'s share free. Score:
  ``int(100 * sigmoid((F_before - F_after) / 1000))``; a shared task tries
  every card that fits and keeps the best; whole cards go to the lowest free
  indices. The highest score wins, ties drawn at random (seeded), as
  kube-scheduler does.
* **best-fit** scores ``int(100 * (1 - 0.5 (cpu_free - cpu) / 128 cores -
  0.5 (gpu_free - gpu) / 8 cards))`` and draws ties the same way; a shared
  task goes to the fullest card that fits.

Memory is read from the trace's ``memory_mib`` columns when they are there, and
counted by every policy alike; ``load_*(memory=False)`` leaves it out for all (a
node file without the column offers ``UNCOUNTED`` memory).
"""

from __future__ import annotations

import csv
import math
import random
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

MILLI = 1000
MAX_SPEC_CPU = 128_000  # best-fit's normalisers: the largest node's CPUs and cards
MAX_SPEC_GPU = 8_000
UNCOUNTED = 1 << 39  # MiB: the memory of a node whose memory is not counted (never short)


@dataclass(frozen=True, slots=True)
class Task:
    cpu: int  # milli-CPUs
    gpus: int  # cards
    milli: int  # per card (1000: whole); 0 for CPU-only tasks
    models: tuple[str, ...] = ()  # accepted GPU models; () any
    memory: int = 0  # MiB

    @property
    def gpu_milli_total(self) -> int:
        return self.gpus * self.milli


@dataclass(slots=True)
class NodeState:
    name: str
    model: str
    cpu_total: int
    cpu_free: int
    free: list[int]  # milli-GPUs free per card
    mem_total: int = UNCOUNTED  # MiB
    mem_free: int = UNCOUNTED

    def key(self) -> Key:
        """What fragmentation and fit depend on (card order does not matter)."""
        return (self.model, self.cpu_free, tuple(sorted(self.free)), self.mem_free)


Key = tuple[str, int, tuple[int, ...], int]  # model, milli-CPUs, free cards, MiB free


def _memory(row: dict[str, str], memory: bool, default: int) -> int:
    """The row's ``memory_mib`` when counted and present, else ``default``."""
    text = row.get("memory_mib") if memory else None
    return int(text) if text else default


def load_nodes(path: Path, every: int = 1, memory: bool = True) -> list[NodeState]:
    """The trace's nodes (every ``every``-th of them: the quick mode's smaller cluster)."""
    nodes = []
    with path.open() as f:
        for i, row in enumerate(csv.DictReader(f)):
            if i % every:
                continue
            cpu, gpus = int(row["cpu_milli"]), int(row["gpu"])
            mem = _memory(row, memory, UNCOUNTED)
            nodes.append(NodeState(row["sn"], row["model"], cpu, cpu, [MILLI] * gpus, mem, mem))
    return nodes


def load_tasks(path: Path, memory: bool = True) -> list[Task]:
    tasks = []
    with path.open() as f:
        for row in csv.DictReader(f):
            gpus = int(row["num_gpu"])
            milli = int(row["gpu_milli"]) if gpus else 0
            spec = row.get("gpu_spec") or ""
            models = tuple(sorted(m for m in spec.split("|") if m))
            if gpus > 1:
                milli = MILLI  # several cards are whole cards
            mem = _memory(row, memory, 0)
            tasks.append(Task(int(row["cpu_milli"]), gpus, milli, models, mem))
    return tasks


def arrivals(tasks: Sequence[Task], seed: int, gpu_target_milli: int) -> Iterator[Task]:
    """The paper's protocol: the tasks shuffled (fixed seed), then drawn with replacement
    once the list runs out, until the GPU asked for reaches ``gpu_target_milli``."""
    rng = random.Random(seed)
    order = list(tasks)
    rng.shuffle(order)
    asked = 0
    i = 0
    while asked < gpu_target_milli:
        task = order[i] if i < len(order) else rng.choice(tasks)
        i += 1
        asked += task.gpu_milli_total
        yield task


def accepts(node: NodeState, task: Task) -> bool:
    return not task.models or node.model in task.models


def fits(node: NodeState, task: Task) -> bool:
    if node.cpu_free < task.cpu or node.mem_free < task.memory:
        return False
    if task.gpus == 0:
        return True
    if not accepts(node, task):
        return False
    return sum(1 for f in node.free if f >= task.milli) >= task.gpus


def cards_for(node: NodeState, task: Task) -> tuple[int, ...]:
    """Whole cards: the lowest free indices."""
    chosen = [i for i, f in enumerate(node.free) if f >= task.milli][: task.gpus]
    return tuple(chosen)


# --- FGD's target workload and fragmentation -------------------------------------------


def typical_tasks(tasks: Sequence[Task], share: float = 0.95) -> list[tuple[Task, float]]:
    """The most common task shapes making up ``share`` of the tasks, with frequencies
    renormalised to 1 (the simulator's experiments: CPU tasks included, 95%, step 1)."""
    counts = Counter(tasks)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].gpus, kv[0].milli, kv[0].cpu))
    total, kept, cum = len(tasks), [], 0
    for task, n in ranked:
        if cum >= share * total:
            break
        kept.append((task, n))
        cum += n
    return [(task, n / cum) for task, n in kept]


class Fragmentation:
    """``F_n(M)`` of a node state, cached by state (many nodes share one)."""

    def __init__(self, workload: Sequence[tuple[Task, float]]) -> None:
        self.workload = list(workload)
        self._cache: dict[tuple[str, int, tuple[int, ...]] | Key, float] = {}

    def of(self, key: tuple[str, int, tuple[int, ...]] | Key) -> float:
        """``F_n(M)`` of a node state (``NodeState.key``; without memory: not counted)."""
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = self._compute(*key)
        return got

    def _compute(
        self, model: str, cpu_free: int, free: tuple[int, ...], mem_free: int = UNCOUNTED
    ) -> float:
        left = sum(free)
        if left == 0:
            return 0.0
        frag = 0.0
        for task, p in self.workload:
            if task.milli == 0 or (task.models and model not in task.models):
                frag += p * left
                continue
            usable = sum(1 for f in free if f >= task.milli)
            if usable >= task.gpus and cpu_free >= task.cpu and mem_free >= task.memory:
                frag += p * sum(f for f in free if f < task.milli)
            else:
                frag += p * left
        return frag


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


class Packer:
    """A policy that places one task at a time on the nodes it is handed, by score."""

    name = "packer"

    def __init__(self, nodes: list[NodeState], seed: int) -> None:
        self.nodes = nodes
        self.rng = random.Random(seed)
        self.by_key: dict[Key, set[int]] = {}
        for i, n in enumerate(nodes):
            self.by_key.setdefault(n.key(), set()).add(i)

    def place(self, task: Task) -> tuple[int, tuple[int, ...]] | None:
        """The node index and cards for ``task``, or None when no node fits."""
        best_score, best_keys = -1, []
        for key, members in self.by_key.items():
            node = self.nodes[next(iter(members))]
            if not fits(node, task):
                continue
            score = self.score(node, task)
            if score > best_score:
                best_score, best_keys = score, [key]
            elif score == best_score:
                best_keys.append(key)
        if best_score < 0:
            return None
        pool = sorted(i for k in best_keys for i in self.by_key[k])
        i = pool[self.rng.randrange(len(pool))]
        return i, self.cards(self.nodes[i], task)

    def moved(self, i: int, before: Key) -> None:
        """Node ``i`` changed from state ``before``."""
        members = self.by_key[before]
        members.discard(i)
        if not members:
            del self.by_key[before]
        self.by_key.setdefault(self.nodes[i].key(), set()).add(i)

    def score(self, node: NodeState, task: Task) -> int:
        raise NotImplementedError

    def cards(self, node: NodeState, task: Task) -> tuple[int, ...]:
        raise NotImplementedError


class BestFit(Packer):
    name = "best-fit"

    def score(self, node: NodeState, task: Task) -> int:
        cpu_left = (node.cpu_free - task.cpu) / MAX_SPEC_CPU
        gpu_left = (sum(node.free) - task.gpu_milli_total) / MAX_SPEC_GPU
        return int((1.0 - 0.5 * cpu_left - 0.5 * gpu_left) * 100)

    def cards(self, node: NodeState, task: Task) -> tuple[int, ...]:
        if task.gpus == 1 and task.milli < MILLI:
            usable = [i for i, f in enumerate(node.free) if f >= task.milli]
            return (min(usable, key=lambda i: node.free[i]),)
        return cards_for(node, task)


class FGD(Packer):
    name = "fgd"

    def __init__(self, nodes: list[NodeState], seed: int, frag: Fragmentation) -> None:
        super().__init__(nodes, seed)
        self.frag = frag
        self._best: dict[tuple[Key, Task], tuple[int, int]] = {}

    def score(self, node: NodeState, task: Task) -> int:
        return self._score_and_card(node, task)[0]

    def cards(self, node: NodeState, task: Task) -> tuple[int, ...]:
        if task.gpus == 1 and task.milli < MILLI:
            value = self._score_and_card(node, task)[1]
            return (node.free.index(value),)
        return cards_for(node, task)

    def _score_and_card(self, node: NodeState, task: Task) -> tuple[int, int]:
        """The score and, for a shared task, the free level of the card it goes on."""
        key = node.key()
        got = self._best.get((key, task))
        if got is not None:
            return got
        before = self.frag.of(key)
        model, cpu, free, mem = key
        cpu, mem = cpu - task.cpu, mem - task.memory
        if task.gpus == 1 and task.milli < MILLI:
            best = (-1, -1)
            for value in sorted(set(free)):  # each distinct card level once
                if value < task.milli:
                    continue
                after = list(free)
                after[after.index(value)] -= task.milli
                f = self.frag.of((model, cpu, tuple(sorted(after)), mem))
                s = int(sigmoid((before - f) / 1000) * 100)
                if s > best[0]:
                    best = (s, value)
        else:
            after = list(free)
            if task.gpus:
                taken = 0
                for j, value in enumerate(after):
                    if value >= task.milli and taken < task.gpus:
                        after[j] -= task.milli
                        taken += 1
            f = self.frag.of((model, cpu, tuple(sorted(after)), mem))
            best = (int(sigmoid((before - f) / 1000) * 100), -1)
        self._best[(key, task)] = best
        return best


def cluster_fragmentation(nodes: Sequence[NodeState], frag: Fragmentation) -> float:
    """FGD's measure over the cluster: the free GPU compute the target workload could not
    use, as a share of all GPU compute."""
    total = sum(len(n.free) for n in nodes) * MILLI
    return sum(frag.of(n.key()) for n in nodes) / total if total else 0.0
