"""``corral submit``, ``jobs``, ``job``, ``cancel``, ``interrupt`` and ``logs``."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import Progress

from corral.cli import watch_cmd
from corral.cli.common import (
    EXIT_BAD_INPUT,
    JsonOpt,
    TokenOpt,
    UrlOpt,
    cli_errors,
    connect,
    err,
    fail,
    out,
    print_json,
    print_json_line,
    print_table,
)
from corral.cli.jobfile import JobFileError, parse_jobs, with_defaults
from corral.cli.render import JOBS_DROP, job_details, jobs_table, styled
from corral.sdk import BadRequest, Client, Job
from corral.sdk.calls import make_spec, new_key

CHUNK = 500  # jobs per batch request; a progress bar shows when there is more than one


def register(app: typer.Typer) -> None:
    app.command("submit")(submit)
    app.command("jobs")(list_jobs)
    app.command("job")(show_job)
    app.command("cancel")(cancel)
    app.command("interrupt")(interrupt)
    app.command("delete")(delete)
    app.command("logs")(logs)


def submit(  # noqa: PLR0913 (a command's options are its parameters)
    file: Annotated[
        str, typer.Argument(help="A YAML or JSON file with one job or a list of jobs; - for stdin.")
    ],
    team: Annotated[str | None, typer.Option(help="Set the team of every job.")] = None,
    user: Annotated[str | None, typer.Option(help="Set the user of every job.")] = None,
    priority: Annotated[
        str | None, typer.Option(help="Set the priority class of every job (e.g. paid).")
    ] = None,
    memory: Annotated[
        str | None,
        typer.Option(help="Set the host memory every job asks for: 16Gi, 512Mi, 1G or bytes."),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(help="Idempotency key: submitting again with it returns the same jobs."),
    ] = None,
    watch: Annotated[bool, typer.Option(help="Then watch the jobs (see corral watch).")] = False,
    out_dir: Annotated[
        Path, typer.Option("--out", help="With --watch: where results and previews go.")
    ] = Path("."),
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only job ids.")] = False,
    input_files: Annotated[
        list[str] | None,
        typer.Option(
            "--input",
            help="A file the jobs read, PATH or NAME=PATH (repeat): uploaded once and added "
            "to every job's inputs, named as the payload calls it (default: its file name).",
        ),
    ] = None,
    webhook: Annotated[
        str | None,
        typer.Option(
            help="Post each job's end to this URL, signed (docs/server.md, Webhooks); "
            "--webhook-events all: each state change."
        ),
    ] = None,
    webhook_events: Annotated[
        str, typer.Option(help="With --webhook: end (default) or all.")
    ] = "end",
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit jobs from a YAML/JSON file: one job, a list, or {jobs: [...]} (many at once)."""
    source = "stdin" if file == "-" else file
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
        jobs = with_defaults(
            parse_jobs(text, source), team=team, user=user, priority=priority, memory=memory
        )
        if webhook is not None:
            jobs = [{**job, "webhook": {"url": webhook, "events": webhook_events}} for job in jobs]
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read {source}: {exc}", EXIT_BAD_INPUT)
    except JobFileError as exc:
        fail(str(exc), EXIT_BAD_INPUT)
    with connect(url, token) as client, cli_errors():
        refs = [_upload(client, spec) for spec in input_files or ()]
        if refs:
            jobs = [{**job, "inputs": [*job.get("inputs", ()), *refs]} for job in jobs]
        created = _send(client, jobs, key, source)
    if as_json:
        print_json([j.status for j in created])
    elif quiet:
        typer.echo("\n".join(j.id for j in created))
    else:
        print_table(jobs_table([j.status for j in created], time.time()), JOBS_DROP)
        err().print(f"submitted {len(created)} job{'s' * (len(created) != 1)}")
    if watch:
        raise typer.Exit(watch_cmd.watch_ids([j.id for j in created], url, token, out_dir))


def _upload(client: Client, spec: str) -> dict[str, str]:
    """``--input PATH`` or ``NAME=PATH``, uploaded; its entry in a job's ``inputs``."""
    name, sep, path = spec.partition("=")
    file = Path(path if sep else spec)
    name = name if sep else file.name
    try:
        uploaded = client.upload_input(file, name)
    except OSError as exc:
        fail(f"cannot read {file}: {exc}", EXIT_BAD_INPUT)
    return uploaded.ref(name)  # the same bytes uploaded before keep their first name


