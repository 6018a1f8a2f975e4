"""Run times learned from finished work, for ETAs (``eta.py``).

A job's run time is predicted from the run times of finished jobs like it,
at five levels from coarse to fine: all jobs; its kind; kind and backend;
kind, backend and model; and those on the same GPU model. Each level's
median (robust: one job stuck for a day moves it by one sample) is blended
into the coarser levels' prediction with a weight that grows with its
samples (``SHRINK``), so a level seen twice nudges the prediction and a level
seen fifty times decides it. Blending is in log space: run times spread
over orders of magnitude, and a 10 s job and a 1000 s job should average to
100 s, not 505 s.

A job that states its own ``estimated_runtime_s`` is predicted as that
estimate times how actual run times compared with stated estimates on
finished jobs like it (the same levels, the same shrinkage, prior ratio 1):
users who pad their estimates by half are read as such. Without such
history, the estimate itself is the prediction. A ``timeout_s`` caps it.

Pure: time is passed in; nothing here reads a clock. Memory is bounded:
``WINDOW`` latest samples per key, at most ``MAX_KEYS`` keys (the oldest key
is forgotten first).
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict, deque
from typing import Final

from corral.core.model import Job

WINDOW: Final = 200  # latest samples per key: recent behaviour, a bounded sort
MAX_KEYS: Final = 4096  # keys kept in all; a caller naming endless models cannot grow it
SHRINK: Final = 5.0  # samples at which a level weighs as much as everything coarser
PRIOR_S: Final = 600.0  # the prediction before anything finished: ten minutes
MIN_S: Final = 1.0  # a prediction is never below a second (a zero breaks the log blend)
PROGRESS_TRUSTED: Final = 0.05  # reported progress past this extrapolates a running job's end
Key = tuple[str, ...]


class Durations:
    """Run times of finished jobs by kind, backend, model and GPU model; see the module."""

    def __init__(self, window: int = WINDOW, max_keys: int = MAX_KEYS) -> None:
        if window < 1 or max_keys < 5:
            raise ValueError("window must be >= 1 and max_keys >= 5")
        self._window = window
        self._max_keys = max_keys
        self._runs: OrderedDict[Key, _Samples] = OrderedDict()
        self._ratios: OrderedDict[Key, _Samples] = OrderedDict()
        self.recorded = 0

    def record(self, job: Job, gpu_model: str, seconds: float) -> None:
        """``job`` ran for ``seconds`` on a ``gpu_model`` card and succeeded."""
        if not seconds > 0 or math.isinf(seconds):
            return
        self.recorded += 1
        for key in levels(job, gpu_model):
            self._add(self._runs, key, seconds)
        estimate = job.estimated_runtime_s
        if estimate is not None and estimate > 0:
            for key in levels(job, gpu_model):
                self._add(self._ratios, key, seconds / estimate)

    def predict(self, job: Job, gpu_model: str = "") -> tuple[float, str]:
        """``job``'s expected run time in seconds, and what it rests on: ``history``,
        ``estimate`` (the job's own, corrected by history when there is some) or
        ``default`` (nothing finished yet)."""
        keys = levels(job, gpu_model)
        estimate = job.estimated_runtime_s
        if estimate is not None and estimate > 0:
            ratio = _blend(self._ratios, keys, 1.0)
            return _capped(job, estimate * ratio), "estimate"
        if not self._runs:
            return _capped(job, PRIOR_S), "default"
        return _capped(job, _blend(self._runs, keys, PRIOR_S)), "history"

    def total(
        self, job: Job, gpu_model: str, elapsed: float, progress: float = 0.0
    ) -> tuple[float, str]:
        """The expected whole run time of ``job``, running for ``elapsed`` seconds with
        ``progress`` (0..1) reported: the prediction, or an extrapolation of progress,
        and for a job already past its prediction the median of finished jobs like it
        that ran longer than it has (a job that outlived the typical one is likely a
        long one), else half as long again as it has run."""
        if PROGRESS_TRUSTED < progress < 1.0 and elapsed > 0:
            return _capped(job, max(elapsed / progress, elapsed)), "progress"
        predicted, basis = self.predict(job, gpu_model)
        if predicted > elapsed:
            return predicted, basis
        longer = self._longer(job, gpu_model, elapsed)
        return _capped(job, longer if longer is not None else 1.5 * elapsed), basis

    def _longer(self, job: Job, gpu_model: str, elapsed: float) -> float | None:
        """The median run time above ``elapsed`` at the finest level that has one."""
        estimate = job.estimated_runtime_s
        for key in reversed(levels(job, gpu_model)):
            if estimate is not None and estimate > 0:
                ratios = self._ratios.get(key)
                above = None if ratios is None else ratios.median_above(elapsed / estimate)
                if above is not None:
                    return above * estimate
                continue
            runs = self._runs.get(key)
            above = None if runs is None else runs.median_above(elapsed)
            if above is not None:
                return above
        return None

    def _add(self, table: OrderedDict[Key, _Samples], key: Key, value: float) -> None:
        samples = table.get(key)
        if samples is None:
            samples = table[key] = _Samples(self._window)
            if len(table) > self._max_keys:
                table.popitem(last=False)
        else:
            table.move_to_end(key)
        samples.add(value)


def levels(job: Job, gpu_model: str) -> tuple[Key, ...]:
    """The keys ``job`` is counted under, coarse to fine."""
    kind, backend, model = job.kind.value, job.backend or "", job.model or ""
    return (
        (),
        (kind,),
        (kind, backend),
        (kind, backend, model),
        (kind, backend, model, gpu_model),
    )


class _Samples:
    """The latest ``window`` values of one key, with their median kept sorted on demand."""

    __slots__ = ("_sorted", "_values")

    def __init__(self, window: int) -> None:
        self._values: deque[float] = deque(maxlen=window)
        self._sorted: list[float] | None = None

    def __len__(self) -> int:
        return len(self._values)

    def add(self, value: float) -> None:
        self._values.append(value)
        self._sorted = None

    def ordered(self) -> list[float]:
        if self._sorted is None:
            self._sorted = sorted(self._values)
        return self._sorted

    def median(self) -> float:
        return _median(self.ordered())

    def median_above(self, floor: float) -> float | None:
        values = self.ordered()
        at = bisect.bisect_right(values, floor)
        return None if at == len(values) else _median(values[at:])


def _blend(table: OrderedDict[Key, _Samples], keys: tuple[Key, ...], prior: float) -> float:
    """``prior`` moved towards each level's median in turn, coarse to fine, in log space."""
    value = math.log(max(prior, 1e-9))
    for key in keys:
        samples = table.get(key)
        if samples is None or not samples:
            continue
        n = len(samples)
        median = math.log(max(samples.median(), 1e-9))
        value = (n * median + SHRINK * value) / (n + SHRINK)
    return math.exp(value)


def _median(values: list[float]) -> float:
    n = len(values)
    mid = n // 2
    return values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2


def _capped(job: Job, seconds: float) -> float:
    """At least ``MIN_S``, at most the job's timeout (it is stopped there)."""
    if job.timeout_s is not None:
        seconds = min(seconds, job.timeout_s)
    return max(seconds, MIN_S)
