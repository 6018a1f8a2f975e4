"""What every client command shares: ``--url``/``--token``/``--json``, the client, errors, output.

Exit codes (docs/cli.md): 0 done; 1 the server refused (401/403/404/409/5xx);
2 bad input (a file, a field: the message names it); 3 no server at the URL;
4 a watched job failed or was cancelled; 130 interrupted with Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from typing import Annotated, Any, NoReturn

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from corral.cli.render import fit
from corral.sdk import (
    AsyncClient,
    BadRequest,
    Client,
    ClientError,
    PermissionDenied,
    Retry,
    ServerUnreachable,
    Unauthorized,
)

EXIT_REFUSED = 1
EXIT_BAD_INPUT = 2
EXIT_UNREACHABLE = 3
EXIT_JOB_FAILED = 4

# Piped output is for reading whole rows later, not for a screen: wide enough that no
# cell is ever folded or cut.
PIPED_WIDTH = 10_000

# A person is waiting: ride out a restart's blip (~0.6 s), then say what is wrong.
CLI_RETRY = Retry(attempts=3, base_s=0.2)

UrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="Server URL. [default: $CORRAL_URL, then ~/.corral/config.toml, "
        "then http://127.0.0.1:8470]",
        show_default=False,
    ),
]
TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token",
        help="API token. [default: $CORRAL_TOKEN, then ~/.corral/config.toml]",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (for scripts).")]

LOGIN_HINT = (
    "pass --token, set CORRAL_TOKEN, or run `corral login URL --token TOKEN` "
    "(the admin token is printed when the server first starts; `corral up` keeps it "
    "in ~/.corral/admin-token, or $CORRAL_HOME/admin-token)"
)


def out() -> Console:
    """Console for results (stdout); made per call so test runners can swap stdout."""
    return Console(highlight=False, soft_wrap=False)


def print_table(table: Table, drop: Sequence[str] = ()) -> None:
    """A table on a terminal: its detail columns (``drop``, first first) left out until it
    fits the width. Piped or redirected: every column, each row on one line, no colour, so
    ``grep`` and ``less`` see whole rows (``--json`` is the form for programs)."""
    console = out()
    if console.is_terminal:
        console.print(fit(table, console, drop))
    else:
        plain = Console(highlight=False, soft_wrap=False, width=PIPED_WIDTH, no_color=True)
        with plain.capture() as captured:
            plain.print(table)
        typer.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))


def err() -> Console:
    return Console(stderr=True, highlight=False)


def connect(url: str | None, token: str | None) -> Client:
    with cli_errors():
        return Client(url, token, retry=CLI_RETRY)


def connect_async(url: str | None, token: str | None) -> AsyncClient:
    with cli_errors():
        return AsyncClient(url, token, retry=CLI_RETRY)


@contextlib.contextmanager
def cli_errors() -> Iterator[None]:
    """Turn SDK errors into one clear message on stderr and the documented exit code."""
    try:
        yield
    except ServerUnreachable as exc:
        fail(str(exc), EXIT_UNREACHABLE)
    except BadRequest as exc:
        lines = [exc.message]
        if len(exc.fields) > 1:
            lines = ["the request was refused:"] + [
                f"  {f.get('field')}: {f.get('message')}" for f in exc.fields
            ]
        fail("\n".join(lines), EXIT_BAD_INPUT)
    except Unauthorized as exc:
        fail(f"{exc.message}\n  hint: {LOGIN_HINT}", EXIT_REFUSED)
    except PermissionDenied as exc:
        fail(exc.message, EXIT_REFUSED)
    except ClientError as exc:
        fail(str(exc), EXIT_REFUSED)
    except KeyboardInterrupt:
        err().print("interrupted")
        raise typer.Exit(130) from None


def fail(message: str, code: int) -> NoReturn:
    """Print ``corral: message`` on stderr and exit with ``code``."""
    err().print(f"[bold red]corral:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


def jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return [jsonable(v) for v in value]
    return value


def print_json(value: Any) -> None:
    typer.echo(json.dumps(jsonable(value), indent=2))


def print_json_line(value: Any) -> None:
    """One compact JSON document per line (for streams: ``--json`` on watch and logs)."""
    typer.echo(json.dumps(jsonable(value), separators=(",", ":")))