def _send(client: Client, jobs: list[dict[str, Any]], key: str | None, source: str) -> list[Job]:
    """One job: POST /v1/jobs. Many: the batch endpoint, ``CHUNK`` at a time, with a bar."""
    many = len(jobs) > 1
    try:
        for i, job in enumerate(jobs):  # all checked before any is sent
            make_spec(job, {}, f"jobs[{i}]." if many else "")
    except BadRequest as exc:
        fail(f"{source}: {exc.message}", EXIT_BAD_INPUT)
    if not many:
        return [client.submit(jobs[0], idempotency_key=key)]
    base = key or new_key()
    if len(jobs) <= CHUNK:
        return client.submit_many(jobs, idempotency_key=base)
    created: list[Job] = []
    with Progress(console=err(), transient=True) as bar:
        task = bar.add_task("submitting", total=len(jobs))
        for n, start in enumerate(range(0, len(jobs), CHUNK)):
            part = jobs[start : start + CHUNK]
            try:
                created += client.submit_many(part, idempotency_key=f"{base}.{n}")
            except BadRequest as exc:
                fail(
                    f"{source}: jobs {start}-{start + len(part) - 1}: {exc.message} "
                    f"({len(created)} jobs before them were submitted; run again with "
                    f"--key {base} to submit the rest without repeating them)",
                    EXIT_BAD_INPUT,
                )
            bar.advance(task, len(part))
    return created


def list_jobs(
    state: Annotated[
        list[str] | None,
        typer.Option(
            help="waiting, queued, placed, running, succeeded, failed, cancelled (repeatable)."
        ),
    ] = None,
    team: Annotated[str | None, typer.Option(help="Only this team's jobs.")] = None,
    user: Annotated[str | None, typer.Option(help="Only this user's jobs.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many (newest first).", min=1)] = 50,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List jobs, newest first."""
    with connect(url, token) as client, cli_errors():
        jobs = client.jobs(state=state, team=team, user=user, limit=limit)
    if as_json:
        print_json(jobs)
    elif not jobs:
        err().print("no jobs")
    else:
        print_table(jobs_table(jobs, time.time()), JOBS_DROP)


def show_job(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show one job: state, placement, why it waits, error, result files."""
    with connect(url, token) as client, cli_errors():
        job = client.job(job_id)
    if as_json:
        print_json(job.status)
    else:
        print_table(job_details(job.status, time.time()))


def cancel(
    job_ids: Annotated[list[str], typer.Argument(help="Job ids.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel jobs: they end now; running work is told to stop."""
    _stop(job_ids, "cancel", url, token, as_json)


def interrupt(
    job_ids: Annotated[list[str], typer.Argument(help="Job ids.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Stop running jobs early, keeping what they made so far as the result."""
    _stop(job_ids, "interrupt", url, token, as_json)


def delete(
    job_ids: Annotated[list[str], typer.Argument(help="Job ids.")],
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete finished jobs now, with their events, results and previews (the server deletes
    them by itself 30 days after they ended). Cancel a queued or running job first."""
    deleted = []
    try:
        with connect(url, token) as client, cli_errors():
            for job_id in job_ids:
                client.delete_job(job_id)
                deleted.append(job_id)
                if not as_json:
                    out().print(f"{job_id} deleted")  # as it goes: a later refusal keeps these
    finally:
        if as_json:
            print_json([{"id": job_id, "deleted": True} for job_id in deleted])


def _stop(job_ids: list[str], how: str, url: str | None, token: str | None, as_json: bool) -> None:
    with connect(url, token) as client, cli_errors():
        done = [client.stop_job(job_id, how) for job_id in job_ids]
    if as_json:
        print_json(done)
        return
    for status in done:
        note = " (interrupt requested)" if status.state.value == "running" else ""
        out().print(f"{status.id} {styled(status.outcome)}{note}")


def logs(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")
    ] = False,
    events: Annotated[
        bool, typer.Option("--events", help="Print every event, not only log lines.")
    ] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print a job's log lines (and with --events, its progress and state changes)."""
    with connect(url, token) as client, cli_errors():
        done = client.job(job_id).status.done
        idle = None if follow or done else 1.0  # the backlog arrives at once; then leave
        for event in client.events(job_id, idle_timeout=idle):
            if as_json:
                print_json_line(event)
            elif events:
                typer.echo(watch_cmd.describe(event))
            else:
                for line in event.lines:
                    typer.echo(line)
