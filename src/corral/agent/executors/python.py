"""The Python handler executor: ``--handler module:function``.

The handler is called with one argument, a ``HandlerContext``, and may be

* a function or ``async`` function that returns the results;
* a generator that yields updates and ``return``s the results;
* an ``async`` generator that yields updates (and ``Result``s).

It yields a ``float`` (progress 0..1) or any of ``Progress``, ``Preview``,
``LogLine``, ``Checkpoint`` and ``Result``. Results are ``bytes``, a ``Path``
(or a ``str`` path) to a file, a ``Result``, or a dict or list of those. It
reads ``ctx.stopping`` to notice a stop: once one is asked for, it has the
stop's grace period to return what it has (an interrupt keeps every result
yielded or returned, a preempt may yield a ``Checkpoint`` first); after that
it is abandoned. Sync handlers run in a worker thread so they never block the
agent's event loop.

Over 400 lines on purpose: a handler comes in several shapes (function, coroutine,
generator, async generator), and each needs its own way to stop and to hand back results.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import inspect
import itertools
import mimetypes
import os
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.agent.executors.base import (
    Checkpoint,
    Finished,
    JobWork,
    LogLine,
    Preview,
    Progress,
    Result,
    StopSignal,
    Update,
    monotone,
    sniff_mime,
    stopped_terminal,
)
from corral.agent.executors.lines import file_result
from corral.agent.executors.workers import Workers
from corral.core import Clock, ExecutorError, InvalidSpec
from corral.core.states import StopReason

Handler = Callable[["HandlerContext"], Any]
FIRST = asyncio.FIRST_COMPLETED


@dataclass
class HandlerContext:
    """What a handler knows about its job, and how it hears of a stop."""

    assignment: JobWork
    _stop: StopSignal
    modified: dict[str, str] = field(default_factory=dict)  # report request changes here
    _dir_made: bool = field(default=False, repr=False)

    @property
    def stopping(self) -> StopReason | None:
        """The reason the handler is asked to stop, or None while it should go on."""
        request = self._stop.requested
        return request.reason if request else None

    @property
    def job_id(self) -> str:
        return self.assignment.job_id

    @property
    def attempt(self) -> int:
        return self.assignment.attempt

    @property
    def payload(self) -> Mapping[str, Any]:
        return self.assignment.payload

    @property
    def model(self) -> str | None:
        return self.assignment.model

    @property
    def model_path(self) -> Path | None:
        """The model's file from the agent's cache (a registered model), else None."""
        return self.assignment.model_path

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return self.assignment.gpu_indices

    @property
    def checkpoint_dir(self) -> Path | None:
        """The job's own directory for checkpoints (made on first use), or None."""
        path = self.assignment.checkpoint_dir
        if path is not None and not self._dir_made:
            path.mkdir(parents=True, exist_ok=True)
            self._dir_made = True
        return path

    @property
    def resume_from(self) -> str | None:
        """The checkpoint to resume from (a local path), None on a first attempt."""
        return self.assignment.resume_from

    @property
    def resume_step(self) -> int:
        """The step ``resume_from`` holds (0 when unknown or on a first attempt)."""
        return self.assignment.resume_step if self.assignment.resume_from else 0

    @property
    def checkpoint_now(self) -> bool:
        """The job is being preempted: yield a ``Checkpoint`` now, then return."""
        return self.stopping is StopReason.PREEMPT


