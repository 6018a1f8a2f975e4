"""Rate limits per team token: every request, and every job submitted (docs/security/limits.md).

Each limit is a token bucket: it holds ``burst`` tokens and refills at
``rate`` a second; a request takes one, a submission one per job (a batch
of 500 takes 500). A caller that finds too few is refused with
``LimitReached`` (HTTP 429), whose ``retry_after`` is when enough will be
there. The buckets are pyrate-limiter's ``TokenBucket`` (GCRA: one number per
bucket, and the exact wait), kept in memory, so each replica limits what
reaches it.

Only team tokens are limited: agent tokens never reach the client API, and
the admin token is the operator's own (whoever holds it can change every
limit anyway).
"""

from __future__ import annotations

from collections import OrderedDict

from pyrate_limiter import Rate, RateItem, StateBucket, TokenBucket

from corral.core.clock import Clock
from corral.core.errors import InvalidSpec, LimitReached
from corral.server.security_settings import LimitsSettings
from corral.server.services.auth import Principal, TokenKind

MAX_TRACKED = 10_000
"""Buckets kept; past it the least recently used is forgotten (it starts full again). Team
tokens are made by the admin, so this bounds memory, not what a caller may do."""
RATE_WINDOW_MS = 1_000_000
"""A rate per second is given to pyrate-limiter as an integer count per this many ms: a
thousand seconds, so a rate as low as 0.001/s (or as fine as 100.5/s) is exact."""


class RateLimits:
    """The buckets of every team token seen lately, one per limit."""

    def __init__(self, limits: LimitsSettings, clock: Clock) -> None:
        self.limits = limits
        self.clock = clock
        self._buckets: OrderedDict[tuple[str, str], StateBucket] = OrderedDict()

    def request(self, who: Principal) -> None:
        """Charge one request to ``who``'s token; ``LimitReached`` when it has none left."""
        rate = self.limits.requests_per_s
        if who.kind is not TokenKind.TEAM or rate <= 0:
            return
        burst = self.limits.requests_burst
        wait = self._take("requests", who, 1, rate, burst)
        if wait is not None:
            raise LimitReached(
                f"this team token is over its rate of {rate:g} requests per second "
                f"(limits.requests_per_s, bursts of {burst}: limits.requests_burst); "
                f"retry in {wait:.1f} s",
                wait,
            )

    def submit(self, who: Principal, jobs: int) -> None:
        """Charge ``jobs`` submitted jobs to ``who``'s token (a batch counts each of its jobs)."""
        rate = self.limits.submit_jobs_per_s
        if who.kind is not TokenKind.TEAM or rate <= 0:
            return
        burst = self.limits.submit_burst
        if jobs > burst:
            raise InvalidSpec(
                "jobs",
                f"{jobs} jobs at once is more than a team token may submit in one go "
                f"({burst}, limits.submit_burst): send smaller batches",
            )
        wait = self._take("submissions", who, jobs, rate, burst)
        if wait is not None:
            raise LimitReached(
                f"this team token is over its rate of {rate:g} submitted jobs per second "
                f"(limits.submit_jobs_per_s, bursts of {burst}: limits.submit_burst); "
                f"{jobs} more can be submitted in {wait:.1f} s",
                wait,
            )

    def _take(self, limit: str, who: Principal, cost: int, rate: float, burst: int) -> float | None:
        """Take ``cost`` tokens from the bucket; None when taken, else seconds to wait."""
        key = (limit, who.token_id)
        bucket = self._buckets.get(key)
        if bucket is None:
            per_window = max(1, round(rate * RATE_WINDOW_MS / 1000))
            bucket = StateBucket([Rate(per_window, RATE_WINDOW_MS, burst=burst)], TokenBucket())
            self._buckets[key] = bucket
            if len(self._buckets) > MAX_TRACKED:
                self._buckets.popitem(last=False)
        self._buckets.move_to_end(key)
        item = RateItem(limit, int(self.clock.now() * 1000), cost)
        if bucket.put(item) is True:
            return None
        waited = bucket.waiting(item)
        return max(0.001, waited / 1000) if isinstance(waited, int) else 1.0
