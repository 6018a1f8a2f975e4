"""The order in which queued work is considered.

Across priority classes: higher ``rank`` first. Inside a class: fair mixing
across users by weighted round robin (a virtual clock per user that advances
by ``1 / weight`` per job served; least served first). So one user's 10,000
jobs cannot delay another user's single job by more than one round: with
equal weights, every user's next job comes before anyone's second one.

Ties inside a round go to the user with less work already running in the
class (per weight), then to the user whose oldest job is oldest, then by
name: deterministic, and it carries fairness from cycle to cycle.

``LiveQueue`` is that order over the queue's kept groups and lines, as a pass walks them;
``fair.FairQueue`` the same order over a plain list of jobs (a cycle's explanations).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from heapq import heappop, heappush, heapreplace
from typing import TYPE_CHECKING, Final, Generic, TypeVar

from corral.core.model import Job, PriorityClass
from corral.scheduler.lines import Line, Place, lines_of
from corral.scheduler.slots import Running

if TYPE_CHECKING:
    from mypy_extensions import i64

Q = TypeVar("Q", bound=Hashable)


def job_key(job: Job) -> tuple[float, str]:
    """A user's own jobs run oldest first (FIFO), ids breaking ties."""
    return (job.submitted_at, job.id)


def by_rank(classes: Iterable[PriorityClass]) -> list[PriorityClass]:
    """Classes from most to least urgent (higher rank first, then name)."""
    return sorted(classes, key=lambda c: (-c.rank, c.name))


class Gate(Generic[Q]):
    """What a ``LiveQueue`` asks as it walks: may a group still be placed now (``live``),
    may a job be handed out (``usable``: not decided, ready). A class, not two functions:
    a compiled build calls a subclass's methods directly (a pass's ``passes.Liveness``)
    instead of making a generic call per group and job looked at."""

    def live(self, group: Q) -> bool:
        raise NotImplementedError

    def usable(self, job: Job) -> bool:
        raise NotImplementedError


class Checks(Gate[Q]):
    """A gate that asks two functions."""

    def __init__(self, live: Callable[[Q], bool], usable: Callable[[Job], bool]) -> None:
        self._live = live
        self._usable = usable

    def live(self, group: Q) -> bool:
        return self._live(group)

    def usable(self, job: Job) -> bool:
        return self._usable(job)