def load_handler(spec: str) -> Handler:
    """Import ``"package.module:function"``; a bad spec names the ``handler`` option."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise InvalidSpec("handler", f"{spec!r}: write it as 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidSpec("handler", f"cannot import {module_name!r}: {exc}") from exc
    handler = getattr(module, attr, None)
    if not callable(handler):
        raise InvalidSpec("handler", f"{module_name!r} has no function {attr!r}")
    return handler  # type: ignore[no-any-return]


class PythonExecutor:
    """Runs a Python handler in this process."""

    def __init__(self, handler: Handler | str, clock: Clock, name: str = "python") -> None:
        self._handler = load_handler(handler) if isinstance(handler, str) else handler
        self._label = getattr(self._handler, "__qualname__", repr(self._handler))
        self._clock = clock
        self._name = name
        self._workers = Workers()
        handler = self._handler
        self._kind = _kind_of(handler)  # once, not per run: inspect is not free
        # A plain function (the common no-frills handler) is one call in a worker thread.
        self._plain = self._kind == "plain"

    @property
    def name(self) -> str:
        return self._name

    async def run(self, assignment: JobWork, stop: StopSignal) -> AsyncIterator[Update]:
        ctx = HandlerContext(assignment, stop)
        results: list[Result] = []
        last_fraction = 0.0
        items = (
            self._call(ctx, stop)
            if self._plain
            else self._obedient(_items(self._handler, self._kind, ctx), stop)
        )
        try:
            async for item in items:
                if isinstance(item, _Returned):
                    results += to_results(item.value, ctx.assignment)
                elif isinstance(item, Result):
                    results.append(item)
                else:
                    update = _as_update(item, self._label)
                    if isinstance(update, Progress):
                        update = monotone(update, last_fraction)
                        last_fraction = update.fraction
                    yield update
        except (ExecutorError, InvalidSpec):
            raise
        except Exception as exc:
            message = f"handler {self._label} raised {type(exc).__name__}: {exc}"
            raise ExecutorError(message, retryable=False) from exc
        request = stop.requested
        if request is not None:
            yield stopped_terminal(request, tuple(results), ctx.modified)
            return
        yield Finished(tuple(results), ctx.modified)

    async def _call(self, ctx: HandlerContext, stop: StopSignal) -> AsyncIterator[object]:
        """A plain function's one call, in a worker thread, as ``_Returned`` (unless abandoned)."""
        call = self._workers.submit(contextvars.copy_context().run, self._handler, ctx)
        if await _Obedience(stop, self._clock).wait(call):
            yield _Returned(call.result())
        else:
            call.add_done_callback(_retrieve)  # its late end is nobody's business

    async def _obedient(
        self, items: AsyncIterator[object], stop: StopSignal
    ) -> AsyncIterator[object]:
        """``items``, until they end or a stop's grace runs out (then abandon them)."""
        obedience = _Obedience(stop, self._clock)
        pending: asyncio.Future[object] | None = None
        try:
            while True:
                pending = asyncio.ensure_future(anext(items))
                if not await obedience.wait(pending):
                    return  # the grace ran out: abandon the handler
                try:
                    item = pending.result()
                except StopAsyncIteration:
                    return
                pending = None
                yield item
                if isinstance(item, _Returned):  # always the last: no task to hear the end
                    return
        finally:
            if pending is not None:
                pending.cancel()
            await _aclose(items)


class _Obedience:
    """Waits for a handler on its stop's terms: as long as no stop is asked for, then
    until the stop's grace (counted from the first request seen, across one run's
    items) runs out."""

    def __init__(self, stop: StopSignal, clock: Clock) -> None:
        self._stop, self._clock = stop, clock
        self._deadline: float | None = None

    async def wait(self, pending: asyncio.Future[Any]) -> bool:
        """Until ``pending`` is done (True) or the grace ran out first (False)."""
        while not pending.done():
            request = self._stop.requested
            if request is None:
                await _either(pending, self._stop.future())
                continue
            if self._deadline is None:
                self._deadline = self._clock.now() + request.grace_s
            timer = asyncio.ensure_future(self._clock.sleep(self._deadline - self._clock.now()))
            try:
                await asyncio.wait({pending, timer}, return_when=FIRST)
            finally:
                timer.cancel()
            return pending.done()
        return True


async def _either(a: asyncio.Future[Any], b: asyncio.Future[Any]) -> None:
    """Until ``a`` or ``b`` is done: ``asyncio.wait(FIRST_COMPLETED)`` for two futures,
    without its sets and checks (it runs once per item a handler yields)."""
    if a.done() or b.done():
        return
    waiter = asyncio.get_running_loop().create_future()

    def wake(_: object) -> None:
        if not waiter.done():
            waiter.set_result(None)

    a.add_done_callback(wake)
    b.add_done_callback(wake)
    try:
        await waiter
    finally:
        a.remove_done_callback(wake)
        b.remove_done_callback(wake)


