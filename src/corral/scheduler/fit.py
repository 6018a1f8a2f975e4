"""Dynamic fit: does a need fit a node's free capacity now, and which nodes to try.

``fit_on`` picks the cards on one node. ``search`` walks the capacity index in
best-fit order (fewest wholly free cards first; partly used cards first for
shared jobs) over the classes that passed the static filters, and returns
the first few nodes where the need fits. Scorers then choose among those few:
like Kubernetes' "percentage of nodes to score", the search is bounded, so a
cycle costs O(jobs x few buckets), not O(jobs x nodes).

Over 400 lines on purpose: which fits the search puts off or weighs (``strands``,
``stranded``) is the fit's own arithmetic, read beside the walk that uses it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from corral.core.compiled import mypyc_attr
from corral.core.model import Node
from corral.core.resources import MILLI, cpu_milli
from corral.core.topology import closest, of_gpus
from corral.scheduler.bits import Bucket
from corral.scheduler.capacity import Index
from corral.scheduler.need import Need
from corral.scheduler.node_cap import PARTIAL_STEP, Card, NodeCap

if TYPE_CHECKING:
    from mypy_extensions import i64

# ``(i,)`` for the cards of most nodes, made once: most placements take one card, and a
# tuple made per placement lived as long as its allocation (tracked by the cyclic collector,
# whose list was written at each end, long out of the cache); and ``(0, ..., n - 1)``, every
# card of a node of ``n``, for the jobs that take a whole node (each found card by card
# into a list, then copied into a tuple, per node rated)
_ONE: Final[tuple[tuple[int, ...], ...]] = tuple((i,) for i in range(64))
_EVERY: Final[tuple[tuple[int, ...], ...]] = tuple(tuple(range(n)) for n in range(65))


def one(card: int) -> tuple[int, ...]:
    """``(card,)``, shared when ``card`` is below 64."""
    return _ONE[card] if 0 <= card < len(_ONE) else (card,)


def every(count: int) -> tuple[int, ...]:
    """``(0, 1, ..., count - 1)``, shared when ``count`` is 64 or less."""
    return _EVERY[count] if 0 <= count < len(_EVERY) else tuple(range(count))


@mypyc_attr(acyclic=True)  # never in a reference cycle (core/compiled.py)
class Fit:
    """Where exactly a need fits on a node: which cards, how much of each. Treat it as
    immutable."""

    __slots__ = ("cpus", "gpus", "memory", "milli", "node", "vram")

    def __init__(
        self,
        node: NodeCap,
        gpus: tuple[int, ...],
        milli: i64,
        vram: i64,
        cpus: i64,
        memory: i64 = 0,
    ) -> None:
        self.node = node
        self.gpus = gpus
        self.milli = milli  # per card: MILLI for whole cards
        self.vram = vram  # per card
        self.cpus = cpus
        self.memory = memory  # bytes of host memory

    def __repr__(self) -> str:
        amounts = (self.gpus, self.milli, self.vram, self.cpus, self.memory)
        return f"Fit({self.node.name!r}, {', '.join(map(str, amounts))})"

    @property
    def total_milli(self) -> i64:
        return self.milli * len(self.gpus)


def fit_on(nc: NodeCap, need: Need) -> Fit | None:
    """The cards ``need`` would take on ``nc`` now, or ``None`` when it does not fit."""
    if nc.cpus_free < need.cpus or nc.mem_free < need.memory:
        return None
    if need.cpu_only:  # from any NUMA node with room: counted against the node's only
        return Fit(nc, (), 0, 0, need.cpus, need.memory)
    if need.gpus:
        if nc.whole_free < need.gpus:
            return None
        if need.picky:  # a VRAM floor or card models named
            chosen = _picky(nc, need)
        elif need.gpus == len(nc.cards):  # the whole node, every card of it wholly free
            chosen = every(need.gpus)
        elif need.gpus > 1 and linked(nc.node):  # its topology is known: the closest set
            chosen = closest_cards(nc.node, nc.whole_free_cards(0, frozenset()), need.gpus)
        else:
            chosen = _first_free(nc.cards, need.gpus)  # never more than asked
        if nc.numa_free and need.cpus:  # its CPUs come from its cards' NUMA nodes
            chosen = _numa_cards(nc, need, chosen)
        if len(chosen) < need.gpus:
            return None
        return Fit(nc, chosen, MILLI, nc.gpu_vram[chosen[0]], need.cpus, need.memory)
    card = nc.best_shared_gpu(need.vram, need.milli, need.gpu_models)
    if card is None or (nc.numa_free and need.cpus and nc.numa_room(one(card)) < need.cpus):
        return None
    milli = nc.milli_for(card, need.vram, need.milli)
    return Fit(nc, one(card), milli, need.vram, need.cpus, need.memory)


def _picky(nc: NodeCap, need: Need) -> tuple[int, ...]:
    """Wholly free cards of the VRAM and models ``need`` names; () when too few."""
    cards = nc.whole_free_cards(need.vram, need.gpu_models)
    if len(cards) < need.gpus:
        return ()
    if len(cards) > need.gpus > 1 and linked(nc.node):
        return closest_cards(nc.node, cards, need.gpus)
    return tuple(cards) if len(cards) == need.gpus else tuple(cards[: need.gpus])


def _numa_cards(nc: NodeCap, need: Need, chosen: tuple[int, ...]) -> tuple[int, ...]:
    """``chosen`` when their NUMA nodes have ``need``'s CPUs, else other cards that do."""
    if len(chosen) < need.gpus or nc.numa_room(chosen) >= need.cpus:
        return chosen
    return _on_roomy_numa(nc, need)