class LiveQueue(Generic[Q]):
    """Weighted round robin across users, over the jobs of groups that are still live.

    ``groups`` maps each group to its jobs by user (each user's sorted by
    ``job_key``); ``lines`` gives each user's groups in the order of its oldest
    job in each, each place holding the user's list from ``groups`` (one mapping
    user -> ``Line`` per team; made from ``groups`` when not given). Only groups
    ``gate.live`` says may still be placed are looked at; a user's next job is its oldest
    job in such a group
    (``gate.usable`` rejects jobs already decided or not ready). A group found
    dead is skipped whole, never job by job. A user's turn is used only when
    ``done`` says the job was placed: a job that stays queued costs its user
    nothing. Each job is handed out at most once; after a change that may revive
    groups (capacity given back), ``refill``. The lists must not change while the
    queue is in use.

    A user's next job is the sooner of two: the first live group of each of its
    lines whose next job is still its first (a group's oldest job never comes
    before those of the groups after it in the line), and the top of a heap of
    the groups whose cursor moved on (handed out or skipped jobs), keyed by
    their next job. So a pass looks at the front of each user's lines, not at
    every live group; ``Queue`` keeps the lines between cycles. ``weights``,
    ``running`` and ``served`` (users' weights, their running work in the class as the
    scheduler counts it, ``slots.Running``, their recent service in every class:
    ``service.py``) and each map of ``lines`` are dicts, not any mapping: a compiled build
    reads them natively as each user starts (and walks each map of lines natively). A
    user's tie is its running work and its service added, per weight: what
    ``service.with_served`` would give, added up only for the users that start rather than
    for every user and class.
    """

    def __init__(
        self,
        groups: dict[Q, dict[str, list[Job]]],
        weights: dict[str, float],
        running: dict[str, Running],
        gate: Gate[Q],
        lines: Iterable[dict[str, Line[Q]]] | None = None,
        served: dict[str, float] | None = None,
    ) -> None:
        self._weights = weights
        self._running = running
        self._served: dict[str, float] = {} if served is None else served
        self._gate = gate
        users: dict[str, _User[Q]] = {}
        for per_user in (lines_of(groups),) if lines is None else lines:
            for user, line in per_user.items():
                if not line.places:  # kept empty by ``Queue`` for the user's next job
                    continue
                state = users.get(user)
                if state is None:
                    users[user] = _User.on(user, line)
                else:
                    state.lines.append(line)
        self._users = users
        self._made: i64 = 0  # places taken up so far: the next one's seq
        self._heap: list[_User[Q]] = []  # users with a next job, by its key (``_User.before``)
        self._popped: Place | None = None
        self._popped_by: _User[Q] | None = None
        self.refill()

    def __bool__(self) -> bool:
        return bool(self._heap)

    def refill(self) -> None:
        """Find every user's next job again (groups may have come back to life)."""
        heap = []
        for state in self._users.values():
            pos = state.pos
            if len(pos) == len(state.lines):  # the user's own list, from an earlier walk
                for i in range(len(pos)):
                    pos[i] = 0
            else:
                state.pos = [0 for _ in state.lines]  # not ``[0] * n``: a generic call compiled
            state.mine = None  # made when a slot first moves on (few do)
            if self._entry(state):
                heap.append(state)
        _heapify(heap)
        self._heap = heap

    def _start(self, state: _User[Q]) -> None:
        user = state.name
        # ``get`` without a default, here and below: a compiled build boxes a float one
        weights = self._weights
        given = weights.get(user) if len(weights) else None  # most configs weigh no one
        weight = 1.0 if given is None or given <= 0 else given  # a float: never boxed
        state.started = True
        state.vt = 0.0
        state.step = 1.0 / weight
        served = self._served
        count = self._running.get(user)
        running = 0.0 if count is None else count.count
        if served:  # as ``with_served`` adds: only for a user it has
            got = served.get(user)
            if got is not None:
                running = running + got
        state.tie = running / weight

    def pop(self) -> Job | None:
        """The next job: the least served user's oldest live job (None: no live job left)."""
        heap, gate = self._heap, self._gate
        while heap:
            state = _pop(heap)
            slot = state.slot
            if state.queued_vt == state.vt and gate.live(slot.group):
                at, jobs = slot.at, slot.jobs
                job: Job | None = jobs[at] if at < len(jobs) else None
                if job is not None and job.id == state.job_id and gate.usable(job):
                    self._popped, self._popped_by = slot, state
                    return job
            if self._entry(state):  # its group died, or its turn was used: look again
                _push(heap, state)
        return None

    def group(self) -> Q:
        """The group of the job the last ``pop`` handed out (its caller need not look it up)."""
        slot = self._popped
        if slot is None:
            raise RuntimeError("group() without pop()")
        group: Q = slot.group  # a place holds its group as ``Any`` (``lines.Place``)
        return group

    def done(self, job: Job, placed: bool, riders: tuple[Job, ...] = ()) -> None:
        """``job`` (the last ``pop``) was decided; ``placed`` uses its user's turn, and each
        job that joined its allocation (a batch) uses its own user's."""
        slot, state = self._popped, self._popped_by
        if slot is None or state is None:
            raise RuntimeError("done() without pop()")
        self._popped, self._popped_by = None, None
        slot.at += 1
        if placed:
            state.vt += state.step
        for rider in riders:
            other = self._users.get(rider.user)
            if other is not None and other.started:
                other.vt += other.step
        if self._entry(state):
            _push(self._heap, state)

    def _entry(self, state: _User[Q]) -> bool:
        """Note a user's (``state``'s) next live, usable job as its key in the heap (False:
        it has none). The user is not in the heap: it holds each user once at most."""
        best: Place | None = None
        at, job_id = 0.0, ""  # the key of ``best``'s next job (``job_key``)
        for i, line in enumerate(state.lines):
            slot = self._walk(state, line, i)
            if slot is not None:
                job = slot.jobs[slot.at]
                if best is None or _sooner(job, at, job_id):
                    best, at, job_id = slot, job.submitted_at, job.id
        moved = None if state.mine is None else self._moved_on(state.mine)
        if moved is not None:
            job = moved.jobs[moved.at]
            if best is None or _sooner(job, at, job_id):
                best, at, job_id = moved, job.submitted_at, job.id
        if best is None:
            return False
        if not state.started:
            self._start(state)
        state.queued_vt, state.at, state.job_id, state.slot = state.vt, at, job_id, best
        return True

    def _walk(self, state: _User[Q], line: Line[Q], i: int) -> Place | None:
        """The first live slot of ``line``, the ``i``-th of a user's (``state``'s), from
        ``state.pos[i]`` on, whose next job is still its first; slots passed on the way
        leave the line for this refill: dead or spent ones for good, moved-on ones into
        ``state.mine``."""
        places, gate, pos = line.places, self._gate, state.pos
        at_line: i64 = pos[i]
        end_line: i64 = len(places)
        found: Place | None = None
        while at_line < end_line:
            slot = places[at_line]
            if not gate.live(slot.group):
                at_line += 1
                continue
            self._take_up(slot, state)
            at = self._skip_unusable(slot)
            if at >= len(slot.jobs):
                at_line += 1
                continue
            if at > 0:  # moved on: its place in the line no longer says when its turn is
                job = slot.jobs[at]
                mine = state.mine
                if mine is None:
                    mine = state.mine = []
                heappush(mine, (job.submitted_at, job.id, slot.seq, slot))
                at_line += 1
                continue
            found = slot
            break
        pos[i] = at_line
        return found

    def _skip_unusable(self, slot: Place) -> i64:
        """Move ``slot``'s cursor past the jobs ``usable`` rejects; where it now stands."""
        jobs, at, gate = slot.jobs, slot.at, self._gate
        end: i64 = len(jobs)
        while at < end and not gate.usable(jobs[at]):
            at += 1
        slot.at = at
        return at

    def _take_up(self, slot: Place, state: _User[Q]) -> None:
        """The place ``slot`` of a line of the user's (``state``'s), as this queue's: one
        a queue before left (another epoch), or none yet, starts afresh, as if made now. The
        line keeps it while the group stays in it, with the user's jobs there (the queue's
        list, which stays the same list as long)."""
        if slot.epoch != state.epoch:
            slot.at = 0
            slot.seq = self._made
            slot.epoch = state.epoch
            self._made += 1

    def _moved_on(self, own: list[tuple[float, str, int, Place]]) -> Place | None:
        """The slot of the soonest next job among the moved-on ones (``own``).

        A group only dies between refills, so a dead slot leaves for good; a slot whose
        next job moved on again goes back with its new key.
        """
        gate = self._gate
        while own:
            _, job_id, seq, slot = own[0]
            if not gate.live(slot.group):
                heappop(own)
                continue
            at = self._skip_unusable(slot)
            if at >= len(slot.jobs):
                heappop(own)
                continue
            job = slot.jobs[at]
            if job.id != job_id:
                heapreplace(own, (job.submitted_at, job.id, seq, slot))
                continue
            return slot
        return None