async def _aclose(items: AsyncIterator[object]) -> None:
    """Close the handler's stream (its ``finally`` blocks run now, not whenever it is
    collected); what closing raises is the abandoned handler's business."""
    aclose = getattr(items, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()


def _kind_of(handler: Handler) -> str:
    if inspect.isasyncgenfunction(handler):
        return "asyncgen"
    if inspect.isgeneratorfunction(handler):
        return "generator"
    if inspect.iscoroutinefunction(handler):
        return "coroutine"
    return "plain"


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


@dataclass(frozen=True, slots=True)
class _Returned:
    value: object


async def _items(handler: Handler, kind: str, ctx: HandlerContext) -> AsyncIterator[object]:
    """A generator or async handler as one async stream of yielded items, then ``_Returned``
    (always last)."""
    if kind == "asyncgen":
        async for item in handler(ctx):
            yield item
        yield _Returned(None)
    elif kind == "generator":
        gen: Iterator[object] = handler(ctx)
        try:
            while True:
                item = await asyncio.to_thread(_next, gen)
                yield item
                if isinstance(item, _Returned):
                    return
        finally:
            _close_quietly(gen)
    else:  # a coroutine function (plain functions go through PythonExecutor._call)
        yield _Returned(await handler(ctx))


def _next(gen: Iterator[object]) -> object:
    """``next(gen)``, with the generator's return value as ``_Returned``.

    StopIteration must not cross into a future (asyncio refuses it), so it is
    turned into a value inside the worker thread.
    """
    try:
        return next(gen)
    except StopIteration as done:
        return _Returned(done.value)


def _close_quietly(gen: Iterator[object]) -> None:
    close = getattr(gen, "close", None)
    if close is None:
        return
    with contextlib.suppress(ValueError):  # still running in its abandoned thread
        close()


def _as_update(item: object, label: str) -> Update:
    if isinstance(item, int | float) and not isinstance(item, bool):
        return Progress(float(item))
    if isinstance(item, Progress | Preview | LogLine | Checkpoint):
        return item
    raise ExecutorError(
        f"handler {label} yielded {type(item).__name__}; yield a float (progress) "
        "or a Progress, Preview, LogLine, Checkpoint or Result",
        retryable=False,
    )


def to_results(value: object, job: JobWork | None = None) -> list[Result]:
    """A handler's return value as results (see the module docstring for the shapes). A file
    path is kept as a file in ``job.scratch_dir`` (the agent's folder for the allocation)
    when there is one, not read: it is uploaded from there a chunk at a time."""
    if isinstance(value, bytes | bytearray):  # the common case: nothing else to set up
        return [_bytes_result(value)]
    files = itertools.count()

    def convert(value: object) -> list[Result]:
        if value is None:
            return []
        if isinstance(value, Result):
            return [value]
        if isinstance(value, bytes | bytearray):
            return [_bytes_result(value)]
        if isinstance(value, str | os.PathLike):
            return [_file_result(Path(value), job, next(files))]
        if isinstance(value, Mapping):
            return [_named(str(name), convert(item)) for name, item in value.items()]
        if isinstance(value, list | tuple):
            return [r for item in value for r in convert(item)]
        raise ExecutorError(
            f"a handler returned {type(value).__name__}; return bytes, a file path, a Result, "
            "or a dict or list of those",
            retryable=False,
        )

    return convert(value)


def _bytes_result(value: bytes | bytearray) -> Result:
    data = bytes(value)
    mime = sniff_mime(data)
    return Result("result" + (mimetypes.guess_extension(mime) or ".bin"), data, mime)


def _named(name: str, results: list[Result]) -> Result:
    [result] = results or [Result(name, b"")]
    return Result(name, result.data, result.mime, result.path)


def _file_result(path: Path, job: JobWork | None, index: int) -> Result:
    keep = None if job is None else job.scratch_dir
    if keep is not None:
        kept = file_result(path, keep, index)
        if kept is None:
            raise ExecutorError(f"result file {path} cannot be read", retryable=False)
        return kept
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ExecutorError(f"result file {path} cannot be read: {exc}", retryable=False) from exc
    mime = mimetypes.guess_type(path.name)[0] or sniff_mime(data)
    return Result(path.name, data, mime)