def _on_roomy_numa(nc: NodeCap, need: Need) -> tuple[int, ...]:
    """Cards for ``need`` whose NUMA nodes have its CPUs free (the first choice's nodes had
    too few): the closest set on nodes that each have them all, else cards of the roomiest
    nodes first (the job spans them); () when no set has the CPUs."""
    numa, free = nc.card_numa, nc.numa_free
    cards = [c for c in nc.whole_free_cards(need.vram, need.gpu_models) if numa[c] >= 0]
    roomy = [c for c in cards if free[numa[c]] >= need.cpus]
    if len(roomy) >= need.gpus:
        if need.gpus > 1 and linked(nc.node):
            chosen = closest_cards(nc.node, roomy, need.gpus)
        else:
            chosen = tuple(roomy[: need.gpus])
    elif len(cards) >= need.gpus:
        cards.sort(key=lambda c: (-free[numa[c]], numa[c], c))
        chosen = tuple(sorted(cards[: need.gpus]))
    else:
        return ()
    return chosen if nc.numa_room(chosen) >= need.cpus else ()


def linked(node: Node) -> bool:
    """Whether ``node`` reported how its GPUs are linked (``core/topology.py``)."""
    return bool(node.gpus) and bool(node.gpus[0].links)


def closest_cards(node: Node, free: list[int], count: int) -> tuple[int, ...]:
    """The ``count`` free cards (card positions are GPU indices) linked most closely."""
    lookups = of_gpus(node.gpus)
    if lookups is None:
        return tuple(sorted(free)[:count])
    return closest(free, count, *lookups)


def _first_free(gpu_cards: list[Card], count: i64) -> tuple[int, ...]:
    """The first ``count`` wholly free cards (fewer when there are not as many): the
    cards ``whole_free_cards`` lists first, without listing them all. One card (most
    jobs) is found without a list made and copied."""
    if count == 1:
        for i, card in enumerate(gpu_cards):
            if card.free == MILLI:
                return one(i)
        return ()
    cards: list[int] = []
    for i, card in enumerate(gpu_cards):
        if card.free == MILLI:
            cards.append(i)
            if len(cards) == count:
                break
    return tuple(cards)


class Source:
    """An index to walk and the node classes allowed in it (``allowed`` None: all of them)."""

    __slots__ = ("allowed", "index")

    def __init__(self, index: Index, allowed: frozenset[int] | None = None) -> None:
        self.index = index
        self.allowed = allowed


