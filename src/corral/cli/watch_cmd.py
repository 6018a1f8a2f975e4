"""``corral watch ID...``: live progress bars, previews written to files, results saved.

Each job is followed on its own event stream (``AsyncClient``, one task per
job, resumed after dropped connections), all drawn as one set of bars.
Files go to ``OUT/<job id>/``: previews as ``previews/<seq>.png`` as they
arrive, the result files when the job succeeds.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from corral.cli.common import (
    EXIT_JOB_FAILED,
    JsonOpt,
    TokenOpt,
    UrlOpt,
    cli_errors,
    connect_async,
    out,
    print_json_line,
)
from corral.cli.render import styled, why
from corral.sdk import AsyncClient, AsyncJob, JobEvent
from corral.sdk.results import save_path


def register(app: typer.Typer) -> None:
    app.command("watch")(watch)


def watch(
    job_ids: Annotated[list[str], typer.Argument(help="Job ids.")],
    out_dir: Annotated[
        Path, typer.Option("--out", help="Results and previews go to OUT/<job id>/.")
    ] = Path("."),
    previews: Annotated[bool, typer.Option(help="Write preview images as they come.")] = True,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print events as JSON lines.")] = False,
) -> None:
    """Follow jobs live until they end; save previews and results. Exit 4 if one failed."""
    raise typer.Exit(watch_ids(job_ids, url, token, out_dir, previews=previews, as_json=as_json))


def watch_ids(
    job_ids: list[str],
    url: str | None,
    token: str | None,
    out_dir: Path,
    *,
    previews: bool = True,
    as_json: JsonOpt = False,
) -> int:
    """Watch ``job_ids``; the exit code: 0 when all succeeded, 4 otherwise."""
    client = connect_async(url, token)
    with cli_errors():
        ok = asyncio.run(_watch_all(client, job_ids, out_dir, previews, as_json))
    return 0 if all(ok) else EXIT_JOB_FAILED


async def _watch_all(
    client: AsyncClient, job_ids: list[str], out_dir: Path, previews: bool, as_json: bool
) -> list[bool]:
    async with client:
        jobs = [await client.job(job_id) for job_id in job_ids]  # unknown ids fail first
        columns = (
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=out(), disable=as_json) as bar:
            watchers = [Watcher(job, bar, out_dir / job.id, previews, as_json) for job in jobs]
            return list(await asyncio.gather(*(w.run() for w in watchers)))


class Watcher:
    """Follows one job: updates its bar, writes previews, saves the result at the end."""

    def __init__(
        self, job: AsyncJob, bar: Progress, folder: Path, previews: bool, as_json: bool
    ) -> None:
        self.job = job
        self.bar = bar
        self.folder = folder
        self.previews = previews
        self.as_json = as_json
        status = job.status
        self.task: TaskID = bar.add_task(
            self._label(status.state.value, why(status.queue)), total=1.0
        )

    def _label(self, state: str, note: str | None = None) -> str:
        text = f"{self.job.id} {styled(state)}"
        return f"{text} [dim]{escape(note)}[/]" if note else text

    def say(self, text: str) -> None:
        if not self.as_json:
            self.bar.console.print(text, highlight=False)

    async def run(self) -> bool:
        async for event in self.job.events():
            await self.on_event(event)
        status = await self.job.refresh()
        if status.state.value != "succeeded":
            self.say(f"{self.job.id} {styled(status.outcome)}: {escape(status.error or '')}")
            return False
        if status.interrupted:
            self.say(f"{self.job.id} {styled(status.outcome)}: its result is what it made so far")
        result = await self.job.result()
        for path in await result.save(self.folder):
            self.say(f"{self.job.id} result → {escape(str(path))}")
        return True

    async def on_event(self, event: JobEvent) -> None:
        if self.as_json:
            print_json_line(event)
        if event.progress is not None:
            self.bar.update(
                self.task,
                completed=event.progress,
                description=self._label("running", event.message),
            )
        elif event.state:
            if event.message:  # a new attempt resumed from a checkpoint
                self.say(f"{self.job.id} {escape(event.message)}")
            done = 1.0 if event.state == "succeeded" else None
            label = self._label("interrupted" if event.interrupted else event.state)
            self.bar.update(self.task, description=label, completed=done)
        for line in event.lines:
            self.say(f"{self.job.id} | {escape(line)}")
        if event.preview_url and self.previews:
            await self.save_preview(event)

    async def save_preview(self, event: JobEvent) -> None:
        url = event.preview_url or ""
        suffix = Path(url).suffix or ".bin"
        path = save_path(self.folder / "previews", f"{event.seq}{suffix}")
        path.write_bytes(await self.job.preview(url))
        self.say(f"{self.job.id} preview → {escape(str(path))}")


def describe(event: JobEvent) -> str:
    """One line per event for ``corral logs --events``."""
    data = event.data
    if event.progress is not None:
        detail = f"{event.progress:.0%}" + (f" {event.message}" if event.message else "")
    elif event.lines:
        detail = " | ".join(event.lines)
    elif event.preview_url:
        detail = event.preview_url
    else:
        parts = ["interrupted" if event.interrupted else ""]
        parts.append(f"on {event.node}" if event.node else "")
        parts.append(f"attempt {data['attempt']}" if data.get("attempt") else "")
        parts.append(f"files: {', '.join(map(str, data['files']))}" if data.get("files") else "")
        parts.append(f"({data['error']})" if data.get("error") else "")
        parts.append(f"· {event.message}" if event.message else "")
        ran = data.get("ran")
        parts.append("ran " + ", ".join(f"{k}={v}" for k, v in sorted(ran.items())) if ran else "")
        detail = " ".join(p for p in parts if p)
    return f"{event.seq:>6} {event.kind:<15} {detail}".rstrip()