class _User(Generic[Q]):
    """One user's (``name``'s) state in a ``LiveQueue``: its lines, how far each was
    walked (``pos``), a heap of its live slots (its lines' places, ``lines.Place``) whose
    cursor moved on, by their next job's key (``mine``), its virtual clock (``vt``, advanced
    by ``step`` per turn used; ``tie`` breaks ties), set when it first has a job to hand out
    (``started``), and the mark of its places (``epoch``; the places are kept by its lines):
    fields a compiled build reads directly, where maps by user cost a lookup each. It is
    its own entry in the queue's heap (each user once at most, no entry made per turn):
    its next job (``slot``'s) comes by (``queued_vt``, its clock when it went in, ``tie``,
    the job's ``at`` and ``job_id``), compared field by field, unboxed, as tuples would be
    (a batch's riders move a waiting user's clock: its entry is then stale, looked at again
    when it comes out). Job ids are unique: no two entries tie."""

    __slots__ = (
        "at",
        "epoch",
        "job_id",
        "lines",
        "mine",
        "name",
        "pos",
        "queued_vt",
        "slot",
        "started",
        "step",
        "tie",
        "vt",
    )

    # Set by ``refill`` before any walk, and by ``_entry`` before the user goes in the heap.
    mine: list[tuple[float, str, int, Place]] | None
    slot: Place

    def __init__(self, name: str, line: Line[Q]) -> None:
        self.name = name
        self.lines = [line]
        self.pos: list[int] = [0]  # by line: ``refill`` zeroes it in place while it fits
        # its slots' mark: new for each queue that takes the state up, and never another
        # state's (a line's places are read by whichever state holds the line: ``_take_up``)
        self.epoch: i64 = _EPOCHS.next()
        self._reset()

    @staticmethod
    def on(name: str, line: Line[Q]) -> _User[Q]:
        """The state of ``name`` starting a queue with ``line``: the one kept on the line
        (``Line.state``) from a queue before, made afresh, or made and kept there. A queue
        is made per pass and per user; its state and its list of lines were made and freed
        each time. A line is in one live queue at most (each pass's
        queues hold disjoint lines, and a pass's queues are dropped before the next one's
        are made), so its kept state is never shared."""
        state: _User[Q] | None = line.state
        if state is None:
            state = _User(name, line)
            line.state = state  # a cycle (state -> lines -> line): ``Queue`` breaks it
            return state
        lines = state.lines
        if len(lines) > 1:  # a queue before joined another line of the user's to it
            del lines[1:]
        state.epoch = _EPOCHS.next()  # its slots are a queue before's: each starts afresh
        state._reset()
        return state

    def _reset(self) -> None:
        self.mine = None
        self.started = False
        self.vt = 0.0
        self.step = 1.0
        self.tie = 0.0
        self.queued_vt = 0.0
        self.at = 0.0
        self.job_id = ""

    def __lt__(self, other: _User[Q]) -> bool:
        return self.before(other)

    def before(self, other: _User[Q]) -> bool:
        """``self < other`` as heap entries (``_push``, ``_pop``)."""
        if self.queued_vt != other.queued_vt:
            return self.queued_vt < other.queued_vt
        if self.tie != other.tie:
            return self.tie < other.tie
        if self.at != other.at:
            return self.at < other.at
        return self.job_id < other.job_id