def search(need: Need, sources: list[Source], limit: int, seen: set[int] | None) -> list[Fit]:
    """Up to ``limit`` fits in best-fit order over ``sources``, skipping nodes in ``seen``.

    Nodes found are added to ``seen`` so that later tiers do not list them twice.
    ``seen`` None: no node to skip and no later tier (the caller's only one). A search
    for whole cards then keeps no set: the sources of a tier hold disjoint nodes, and an
    index holds a node in one bucket of wholly free cards, so no node comes twice.

    A fit that would strand the node's free cards (``strands``: too few CPUs left beside
    them) is put off: such fits are returned only when the walk finds no other (it stops
    looking after ``DEFERRED`` of them), so a job takes a node whose CPUs it leaves usable
    whenever there is one.

    ``limit`` 1 (the caller takes the first fit): a GPU fit that leaves compute its node's
    CPUs or memory can no longer serve (``stranded``) is weighed against the next ones, up
    to ``WEIGHED``; the first that strands none is taken, else the one stranding least.
    A fit that breaks a wholly free node is weighed against the next such nodes of as
    many cards, and the smallest (fewest CPUs, then least memory) of those stranding
    least is broken: the larger ones are the only nodes the largest jobs fit.
    """
    walk = Walk(limit, limit == 1 and not need.cpu_only)
    if need.cpu_only:
        _search_cpu(need, sources, set() if seen is None else seen, walk)
    else:
        if need.shared:  # a node may be in a partial bucket and in a whole one
            seen = set() if seen is None else seen
            _search_partial(need, sources, seen, walk)
        if not walk.done():
            _search_whole(need, sources, seen, walk)
    return walk.result()


DEFERRED: Final = 16
"""How many stranding fits a search puts off before it takes them: a bounded walk (a
cluster whose every fit strands CPUs costs 16 more fits per search, not a scan)."""

WEIGHED: Final = 8
"""How many fits a first-fit search weighs when each strands some compute (``stranded``):
a bounded walk, as ``DEFERRED`` is."""


@mypyc_attr(acyclic=True)  # never in a reference cycle (core/compiled.py)
class Walk:
    """What a search has found so far, and whether it may stop."""

    __slots__ = ("best", "cost", "deferred", "found", "limit", "weigh")

    def __init__(self, limit: int, weigh: bool) -> None:
        self.found: list[Fit] = []
        self.deferred: list[Fit] = []
        self.limit = WEIGHED if weigh else limit
        self.weigh = weigh
        self.best: Fit | None = None  # weighing: the fit stranding least so far, and how much
        self.cost: i64 = 0

    def keep(self, fit: Fit) -> bool:
        """Note ``fit``; True when the search is done."""
        if strands(fit):
            self.deferred.append(fit)
            return self.done()
        self.found.append(fit)
        if self.weigh:
            cost, best = stranded(fit), self.best
            nc = fit.node
            whole = nc.whole_free == nc.gpu_count  # it breaks a wholly free node
            if (
                best is None
                or cost < self.cost
                or (cost == self.cost and whole and _smaller(nc, best))
            ):
                self.best, self.cost = fit, cost
            if cost <= 0 and not whole:  # strands nothing, breaks nothing: none further is better
                return True
            if best is not None and best.node.gpu_count != nc.gpu_count and self.cost <= 0:
                return True  # past the whole nodes like the best one
        return self.done()

    def done(self) -> bool:
        return len(self.found) >= self.limit or len(self.deferred) >= DEFERRED

    def result(self) -> list[Fit]:
        if self.best is not None:
            return [self.best]
        return self.found if self.found else self.deferred[: 1 if self.weigh else self.limit]


