"""``corral pipeline`` and ``corral array``: submit, follow, show, cancel, reprioritise.

A pipeline file is ``{steps: {name: job, ...}}`` (YAML or JSON), each job's
``after``, ``after_any`` and ``inputs: [{from: step, file, as}]`` naming other
steps, and optionally the pipeline's own ``webhook: {url, events}``; an array file
is one job, copied ``--count`` times. ``--webhook URL`` names the group's webhook.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.table import Table

from corral.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_JOB_FAILED,
    JsonOpt,
    TokenOpt,
    UrlOpt,
    cli_errors,
    connect,
    err,
    fail,
    out,
    print_json,
)
from corral.sdk import Group, GroupStatus

pipeline_app = typer.Typer(help="Pipelines: small DAGs of jobs that pass files on.")
array_app = typer.Typer(help="Job arrays: N copies of one job, each with its index.")
IdArg = Annotated[str, typer.Argument(help="The pipeline's (pipe_...) or array's (arr_...) id.")]
FollowOpt = Annotated[bool, typer.Option("--follow", "-f", help="Then follow it to its end.")]
WebhookOpt = Annotated[
    str | None,
    typer.Option(
        help="Post its end (every job ended) to this URL, signed (docs/server.md, Webhooks); "
        "--webhook-events all: each of its jobs' state changes too."
    ),
]
WebhookEventsOpt = Annotated[str, typer.Option(help="With --webhook: end (default) or all.")]
STATE_STYLE = {"succeeded": "green", "failed": "red", "cancelled": "yellow", "running": "cyan"}


def register(app: typer.Typer) -> None:
    app.add_typer(pipeline_app, name="pipeline")
    app.add_typer(array_app, name="array")
    for sub in (pipeline_app, array_app):
        sub.command("show")(show)
        sub.command("cancel")(cancel)
        sub.command("priority")(reprioritise)
    pipeline_app.command("submit")(submit_pipeline)
    array_app.command("submit")(submit_array)


def _read(file: str) -> Any:
    source = "stdin" if file == "-" else file
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
        return yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        fail(f"cannot read {source}: {exc}", EXIT_BAD_INPUT)


def submit_pipeline(
    file: Annotated[str, typer.Argument(help="YAML/JSON: {steps: {name: job}}; - for stdin.")],
    team: Annotated[str | None, typer.Option(help="The pipeline's team.")] = None,
    webhook: WebhookOpt = None,
    webhook_events: WebhookEventsOpt = "end",
    follow: FollowOpt = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit a pipeline: accepted whole, or refused naming the step and field."""
    doc = _read(file)
    if not isinstance(doc, Mapping) or not isinstance(doc.get("steps"), Mapping):
        fail(f"{file}: a pipeline is a mapping with steps: {{name: job, ...}}", EXIT_BAD_INPUT)
    hook = _hook(webhook, webhook_events) or doc.get("webhook")
    with connect(url, token) as client, cli_errors():
        group = client.submit_pipeline(doc["steps"], team=team or doc.get("team"), webhook=hook)
        _report(group, follow, as_json)


def submit_array(  # noqa: PLR0913 (each option of the command is an argument)
    file: Annotated[str, typer.Argument(help="YAML/JSON: one job; - for stdin.")],
    count: Annotated[int, typer.Option(help="How many elements.", min=1)],
    index_key: Annotated[str, typer.Option(help="The payload field of the index.")] = "array_index",
    start: Annotated[int, typer.Option(help="The first element's index.", min=0)] = 0,
    webhook: WebhookOpt = None,
    webhook_events: WebhookEventsOpt = "end",
    follow: FollowOpt = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Submit COUNT copies of a job as one array (e.g. --index-key seed: N seeds)."""
    job = _read(file)
    if not isinstance(job, Mapping):
        fail(f"{file}: an array's job is a mapping of fields", EXIT_BAD_INPUT)
    with connect(url, token) as client, cli_errors():
        group = client.submit_array(
            job,
            count,
            index_key=index_key,
            index_start=start,
            webhook=_hook(webhook, webhook_events),
        )
        _report(group, follow, as_json)


def _hook(webhook: str | None, events: str) -> dict[str, str] | None:
    return None if webhook is None else {"url": webhook, "events": events}


def _report(group: Group, follow: bool, as_json: bool) -> None:
    if not follow:
        if as_json:
            print_json(group.status)
        else:
            out().print(group_table(group.status))
        return
    status = group.status
    for status in group.follow():
        if not as_json:
            err().print(_line(status))
    if as_json:
        print_json(status)
    else:
        out().print(group_table(status))
    raise typer.Exit(0 if status.state == "succeeded" else EXIT_JOB_FAILED)


def show(
    group_id: IdArg,
    follow: FollowOpt = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show a pipeline's steps (the graph) or an array's elements, with their states."""
    with connect(url, token) as client, cli_errors():
        _report(client.group(group_id), follow, as_json)


def cancel(group_id: IdArg, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Cancel every job of it that has not ended."""
    with connect(url, token) as client, cli_errors():
        status = client.group(group_id).cancel()
    out().print(group_table(status))


def reprioritise(
    group_id: IdArg,
    priority: Annotated[str, typer.Argument(help="A priority class (e.g. paid).")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Move its jobs not yet placed to another priority class."""
    with connect(url, token) as client, cli_errors():
        status = client.group(group_id).reprioritise(priority)
    out().print(group_table(status))


def _line(s: GroupStatus) -> str:
    counts = ", ".join(f"{n} {state}" for state, n in sorted(s.counts.items()))
    return f"{s.id} {s.state} {s.progress:.0%} ({counts})"


def group_table(s: GroupStatus) -> Table:
    """A pipeline's steps with what each runs after, or an array's elements."""
    style = STATE_STYLE.get(s.state, "")
    table = Table(title=f"{s.kind} {s.id}: [{style}]{s.state}[/] {s.progress:.0%}")
    if s.steps is not None:
        for name in ("STEP", "AFTER", "STATE", "PROGRESS", "JOB", "ERROR"):
            table.add_column(name)
        for st in s.steps:
            table.add_row(
                st.name,
                ", ".join(st.after) or "-",
                st.state,
                f"{st.progress:.0%}",
                st.job_id,
                st.error or "",
            )
        return table
    for name in ("INDEX", "STATE", "PRIORITY", "PROGRESS", "JOB"):
        table.add_column(name)
    for j in s.jobs:
        index = str((j.array or {}).get("index", ""))
        table.add_row(index, j.state.value, j.priority, f"{j.progress:.0%}", j.id)
    return table
