"""``corral hold``, ``release``, ``top``, ``edit`` (the editable queue), ``deliveries`` and
``corral webhooks secret``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import typer
from rich.table import Table

from corral.cli.common import (
    EXIT_BAD_INPUT,
    JsonOpt,
    TokenOpt,
    UrlOpt,
    cli_errors,
    connect,
    fail,
    out,
    print_json,
)
from corral.sdk import Client, JobStatus, groups

webhooks_app = typer.Typer(name="webhooks", help="Webhook signing.", no_args_is_help=True)
JobIds = Annotated[list[str], typer.Argument(help="Job ids.")]


def register(app: typer.Typer) -> None:
    app.command("hold")(hold)
    app.command("release")(release)
    app.command("top")(top)
    app.command("edit")(edit)
    app.command("deliveries")(deliveries)
    app.add_typer(webhooks_app)


def hold(
    job_ids: JobIds, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Hold queued jobs: they stay queued and are not placed until released."""
    _each(job_ids, lambda c, j: c.edit_job(j, hold=True), url, token, as_json)


def release(
    job_ids: JobIds, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Release held jobs: they may be placed again."""
    _each(job_ids, lambda c, j: c.edit_job(j, hold=False), url, token, as_json)


def top(
    job_ids: JobIds, url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False
) -> None:
    """Move queued jobs to the top of their user's own queue (the last named goes first)."""
    _each(job_ids, lambda c, j: c.edit_job(j, top=True), url, token, as_json)


def edit(  # noqa: PLR0913 (each option of the command is an argument)
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    priority: Annotated[str | None, typer.Option(help="A priority class, e.g. paid.")] = None,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Its time limit in seconds.", min=0.001)
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option("--label", help="KEY=VALUE (repeat): replaces its labels."),
    ] = None,
    clear_labels: Annotated[bool, typer.Option(help="Remove all its labels.")] = False,
    user_weight: Annotated[
        float | None,
        typer.Option(help="Its user's weight (admin): a new policy version.", min=0.001),
    ] = None,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Change a queued job's priority class, time limit or labels, or its user's weight."""
    labels = _labels(label or []) if label or clear_labels else None
    if priority is None and timeout is None and labels is None and user_weight is None:
        fail(
            "name a change: --priority, --timeout, --label, --clear-labels or --user-weight",
            EXIT_BAD_INPUT,
        )

    def change(client: Client, job_id: str) -> JobStatus:
        return client.edit_job(
            job_id, priority=priority, timeout_s=timeout, labels=labels, user_weight=user_weight
        )

    _each([job_id], change, url, token, as_json)


def _labels(pairs: list[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(f"--label {pair!r}: write KEY=VALUE", EXIT_BAD_INPUT)
        labels[key] = value
    return labels


def _each(
    job_ids: list[str],
    change: Callable[[Client, str], JobStatus],
    url: str | None,
    token: str | None,
    as_json: bool,
) -> None:
    done: list[JobStatus] = []
    try:
        with connect(url, token) as client, cli_errors():
            for job_id in job_ids:
                status = change(client, job_id)
                done.append(status)
                if not as_json:  # as it goes: a later refusal keeps these
                    out().print(_line(status))
    finally:
        if as_json:
            print_json(done)


def _line(s: JobStatus) -> str:
    held = " held" if s.held else ""
    labels = " ".join(f"{k}={v}" for k, v in s.labels.items())
    limit = f" limit {s.timeout_s:g}s" if s.timeout_s else ""
    return f"{s.id} {s.state.value}{held} {s.priority}{limit}" + (f" {labels}" if labels else "")


def deliveries(
    subject: Annotated[
        str, typer.Argument(help="A job's id, or a pipeline's (pipe_...) or array's (arr_...).")
    ],
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The webhook calls of a job, or of a pipeline's or array's own webhook: each event,
    its state, attempts and the last answer."""
    with connect(url, token) as client, cli_errors():
        if subject.startswith(("pipe_", "arr_")):
            found = client.run(groups.deliveries(subject))
        else:
            found = client.deliveries(subject)
    if as_json:
        print_json(found)
        return
    table = Table("delivery", "event", "state", "attempts", "last answer")
    for d in found:
        answer = str(d.last_status) if d.last_status is not None else (d.last_error or "")
        table.add_row(d.id, d.kind, d.state, str(d.attempts), answer)
    out().print(table if found else "no deliveries (it names no webhook, or none yet)")


@webhooks_app.command("secret")
def secret(
    team: Annotated[str | None, typer.Option(help="Admin: whose secret.")] = None,
    rotate: Annotated[bool, typer.Option(help="Make a new one (the old one stops).")] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Print the secret that signs your team's webhook calls (receivers check with it)."""
    with connect(url, token) as client, cli_errors():
        typer.echo(client.webhook_secret(team, rotate=rotate))