class _Epochs:
    """Hands out ``_User.epoch`` marks, never the same twice in a process (a record with
    a machine integer: a compiled build updates it natively)."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: i64 = 0

    def next(self) -> i64:
        self.last += 1
        return self.last


_EPOCHS: Final = _Epochs()


# The queue's heap of ``_User``: ``heapq``'s algorithm written out (the same sifts and pops,
# ties included), comparing by ``_User.before``, which a compiled build calls natively where
# ``heapq``'s C calls ``__lt__`` generically (pure Python pays an interpreted loop).


def _push(heap: list[_User[Q]], entry: _User[Q]) -> None:
    heap.append(entry)
    _sift_down(heap, 0, len(heap) - 1)


def _pop(heap: list[_User[Q]]) -> _User[Q]:
    last = heap.pop()
    if not heap:
        return last
    top = heap[0]
    heap[0] = last
    _sift_up(heap, 0)
    return top


def _heapify(heap: list[_User[Q]]) -> None:
    pos: i64 = len(heap) // 2 - 1
    while pos >= 0:
        _sift_up(heap, pos)
        pos -= 1


def _sooner(job: Job, at: float, job_id: str) -> bool:
    """``job_key(job) < (at, job_id)``, field by field: no tuples made and compared."""
    if job.submitted_at != at:
        return job.submitted_at < at
    return job.id < job_id


def _sift_down(heap: list[_User[Q]], start: i64, pos: i64) -> None:
    """``heapq._siftdown``: the entry at ``pos`` moves up towards ``start`` while less than
    its parent. Positions are ``i64``, here and in ``_sift_up``: machine integers in a
    compiled build."""
    item = heap[pos]
    while pos > start:
        parent_pos: i64 = (pos - 1) >> 1
        parent = heap[parent_pos]
        if not item.before(parent):
            break
        heap[pos] = parent
        pos = parent_pos
    heap[pos] = item


def _sift_up(heap: list[_User[Q]], pos: i64) -> None:
    """``heapq._siftup``: the lesser child moves up until a leaf, then the entry that was at
    ``pos`` sifts down from there."""
    end: i64 = len(heap)
    start, item = pos, heap[pos]
    child: i64 = 2 * pos + 1
    while child < end:
        right: i64 = child + 1
        if right < end and not heap[child].before(heap[right]):
            child = right
        heap[pos] = heap[child]
        pos = child
        child = 2 * pos + 1
    heap[pos] = item
    _sift_down(heap, start, pos)
