"""``corral policy show|check|apply|diff|history|rollback`` and ``corral usage``
(docs/cli.md; the policy document is described in docs/server.md)."""

from __future__ import annotations

import csv
import difflib
import io
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from corral.cli.audit_cmd import TIME_HELP, moment
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
)
from corral.sdk import UsageReport

policy_app = typer.Typer(
    name="policy", help="The scheduling policy: classes, who may use them, caps (admin).",
    no_args_is_help=True,
)  # fmt: skip
FileArg = Annotated[Path, typer.Argument(help="A policy document (YAML); '-' reads stdin.")]
MAX_FILE = 256 * 1024  # the server's limit on a policy document
USAGE_FIELDS = ("gpu_seconds", "milli_gpu_seconds", "cpu_seconds", "jobs", "cost")


def register(app: typer.Typer) -> None:
    app.add_typer(policy_app)
    app.command("usage")(usage)


@policy_app.command("show")
def show(url: UrlOpt = None, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """The policy in force: its version, who applied it and when, then its document."""
    with connect(url, token) as client, cli_errors():
        policy = client.policy()
    if as_json:
        print_json(policy)
        return
    err().print(f"version {policy.version}: {_applied(policy.applied_by, policy.applied_at)}")
    typer.echo(policy.document, nl=not policy.document.endswith("\n"))


@policy_app.command("check")
def check(file: FileArg, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """Check a document without applying it: its mistakes by line and field, or 'ok'."""
    document = _read(file)
    with connect(url, token) as client, cli_errors():
        read = client.check_policy(document)
    classes = ", ".join(c["name"] for c in read["policy"]["classes"])
    out().print(f"ok: classes {escape(classes)}")


@policy_app.command("apply")
def apply(
    file: FileArg,
    note: Annotated[str, typer.Option(help="Why: kept in the history.")] = "",
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Apply a document as the next version: in force from the next scheduling cycle."""
    document = _read(file)
    with connect(url, token) as client, cli_errors():
        policy = client.apply_policy(document, note)
    if as_json:
        print_json(policy)
    else:
        out().print(f"applied: version {policy.version}")


@policy_app.command("diff")
def diff(file: FileArg, url: UrlOpt = None, token: TokenOpt = None) -> None:
    """What applying a document would change: a unified diff against the one in force.
    Exits 0 when they are the same, 1 when they differ (as ``diff`` does)."""
    document = _read(file)
    with connect(url, token) as client, cli_errors():
        policy = client.policy()
    lines = list(
        difflib.unified_diff(
            policy.document.splitlines(keepends=True),
            document.splitlines(keepends=True),
            fromfile=f"version {policy.version}",
            tofile=str(file),
        )
    )
    if not lines:
        err().print("no change")
        return
    typer.echo("".join(line if line.endswith("\n") else line + "\n" for line in lines), nl=False)
    raise typer.Exit(1)


@policy_app.command("history")
def history(
    limit: Annotated[int, typer.Option(help="Show at most this many.", min=1, max=1000)] = 20,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The versions applied, newest first, with who applied each and when."""
    with connect(url, token) as client, cli_errors():
        versions = client.policy_history(limit)
    if as_json:
        print_json(versions)
        return
    if not versions:
        err().print("no policy applied: the built-in one is in force (version 0)")
        return
    table = Table(box=None, pad_edge=False)
    for name in ("VERSION", "APPLIED", "BY", "NOTE"):
        table.add_column(name)
    for v in versions:
        when = datetime.fromtimestamp(v.applied_at).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(str(v.version), when, escape(v.applied_by), escape(v.note))
    out().print(table)


@policy_app.command("rollback")
def rollback(
    version: Annotated[int, typer.Argument(help="The version to apply again (0: built-in).")],
    url: UrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Apply an earlier version's document again, as a new version."""
    with connect(url, token) as client, cli_errors():
        policy = client.rollback_policy(version)
    out().print(f"applied version {version} again as version {policy.version}")


def usage(
    by: Annotated[
        str, typer.Option(help="Group by, comma-separated: team, user, class, pool, day, hour.")
    ] = "team",
    since: Annotated[str, typer.Option(help=f"From then on: {TIME_HELP}")] = "30d",
    until: Annotated[str | None, typer.Option(help=f"Up to then: {TIME_HELP}")] = None,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print CSV (for spreadsheets).")] = False,
    url: UrlOpt = None,
    token: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """GPU-hours, CPU-hours, jobs and cost per group (a team token: its own team)."""
    now = time.time()
    groups = [b.strip() for b in by.split(",") if b.strip()]
    start, end = moment(since, now, "--since"), moment(until, now, "--until")
    with connect(url, token) as client, cli_errors():
        report = client.usage(groups, start, end)
    if as_json:
        print_json(report.model_dump(mode="json", by_alias=True))
    elif as_csv:
        typer.echo(usage_csv(report), nl=False)
    else:
        out().print(usage_table(report))
        if report.truncated:
            err().print("more groups than shown: narrow --by or the time range")


def usage_csv(report: UsageReport) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([*report.by, *USAGE_FIELDS])
    for row in report.rows:
        data = row.model_dump(by_alias=True)
        writer.writerow([data[b] for b in report.by] + [data[f] for f in USAGE_FIELDS])
    return buf.getvalue()


def usage_table(report: UsageReport) -> Table:
    table = Table(box=None, pad_edge=False)
    for name in report.by:
        table.add_column(name.upper())
    for name in ("GPU-HOURS", "CPU-HOURS", "JOBS", "COST"):
        table.add_column(name, justify="right")
    for row in [*report.rows, report.total]:
        data: dict[str, Any] = row.model_dump(by_alias=True)
        keys = [escape(str(data[b])) for b in report.by]
        if row is report.total:
            keys = ["total"] + [""] * (len(report.by) - 1) if report.by else []
        table.add_row(
            *keys,
            f"{row.gpu_seconds / 3600:.2f}",
            f"{row.cpu_seconds / 3600:.2f}",
            str(row.jobs),
            f"{row.cost:.2f}",
        )
    return table


def _read(file: Path) -> str:
    try:
        data = sys.stdin.read(MAX_FILE + 1) if str(file) == "-" else file.read_text()
    except (OSError, UnicodeDecodeError) as e:
        fail(f"cannot read {file}: {e}", EXIT_BAD_INPUT)
    if len(data.encode()) > MAX_FILE:
        fail(f"{file}: larger than {MAX_FILE // 1024} KiB", EXIT_BAD_INPUT)
    return data


def _applied(by: str, at: float) -> str:
    if at == 0:
        return "built in"
    return f"applied by {by} at {datetime.fromtimestamp(at).strftime('%Y-%m-%d %H:%M:%S')}"
