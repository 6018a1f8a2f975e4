"""The Celery side of the end-to-end benchmark: a no-op task on a Redis broker and backend.

Workers import this module (``celery -A celery_app worker``). The task returns
its own start and end times so clients can split latency into queueing and
completion; everything runs on one machine, so the clocks agree.
"""

from __future__ import annotations

import os
import time

from celery import Celery

REDIS = os.environ.get("CORRAL_BENCH_REDIS", "redis://127.0.0.1:6379/15")

app = Celery("corral_bench", broker=REDIS, backend=REDIS)
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    worker_prefetch_multiplier=4,
    task_acks_late=False,
    broker_connection_retry_on_startup=True,
    result_expires=600,
)


@app.task(name="noop")
def noop() -> tuple[float, float]:
    started = time.time()
    return started, time.time()