def _smaller(nc: NodeCap, than: Fit) -> bool:
    """Whether wholly free ``nc`` is a smaller node (fewer CPUs, then less memory) than the
    wholly free node of ``than``, with as many cards."""
    other = than.node
    if other.whole_free != other.gpu_count or other.gpu_count != nc.gpu_count:
        return False
    a, b = nc.node, other.node
    return a.cpus < b.cpus or (a.cpus == b.cpus and a.memory_bytes < b.memory_bytes)


def strands(fit: Fit) -> bool:
    """Whether ``fit`` leaves its node with free GPU compute but too few free CPUs (or too
    little memory) to use it: less than one card's share of the node's, or than this job
    takes, whichever is less. Work that eats the CPUs or memory beside free cards wastes
    them as surely as a badly split card does (the Alibaba trace's nodes of 2 cards and 16
    CPUs are left with idle cards that way); a job asking for little never strands any."""
    nc = fit.node
    count = nc.gpu_count
    if (fit.cpus == 0 and fit.memory == 0) or count == 0 or nc.milli_free - fit.total_milli <= 0:
        return False
    if fit.memory and _short(nc.node.memory_bytes // count, fit.memory, nc.mem_free, fit):
        return True
    per_card = cpu_milli(nc.node.cpus) // count  # milli-CPUs, as ``cpus_free`` counts
    return fit.cpus > 0 and _short(per_card, fit.cpus, nc.cpus_free, fit)


def _short(per_card: i64, taken: i64, free: i64, fit: Fit) -> bool:
    """Whether ``free`` less what ``fit`` takes is below one card's share (or what it takes)."""
    return free - taken < (min(per_card, taken) if fit.gpus else per_card)


def stranded(fit: Fit) -> i64:
    """How much more of its node's free GPU compute (milli-GPUs) ``fit`` leaves without the
    CPUs or memory to use it, each free card counted as needing the node's own share of its
    CPUs and memory (negative: ``fit`` uses compute that had too few of them beside it).
    A node is built with the CPUs and memory its cards need; work that eats them faster
    than it takes cards leaves cards nothing can run on, which FGD counts as fragmentation
    as it counts a card split too finely."""
    nc = fit.node
    before = _unserved(nc, nc.milli_free, nc.cpus_free, nc.mem_free)
    after = _unserved(
        nc, nc.milli_free - fit.total_milli, nc.cpus_free - fit.cpus, nc.mem_free - fit.memory
    )
    return after - before


def _unserved(nc: NodeCap, milli: i64, cpus: i64, memory: i64) -> i64:
    """Of ``milli`` free GPU compute on ``nc``, how much ``cpus`` and ``memory`` left beside
    it cannot serve at the node's share of each per card."""
    usable = milli
    scale: i64 = nc.gpu_count * MILLI
    node_cpus = cpu_milli(nc.node.cpus)
    if node_cpus > 0:
        usable = min(usable, max(cpus, 0) * scale // node_cpus)
    node_memory: i64 = nc.node.memory_bytes
    if node_memory > 0:
        usable = min(usable, max(memory, 0) * scale // node_memory)
    return milli - usable


def _search_whole(need: Need, sources: list[Source], seen: set[int] | None, walk: Walk) -> None:
    top = 0
    for source in sources:
        top = max(top, len(source.index.whole))
    cpus, memory = need.cpus, need.memory
    level: i64 = need.gpus if need.gpus > 1 else 1
    while level < top:
        for source in sources:
            bucket, allowed = source.index.whole[level], source.allowed
            if not bucket.size:
                continue
            nodes, i = bucket.nodes, bucket.next_at(0)
            while i >= 0:
                nc = nodes[i]
                i = bucket.next_at(i + 1)
                if nc.cpus_free < cpus or nc.mem_free < memory or (seen and nc.idx in seen):
                    continue
                if allowed is not None and nc.cls not in allowed:
                    continue
                fit = fit_on(nc, need)
                if fit is not None:
                    if seen is not None:
                        seen.add(nc.idx)
                    if walk.keep(fit):
                        return
        level += 1


def _search_partial(need: Need, sources: list[Source], seen: set[int], walk: Walk) -> None:
    start = min(max(need.milli, 1), MILLI - 1) // PARTIAL_STEP
    for level in range(start, MILLI // PARTIAL_STEP):
        for source in sources:
            bucket, allowed = source.index.partial[level], source.allowed
            if not bucket.size:
                continue
            nodes, i = bucket.nodes, bucket.next_at(0)
            while i >= 0:
                nc = nodes[i]
                i = bucket.next_at(i + 1)
                if nc.idx in seen or (allowed is not None and nc.cls not in allowed):
                    continue
                fit = fit_on(nc, need)
                if fit is not None and nc.cards[fit.gpus[0]].free < MILLI:
                    seen.add(nc.idx)
                    if walk.keep(fit):
                        return


def _search_cpu(need: Need, sources: list[Source], seen: set[int], walk: Walk) -> None:
    for source in sources:
        for bucket in source.index.cpu:  # nodes without free cards first
            _search_bucket(need, bucket, source.allowed, seen, walk)
            if walk.done():
                return


def _search_bucket(
    need: Need, bucket: Bucket, allowed: frozenset[int] | None, seen: set[int], walk: Walk
) -> None:
    if not bucket.size:
        return
    nodes, i = bucket.nodes, bucket.next_at(0)
    while i >= 0:
        nc = nodes[i]
        i = bucket.next_at(i + 1)
        if nc.idx in seen or (allowed is not None and nc.cls not in allowed):
            continue
        fit = fit_on(nc, need)
        if fit is not None:
            seen.add(nc.idx)
            if walk.keep(fit):
                return


def slots(nc: NodeCap, need: Need, most: int) -> int:
    """How many replicas of ``need`` fit on ``nc`` at once now (at most ``most``)."""
    count = most if need.cpus == 0 else min(most, nc.cpus_free // need.cpus)
    if need.memory:
        count = min(count, max(nc.mem_free, 0) // need.memory)
    if need.cpu_only or count == 0:
        return count
    if need.gpus:
        if nc.numa_free and need.cpus:  # each replica's CPUs from its cards' NUMA nodes
            return _numa_slots(nc, need, count)
        if not need.vram and not need.gpu_models:  # every wholly free card will do
            return min(count, nc.whole_free // need.gpus)
        return min(count, len(nc.whole_free_cards(need.vram, need.gpu_models)) // need.gpus)
    room = 0
    for card, state in enumerate(nc.cards):
        if not nc.usable(card, 0, need.gpu_models):
            continue
        per_card = state.free // nc.milli_for(card, need.vram, need.milli)
        if need.vram:
            per_card = min(per_card, state.vram_free // need.vram)
        room += max(per_card, 0)
    return min(count, room)


def _numa_slots(nc: NodeCap, need: Need, most: int) -> int:
    """How many replicas of whole-card ``need`` fit on ``nc`` when its CPUs come from the
    cards' NUMA nodes: each placed in turn as ``place_gang`` will place them (``fit_on``),
    on ``nc`` itself, then given back. Exact where a count of free cards and CPUs is not
    (two replicas may each fit a NUMA node's CPUs, but not both); O(replicas) fits, on
    the nodes that reported NUMA nodes only."""
    taken: list[tuple[int, ...]] = []
    while len(taken) < most:
        fit = fit_on(nc, need)
        if fit is None:
            break
        _hold(nc, fit.gpus, -need.cpus)
        taken.append(fit.gpus)
    for gpus in taken:
        _hold(nc, gpus, need.cpus)
    return len(taken)


def _hold(nc: NodeCap, gpus: tuple[int, ...], cpus: i64) -> None:
    """Take (``cpus`` < 0) or give back whole cards and CPUs on ``nc`` alone, its indexes
    untouched: for a count made and undone at once (``_numa_slots``), never a placement."""
    free: i64 = MILLI if cpus > 0 else 0
    for g in gpus:
        nc.cards[g].free = free
    nc.whole_free += len(gpus) if cpus > 0 else -len(gpus)
    nc.cpus_free += cpus
    nc.draw_numa(gpus, cpus)
